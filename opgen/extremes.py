"""Exact values at extreme inputs, for the generated float32 accuracy tests.

Receives a `Spec`; returns rows `(input, point, values, slope, place)`: the spec's formulas
*as written* (derived again without the stable rewrites or the native lowering, so nothing
opgen does to a formula can hide in the reference), evaluated with mpmath at 50
significant digits (SymPy's own adaptive `evalf` can chase a cancellation for ever), at
the inputs where naive float formulas fail: ±1e4, ±100, ±30, ±1e-6, 0 and the edges of
the input's test domain. One Tensor input moves at a time; the others sit in the middle
of their domains, and (with several Tensor inputs) all at the low and all at the high edge
too, where a loss meets its saturated cases (a target of 0 or 1 with logits of ±100):
`place` names which (`places`). Points are rounded to float32 first, so a row is exact for
the input the test really passes. A row is kept only where every exact value is a real
number float32 can hold; `slope` (the derivative of the sum of the differentiable outputs)
is None where it is not, or where the gradient is an override.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import mpmath
import sympy

from opgen.derive import Derived, derive
from opgen.errors import Problems
from opgen.model import Spec

POINTS = (-1e4, -100.0, -30.0, -1e-6, 0.0, 1e-6, 30.0, 100.0, 1e4)
DIGITS = 50
FLOAT32_MAX = 3.4028234663852886e38

# input, point, exact outputs, exact slope, where the other Tensor inputs sit (a `places` key)
Row = tuple[str, float, tuple[float, ...], float | None, str]


def float32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


def applies(spec: Spec) -> bool:
    """Elementwise specs without optional inputs, whose formulas are rewritten for stability."""
    tensors = spec.tensor_inputs
    return spec.optimize.rewrite and bool(tensors) and all(i.type.dims is None and not i.type.optional for i in tensors)


def places(spec: Spec) -> dict[str, dict[str, float]]:
    """Where the Tensor inputs that do not move sit: mid-domain, and with several Tensor
    inputs also all at the low or all at the high edge of their domains."""
    domains = {i.name: spec.tests.domain_of(i.name) for i in spec.tensor_inputs}
    found = {"middle": {n: float32((low + high) / 2) for n, (low, high) in domains.items()}}
    if len(domains) > 1:
        found["low"] = {n: float32(low) for n, (low, _) in domains.items()}
        found["high"] = {n: float32(high) for n, (_, high) in domains.items()}
    return found


def extreme_rows(spec: Spec) -> list[Row]:
    if not applies(spec):
        return []
    derived = derive(spec, Problems())
    if derived is None:
        return []
    compiled = _Compiled(derived)
    rows: list[Row] = []
    for inp in spec.tensor_inputs:
        low, high = spec.tests.domain_of(inp.name)
        for place, others in places(spec).items():
            for point in sorted({float32(p) for p in (*POINTS, low, high)}):
                row = _row(spec, compiled, inp.name, point, others)
                if row is not None:
                    rows.append((*row, place))
    return rows


# mpmath versions of the formula language's functions that lambdify does not know.
_MPMATH: dict[str, Any] = {
    "sigmoid": lambda u: 1 / (1 + mpmath.exp(-u)),
    "softplus": lambda u: mpmath.log1p(mpmath.exp(u)),
    "log1p": mpmath.log1p,
    "expm1": mpmath.expm1,
    "where": lambda c, a, b: a if c else b,
    "sign": mpmath.sign,
    "floor": mpmath.floor,
    "ceil": mpmath.ceil,
    "round": mpmath.nint,
    "heaviside": lambda u: mpmath.mpf(1 if u >= 0 else 0),
    "maximum": lambda a, b, _: max(a, b),
    "minimum": lambda a, b, _: min(a, b),
    "clamp": lambda u, lo, hi: min(max(u, lo), hi),
}


class _Compiled:
    """Each formula of `derived` turned into an mpmath function once, however many points read it."""

    def __init__(self, derived: Derived) -> None:
        symbols = derived.symbols
        self.order = [symbols.inputs[i.name] for i in derived.spec.inputs]
        self.outputs = [self.compile(expr) for _, expr in derived.full.inlined]
        self.slopes: dict[str, Callable[..., Any] | None] = {}
        for gradient in derived.full.gradients:
            factor = sum((c.factor for c in gradient.contributions), sympy.S.Zero)
            self.slopes[gradient.input] = None if gradient.overridden else self.compile(factor)

    def compile(self, expr: sympy.Expr) -> Callable[..., Any]:
        return sympy.lambdify(self.order, expr, modules=[_MPMATH, "mpmath"])  # type: ignore[no-any-return]


def _evaluate(function: Callable[..., Any], args: list[Any]) -> float | None:
    try:
        with mpmath.workdps(DIGITS):
            value = function(*args)
    except (ZeroDivisionError, ValueError, TypeError, OverflowError):
        return None  # a branch or function undefined here
    if isinstance(value, (mpmath.mpc, complex)) or not mpmath.isfinite(value):
        return None
    result = float(value)
    return result if abs(result) <= FLOAT32_MAX else None


def _row(
    spec: Spec, compiled: _Compiled, name: str, point: float, others: dict[str, float]
) -> tuple[str, float, tuple[float, ...], float | None] | None:
    args: list[Any] = []
    with mpmath.workdps(DIGITS):
        for inp in spec.inputs:
            if inp.is_tensor:
                args.append(mpmath.mpf(repr(point if inp.name == name else others[inp.name])))
            else:
                given = spec.test_value(inp)
                args.append(given if isinstance(given, bool) else mpmath.mpf(repr(given)))
    outputs = []
    for function in compiled.outputs:
        value = _evaluate(function, args)
        if value is None:
            return None
        outputs.append(value)
    slope_function = compiled.slopes[name]
    slope = None if slope_function is None else _evaluate(slope_function, args)
    return (name, point, tuple(outputs), slope)
