"""Warnings for generated tests that are bound to fail: a test domain outside the formula's.

Receives a `Spec` and its derivation as written (the oracle of `opgen.plan.extremes`); returns
located warnings, never errors: the op itself is fine, but its generated tests draw samples
from each Tensor input's test domain (`tests: domain`, default [-3, 3]) and compare with plain
autograd there, so where the formula as written is not a finite real number (`log(x)` at
x < 0) or does not fit in float32 inside that domain, they fail with a bare NaN or inf
mismatch. The warning says where and which `tests:` key to set.

Points: each Tensor input in turn at GRID interior points of its domain, the others mid-domain
(the middle of a domain is where the tests' samples are densest) and every `tests: points` row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mpmath

from opgen.derive.gradients import Derived
from opgen.errors import Loc
from opgen.optimize.save import Residual
from opgen.plan.digits import Digits
from opgen.plan.extremes import (
    DIGITS,
    FLOAT32_MAX,
    MPMATH_ERRORS,
    Oracle,
    Row,
    float32,
    input_arguments,
    mpf,
    places,
)
from opgen.plan.slopes import Slopes, finite_at, quick_model
from opgen.spec.model import DISCRETE_KINDS, Spec

GRID = 9  # interior points per Tensor input: low + (high - low) * (j + 1/2) / GRID


def domain_warnings(
    spec: Spec, written: Derived | None, oracle: Oracle | None = None, optimized: Derived | None = None
) -> list[tuple[Loc, str]]:
    """`(where, message)` for each output the generated tests will find undefined or out of float32
    range inside the test domain, and each that keeps no float32 digit there as written and as
    opgen computes it (`optimized`: Note [float32 digits] in opgen/plan/digits.py); one warning
    of each kind per output and moving input. `oracle`: `written` compiled already."""
    if written is None:
        return []
    compiled = oracle or Oracle(written)
    digits = Digits(compiled, optimized)
    middle = places(spec)["middle"]
    found: list[tuple[Loc, str]] = []
    for k, inp in enumerate(spec.inputs):
        if not inp.is_tensor:
            continue
        low, high = spec.tests.domain_of(inp.name)
        kind = spec.tests.kind_of(inp.name)
        domain = f"[{low:g}, {high:g}]" + ("" if spec.tests.declared(inp.name) else ", the default")
        domain = domain if kind == "interval" else f"{kind}, {domain}"
        grid = [float32(low + (high - low) * (j + 0.5) / GRID) for j in range(GRID)]
        if kind in DISCRETE_KINDS:  # the whole numbers the samples take
            grid = sorted({float(round(point)) for point in grid})
        base = input_arguments(spec, middle)
        for o, (output, function) in enumerate(zip(spec.outputs, compiled.outputs, strict=True)):
            undefined = lost = False
            for point in grid:
                args = [*base[:k], mpf(point), *base[k + 1 :]]
                exact, problem = _exact(function, args)
                where = f"at {inp.name} = {point:.6g}, inside the test domain of `{inp.name}` ({domain})"
                if problem is not None and not undefined:
                    undefined = True
                    found.append(
                        (
                            output.formula.loc,
                            f"`{output.name}` {problem} {where}: its generated tests will fail there; set "
                            f"`tests: domain: {{{inp.name}: [LOW, HIGH]}}` to where the formula is defined",
                        )
                    )
                loss = None if exact is None or lost else digits.lost(o, args, exact)
                if loss is not None:
                    lost = True
                    found.append(
                        (
                            output.formula.loc,
                            f"`{output.name}` {loss} {where}, and opgen knows no exact form of the formula that"
                            " keeps its digits: write it without the cancellation or overflow (an identity,"
                            " log1p, expm1, softplus, ...)",
                        )
                    )
    return found + _point_warnings(spec, compiled.outputs, middle)


def extreme_warnings(
    spec: Spec, rows: tuple[Row, ...], oracle: Oracle, optimized: Derived | None, residuals: Sequence[Residual] = ()
) -> tuple[list[tuple[Loc, str]], tuple[Row, ...]]:
    """A warning for each output that is no finite float32 number (it overflows, or is NaN) at a row of
    the generated float32 test at extreme inputs (`rows`, from `opgen.plan.extremes`), as written and
    as opgen computes it, where its exact value is finite, however well the formula does inside its
    test domain (`log(1 + exp(x) + exp(-x))` at x = 100). The same for each output's part of a
    gradient as backward computes it (`optimized`, after the save stage, reading `residuals`), where
    the row's exact slope is finite (Note [float32 slopes] in opgen/plan/slopes.py). One per output
    and moving input, of each kind.

    Note [rows no form can pass]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    Such a row fails on the op however it is computed from the formula as written, and opgen knows
    no form that passes it: the generated test would fail on a correct op. The warning tells the user,
    and the row leaves the test (its slope alone, where only the gradient is not finite); the rows
    where the op is finite stay, so an op that loses what its formula keeps still fails. Returns the
    warnings and the rows kept."""
    digits = Digits(oracle, optimized)
    slopes = Slopes(oracle, optimized, residuals, digits) if optimized is not None else None
    quick = [quick_model(expr) for expr in oracle.exprs]  # a screen: finite there, finite exactly
    arguments = {place: input_arguments(spec, others) for place, others in places(spec).items()}
    index = {inp.name: k for k, inp in enumerate(spec.inputs)}
    found: list[tuple[Loc, str]] = []
    warned: set[tuple[str, str, bool]] = set()
    kept: list[Row] = []
    for name, point, values, slope, place in rows:
        args = list(arguments[place])
        args[index[name]] = mpf(point)
        dropped = False
        for o, (output, value) in enumerate(zip(spec.outputs, values, strict=True)):
            model = quick[o]
            screened = model is not None and finite_at(model, oracle.order, args)
            loss = None if screened else digits.not_finite(o, args, mpf(value))
            if loss is not None:
                dropped = True
                if (output.name, name, False) not in warned:
                    warned.add((output.name, name, False))
                    found.append((output.formula.loc, _not_finite(f"`{output.name}` {loss}", name, point)))
            problem = None if slope is None or slopes is None else slopes.not_finite(o, name, args)
            if problem is not None:
                if (output.name, name, True) not in warned:
                    warned.add((output.name, name, True))
                    what = f"the gradient of `{output.name}` in `{name}` {problem} (its exact value is {slope:.6g})"
                    found.append((output.formula.loc, _not_finite(what, name, point)))
                slope = None
        if not dropped:
            kept.append((name, point, values, slope, place))
    return found, tuple(kept)


def _not_finite(what: str, name: str, point: float) -> str:
    return (
        f"{what} at {name} = {point:g}, a row of the generated float32 test at extreme inputs, and opgen knows"
        " no exact form of the formula that is finite there: the test leaves such rows out; write the formula"
        f" without the overflow, or declare where `{name}` is meant to be (`tests: domain: {{{name}: [LOW, HIGH]}}`,"
        " or a kind such as `positive` or `binary`)"
    )


def _point_warnings(spec: Spec, outputs: list[Callable[..., Any]], middle: dict[str, float]) -> list[tuple[Loc, str]]:
    """The `tests: points` rows where an output is not a finite float32 number."""
    if not spec.tests.points:
        return []
    found: list[tuple[Loc, str]] = []
    rows = len(spec.tests.points[0][1])
    for j in range(rows):
        at = {**middle, **{name: float32(values[j]) for name, values in spec.tests.points}}
        args = input_arguments(spec, at)
        for output, function in zip(spec.outputs, outputs, strict=True):
            problem = _problem(function, args)
            if problem is not None:
                row = ", ".join(f"{name} = {values[j]:g}" for name, values in spec.tests.points)
                found.append(
                    (
                        output.formula.loc,
                        f"`{output.name}` {problem} at the `tests: points` row {row}: "
                        "its generated tests will fail there; drop the row or move it into the formula's domain",
                    )
                )
    return found


def _problem(function: Callable[..., Any], args: list[Any]) -> str | None:
    """What is wrong with `function(*args)` for a float32 test, or None."""
    return _exact(function, args)[1]


def _exact(function: Callable[..., Any], args: list[Any]) -> tuple[Any, str | None]:
    """`function(*args)` exactly, and what is wrong with it for a float32 test (then the value is None)."""
    try:
        with mpmath.workdps(DIGITS):
            value = function(*args)
    except OverflowError:
        return None, "overflows float32"
    except MPMATH_ERRORS:
        return None, "is not a finite real number"
    if isinstance(value, (mpmath.mpc, complex)) or not mpmath.isfinite(value):
        return None, "is not a finite real number"
    return (None, "overflows float32") if abs(float(value)) > FLOAT32_MAX else (value, None)
