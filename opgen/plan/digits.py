"""Float32 digit loss: outputs that keep no correct digit in float32, as written and as opgen computes them.

Receives a spec's oracle (its derivation as written, compiled: `opgen.plan.extremes.Oracle`)
and its optimized derivation (what the op computes); for an output at a point of the test
domain with its exact value, says how the output loses every float32 digit there, or None
where the formula as written keeps a digit or opgen computes it by a form that does
(Note [float32 digits]). `opgen.plan.domain` turns that into a located warning.

Note [float32 digits]
~~~~~~~~~~~~~~~~~~~~~
`cosh(10*x) - sinh(10*x)` is exp(-10 x), but at x = 2 float32 subtracts two numbers near
2.4e8 whose spacing is 16: no digit of 2e-9 survives. Where opgen knows a stable form
(log1p, softplus, the conjugate form of a root difference, a native kernel) the op keeps
the digits and nothing needs saying; where it does not, the user is told at generate time,
with the point, so that they can write one.

Float32 is modelled with mpmath at 24 significant bits: each function call of the formula
(a function of the formula language, or a node the optimizer put there: softplus,
hardswish, logsigmoid, ...) is one correctly rounded operation, computed at the oracle's
50 digits from its 24-bit arguments and rounded to 24 bits; mpmath rounds each +, -, *, /
and constant power to 24 bits itself. mpmath has no exponent range, so each call's value
is held to float32's: past 3.4e38 it overflows to ±inf as IEEE float32 does (`exp(100) / exp(99)`
has no float32 value although the result has; `exp(-exp(100))` and `tanh(exp(100))` do, 0 and 1,
as in float32), below 2**-150 it is 0. A function whose torch kernel is not correctly rounded is
modelled as that kernel computes it (`_KERNELS`: sigmoid is 0 where `exp(-u)` overflows). Products
and powers of values in range are not held so (`exp(50)**2` overflowing goes unnoticed); the calls are where formulas
overflow in practice. A node's exact value is its elementary form at 50 digits, so
`log1p(u)` is `log(1 + u)` there: exact enough for any |u| over 1e-40.

A point is lost when the relative error is over LOST: not one correct significant decimal
digit. Points whose exact value is 0 or below float32's smallest normal number are not
checked (float32 holds no full digits of them), nor points where the exact value is not a
float32 number (`opgen.plan.domain` warns of those). The formula as written is checked
first; the optimized derivation is compiled and checked only at points where that loses
everything, which no stable spec has: its cost is nearly nothing for them.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import types
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import mpmath
import sympy

from opgen.derive.gradients import Derived
from opgen.nodes.base import Node
from opgen.nodes.kernels import Prime
from opgen.plan.extremes import DIGITS, FLOAT32_MAX, FLOAT32_TINY, MPMATH_ERRORS, Oracle

PRECISION = 24  # float32's significand bits
LOST = 0.1  # relative error past which no significant decimal digit is right
FLOAT32_NORMAL = 2.0**-126  # the smallest normal float32: below it float32 holds fewer digits
FLOAT32_DIGITS = 7  # float32 holds 7.2 significant decimal digits


# Whether a function's value in the formula went past float32's range (Note [float32 digits]).
_OVERFLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar("overflowed", default=False)
# The floating-point format modelled: significand bits, largest and half the smallest number. float32,
# but for the check that a NaN or overflow happens in float64 too (`Digits.not_finite`).
Format = tuple[int, float, float]
FLOAT32: Format = (PRECISION, FLOAT32_MAX, FLOAT32_TINY)
FLOAT64: Format = (53, 1.7976931348623157e308, 2.0**-1074)  # (half of 2**-1074 is no float)
_FORMAT: contextvars.ContextVar[Format] = contextvars.ContextVar("format", default=FLOAT32)


def _single(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` as one correctly rounded float32 operation (Note [float32 digits])."""

    def call(*args: Any) -> Any:
        with mpmath.workdps(DIGITS):
            value = function(*args)
        if not isinstance(value, mpmath.mpf) or not mpmath.isfinite(value):
            return value
        precision, largest, tiny = _FORMAT.get()
        with mpmath.workprec(precision):
            value = +value  # rounded to the working precision
        if abs(value) > largest:  # IEEE: ±inf, which later calls may take back (exp(-inf) = 0)
            _OVERFLOWED.set(True)
            return mpmath.inf if value > 0 else -mpmath.inf
        return value if abs(value) >= tiny else mpmath.mpf(0)

    return call


def _sigmoid(u: Any) -> Any:
    """torch.sigmoid's kernel, `1 / (1 + exp(-u))`: 0 where `exp(-u)` overflows the format (float32's
    sigmoid(-89) is 0, though 2.2e-39 is a float32 subnormal), else the exact value."""
    if -u > mpmath.log(_FORMAT.get()[1]):
        return mpmath.mpf(0)
    return 1 / (1 + mpmath.exp(-u))


# Functions whose torch kernel is not the correctly rounded value (Note [float32 digits]).
_KERNELS: dict[str, Callable[..., Any]] = {"sigmoid": _sigmoid}


def in_float32(function: Callable[..., Any], nodes: dict[str, Callable[..., Any]] | None = None) -> Callable[..., Any]:
    """A function compiled by the oracle, its calls made single float32 operations (as torch's kernel
    computes them, for the functions of `_KERNELS`); `nodes`: implementations of functions its
    namespace lacks."""
    namespace = {**function.__globals__, **(nodes or {})}
    namespace |= {
        name: _single(_KERNELS.get(name.removeprefix("_node_"), namespace[name]))  # a node: see _Nodes
        for name in function.__code__.co_names
        if name in namespace and inspect.isroutine(namespace[name])
    }
    return types.FunctionType(function.__code__, namespace, function.__name__, function.__defaults__)


def _form(node: sympy.Basic, args: tuple[sympy.Basic, ...]) -> sympy.Expr | None:
    """The elementary form of `node`'s function at `args`, where it is a node opgen defines; else None."""
    applied = node.func(*args)  # a kernel's derivative: its name, then the kernel's arguments
    try:
        return applied.elementary() if isinstance(applied, Node) else None
    except NotImplementedError:
        return None


def node_form(node: sympy.Basic) -> sympy.Expr | None:
    """The elementary form of `node`, where it is a node opgen defines (a kernel, softplus, ...); else None."""
    return _form(node, node.args) if isinstance(node, sympy.Function) else None


class _Nodes:
    """Each node opgen defines, as a call of an mpmath function of its elementary form."""

    def __init__(self, oracle: Oracle) -> None:
        self.oracle = oracle
        self.functions: dict[str, Callable[..., Any]] = {}

    def __call__(self, expr: sympy.Basic) -> sympy.Basic:
        if not expr.args or isinstance(expr, sympy.Symbol):
            return expr
        args = tuple(self(a) for a in expr.args)
        if not isinstance(expr, sympy.Function):
            return expr.func(*args)
        kept = args[:1] if isinstance(expr, Prime) else ()  # a kernel's derivative: the kernel's name
        dummies = tuple(sympy.Dummy(f"a{k}", real=True) for k in range(len(args) - len(kept)))
        form = _form(expr, (*kept, *dummies))
        if form is None:
            return expr.func(*args)
        name = "_".join(("_node", expr.func.__name__, *map(str, kept)))
        if name not in self.functions:
            self.functions[name] = self.oracle.compile(self(form), list(dummies))
            for function in self.functions.values():  # a node's form may call other nodes, at its own precision
                function.__globals__.update(self.functions)
        return sympy.Function(name)(*args[len(kept) :])


def float32_value(function: Callable[..., Any], args: list[Any]) -> str | None:
    """What keeps `function` (from `Digits.in_float32`) at `args` from being a finite float32 number, or None."""
    value = _in_float32(function, args)
    return value if isinstance(value, str) else None


def _in_float32(function: Callable[..., Any], args: list[Any], form: Format = FLOAT32) -> Any:
    """`function` in float32 (or `form`) at `args`: its value, or what keeps it from being a finite number."""
    token = _OVERFLOWED.set(False)
    format_token = _FORMAT.set(form)
    name = "float32" if form == FLOAT32 else "float64"
    try:
        with mpmath.workprec(form[0]):
            value = function(*args)
    except MPMATH_ERRORS:
        value = mpmath.nan
    finally:
        overflowed = _OVERFLOWED.get()
        _OVERFLOWED.reset(token)
        _FORMAT.reset(format_token)
    if isinstance(value, (mpmath.mpc, complex)) or not mpmath.isfinite(value):
        return f"overflows {name} inside the formula" if overflowed else f"is not a finite number in {name}"
    if abs(value) > form[1]:
        return f"overflows {name}"
    return value


def _relative_error(function: Callable[..., Any], args: list[Any], exact: Any) -> Any:
    """`function` in float32 at `args`, compared with `exact`: its relative error, or a problem."""
    value = _in_float32(function, args)
    if isinstance(value, str):
        return value
    with mpmath.workdps(DIGITS):
        return abs(value - exact) / abs(exact)


class Digits:
    """The outputs of a spec in float32, as written and as opgen computes them."""

    def __init__(self, oracle: Oracle, optimized: Derived | None) -> None:
        self.oracle = oracle
        self.optimized = optimized

    @functools.cached_property
    def written(self) -> list[Callable[..., Any]]:
        """The outputs as written in float32 (made when first read: most rows are screened before)."""
        return [in_float32(f) for f in self.oracle.outputs]

    @functools.cached_property
    def nodes(self) -> _Nodes:
        """The nodes opgen defines, each compiled once when first met."""
        return _Nodes(self.oracle)

    @functools.cached_property
    def computed(self) -> list[Callable[..., Any]] | None:
        """The optimized outputs in float32 (compiled when first read); None: not known."""
        if self.optimized is None:
            return None
        full = self.optimized.full
        inlined = tuple((name, self.nodes(expr)) for name, expr in full.inlined)
        variants = (*self.optimized.variants[:-1], replace(full, inlined=inlined))
        compiled = Oracle(replace(self.optimized, variants=variants))
        return [in_float32(f, self.nodes.functions) for f in compiled.outputs]

    def in_float32(self, expr: sympy.Expr) -> Callable[..., Any]:
        """`expr`, in terms of the spec's inputs, compiled in float32; `_hold(v)`: `v` rounded whole."""
        function = self.oracle.compile(self.nodes(expr))
        return in_float32(function, {**self.nodes.functions, "_hold": lambda value: value})

    def lost(self, k: int, args: list[Any], exact: Any) -> str | None:
        """How output `k` at `args` (exact value `exact`) keeps no float32 digit as written and as
        opgen computes it; None where either keeps one, or `exact` is out of float32's normal range."""
        if exact == 0 or abs(exact) < FLOAT32_NORMAL or abs(exact) > FLOAT32_MAX:
            return None
        written = _relative_error(self.written[k], args, exact)
        if not isinstance(written, str) and written <= LOST:
            return None
        computed = self.computed
        if computed is not None:
            error = _relative_error(computed[k], args, exact)
            if not isinstance(error, str) and error <= LOST:
                return None
        if self._keeps_unrounded(k, args):
            return None
        if isinstance(written, str):
            return f"{written}, where its exact value is {float(exact):.6g},"
        return (
            f"keeps none of float32's {FLOAT32_DIGITS} significant digits (relative error {float(written):.2g},"
            f" exact value {float(exact):.6g}),"
        )

    def _keeps_unrounded(self, k: int, args: list[Any]) -> bool:
        """Note [constants both ways]
        ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
        The exact rows round the spec's constants to float32 (Note [float32 constants] in
        opgen.plan.extremes), and so make a value of their own where the function is exactly 0 or
        near it: `sqrt(x**2 + eps**2) - eps` at x = 0 is 0, and -4.9e-11 with `eps**2` and `eps`
        rounded apart. A stable form that gives 0 there (the conjugate `x**2 / (sqrt(x**2 + eps**2)
        + eps)`) keeps every digit of the function, so a point is lost only where the output is
        also off the value with the constants exact; that value is 0 (nothing to check) or far."""
        with mpmath.workdps(DIGITS):
            try:
                exact = self.oracle.unrounded_outputs[k](*args)
            except MPMATH_ERRORS:
                return False
        if isinstance(exact, mpmath.mpc) or not mpmath.isfinite(exact):
            return False
        if exact == 0 or abs(exact) < FLOAT32_NORMAL:
            return True
        computed = self.computed
        candidates = [self.written[k]] + ([computed[k]] if computed is not None else [])
        for function in candidates:
            error = _relative_error(function, args, exact)
            if not isinstance(error, str) and error <= LOST:
                return True
        return False

    def not_finite(self, k: int, args: list[Any], exact: Any) -> str | None:
        """How output `k` at `args` is no finite float32 number as written and as opgen computes it, where
        its exact value `exact` is one; None where either gives a finite number."""
        if abs(exact) > FLOAT32_MAX:
            return None
        written = _in_float32(self.written[k], args)
        if not isinstance(written, str):
            return None
        computed = self.computed
        if computed is not None and not isinstance(_in_float32(computed[k], args), str):
            return None
        if isinstance(_in_float32(self.written[k], args, FLOAT64), str):  # no fault of float32's
            written = "is not a finite number in float32 nor in float64 as written"
        return f"{written}, where its exact value is {float(exact):.6g},"
