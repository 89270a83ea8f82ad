"""Exact values at extreme inputs, for the generated float32 accuracy tests.

Receives a `Spec` and its derivation as written; returns rows `(input, point, values, slope,
place)`: the spec's formulas *as written* (derived by the pipeline without the stable
rewrites or the native lowering, so nothing opgen does to a formula can hide in the
reference; Note [derived twice] in opgen/pipeline.py), evaluated with mpmath at 50
significant digits (SymPy's own adaptive `evalf` can chase a cancellation for ever), at
the inputs where naive float formulas fail: ±1e4, ±100, ±30, ±1e-6, 0 and the edges of
the input's test domain. One Tensor input moves at a time; the others sit in the middle
of their domains, and (with several Tensor inputs) all at the low and all at the high edge
too, where a loss meets its saturated cases (a target of 0 or 1 with logits of ±100):
`place` names which (`places`). An input whose `tests: domain` is declared is swept only
inside it (`swept`). Points are rounded to float32 first, so a row is exact for
the input the test really passes. A row is kept only where every exact value is a real
number float32 can hold; `slope` (the derivative of the sum of the differentiable outputs)
is None where it is not, or where the gradient is an override.
"""

from __future__ import annotations

import functools
import inspect
import struct
from collections.abc import Callable
from typing import Any

import mpmath
import sympy
from sympy.printing.pycode import MpmathPrinter

from opgen.derive.gradients import Derived
from opgen.formula import functions as fn
from opgen.formula.syntax import is_elementwise, stopped_inputs
from opgen.spec.model import DISCRETE_KINDS, Spec

POINTS = (-1e4, -100.0, -30.0, -1e-6, 0.0, 1e-6, 30.0, 100.0, 1e4)
DIGITS = 50
SLOPE_AGREEMENT = 1e-12  # one-sided slopes closer than this (relative or absolute) agree: no kink
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 2.0**-150  # half the smallest float32 subnormal: below it, float32 rounds to 0

# input, point, exact outputs, exact slope, where the other Tensor inputs sit (a `places` key)
Row = tuple[str, float, tuple[float, ...], float | None, str]


def float32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


def applies(spec: Spec) -> bool:
    """Elementwise specs without optional inputs, whose formulas are rewritten for stability."""
    tensors = spec.tensor_inputs
    return spec.optimize.rewrite and is_elementwise(spec) and not any(i.type.optional for i in tensors)


def places(spec: Spec) -> dict[str, dict[str, float]]:
    """Where the Tensor inputs that do not move sit: mid-domain, and with several Tensor
    inputs also all at the low or all at the high edge of their domains."""
    domains = {i.name: spec.tests.domain_of(i.name) for i in spec.tensor_inputs}
    found = {"middle": {n: float32(spec.tests.middle_of(n)) for n in domains}}
    if len(domains) > 1:
        found["low"] = {n: float32(low) for n, (low, _) in domains.items()}
        found["high"] = {n: float32(high) for n, (_, high) in domains.items()}
    return found


def extreme_rows(spec: Spec, written: Derived | None, oracle: Oracle | None = None) -> list[Row]:
    """The rows of `spec`, from `written`, its derivation as written (None: no rows); `oracle`:
    `written` compiled already (the pipeline compiles it once for the rows and the warnings)."""
    if not applies(spec) or written is None or not spec.tests.extremes:
        return []
    compiled = oracle or Oracle(written)
    arguments = {place: input_arguments(spec, others) for place, others in places(spec).items()}
    rows: list[Row] = []
    for k, inp in enumerate(spec.inputs):
        if not inp.is_tensor:
            continue
        for place, values in arguments.items():
            for point in swept(spec, inp.name):
                row = _row(compiled, inp.name, point, [*values[:k], mpf(point), *values[k + 1 :]])
                if row is not None:
                    rows.append((*row, place))
    return rows


def swept(spec: Spec, name: str) -> list[float]:
    """The points input `name` takes in the rows: POINTS and its domain's edges, inside the domain the
    spec declares (a target declared in [0, 1] is never tested at -1e4), whole numbers alone for a
    discrete kind (Note [domain kinds] in opgen/spec/model.py)."""
    low, high = spec.tests.domain_of(name)
    meant_low, meant_high = spec.tests.meant_range(name)
    points = {float32(p) for p in (*POINTS, low, high) if meant_low <= p <= meant_high}
    if spec.tests.kind_of(name) in DISCRETE_KINDS:
        points = {p for p in points if p == int(p)}
    return sorted(points)


# Note [runaway magnitudes]
# ~~~~~~~~~~~~~~~~~~~~~~~~~
# mpmath numbers have unbounded exponents, so `exp(exp(exp(x)))` or `x ** x ** x` at x = 1e4
# is representable, but the next `exp`, `sin` or power of such a number needs working
# precision in proportion to its exponent: minutes, or all memory. A value that large is far
# beyond float32, so no kept row needs it: the functions whose cost grows with their
# argument's size, and powers with a variable exponent, drop the row (OverflowError) when an
# argument is over 2 ** MAGNITUDE_BITS. Formulas whose points stay in float range print and
# compute exactly as before.
MAGNITUDE_BITS = 10_000


def _bounded(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, refusing arguments too large to compute with (Note [runaway magnitudes])."""

    def call(*args: Any) -> Any:
        for arg in args:
            if isinstance(arg, mpmath.mpf) and mpmath.isfinite(arg) and mpmath.mag(arg) > MAGNITUDE_BITS:
                raise OverflowError("argument too large")
        return function(*args)

    return call


_SIZE_BOUND = ("exp", "expm1", "sin", "cos", "tan", "sinh", "cosh", "tanh", "erf", "erfc", "loggamma", "polygamma")


# Note [real rows]
# ~~~~~~~~~~~~~~~~
# A row's exact value is the formula evaluated over the real numbers, as the op computes it.
# mpmath leaves the reals where a float formula gives NaN (`acos(2)`, `sqrt(-1)`, `(-8) ** 0.5`
# are complex numbers to it), and carries on: `abs(acos(x))` at x = -1e4 is a finite real number
# while the op gives NaN, and `atan2(acos(x), 1)` fails inside mpmath. So a row whose exact value
# is not a finite real is not a row, wherever in the formula that happens: every function refuses
# (`_NotReal`) an argument that is complex or NaN, and the value at the end must be a finite
# real. `where` looks only at the branch it takes: the other may be undefined there (a guard).
class _NotReal(ArithmeticError):
    """A value of the formula left the real numbers (Note [real rows])."""


# What evaluating a formula with mpmath raises where the formula has no real value (or one too large).
MPMATH_ERRORS = (ZeroDivisionError, ValueError, TypeError, OverflowError, _NotReal)


def _real(value: Any) -> Any:
    if isinstance(value, (mpmath.mpc, complex)) or (isinstance(value, mpmath.mpf) and mpmath.isnan(value)):
        raise _NotReal
    return value


def _of_reals(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, refusing a complex or NaN argument (Note [real rows])."""

    def call(*args: Any) -> Any:
        for arg in args:
            _real(arg)
        return function(*args)

    return call


# mpmath versions of the formula language's functions that lambdify does not know.
_OWN: dict[str, Any] = {
    "sigmoid": _bounded(lambda u: 1 / (1 + mpmath.exp(-u))),
    "softplus": _bounded(lambda u: mpmath.log1p(mpmath.exp(u))),
    "log1p": mpmath.log1p,
    "expm1": _bounded(mpmath.expm1),
    "sign": mpmath.sign,
    "floor": mpmath.floor,
    "ceil": mpmath.ceil,
    "round": mpmath.nint,
    "heaviside": lambda u: mpmath.mpf(1 if u >= 0 else 0),
    "maximum": lambda a, b, _: max(a, b),
    "minimum": lambda a, b, _: min(a, b),
    "clamp": lambda u, lo, hi: min(max(u, lo), hi),
    "xlogy": lambda x, y: mpmath.mpf(0) if x == 0 else x * mpmath.log(y),
    "xlog1py": lambda x, y: mpmath.mpf(0) if x == 0 else x * mpmath.log1p(y),
    "_power": _bounded(lambda base, exponent: base**exponent),
    "_f32": lambda value: value if isinstance(value, bool) else mpmath.mpf(float32(float(value))),
    **{name: _bounded(getattr(mpmath, name)) for name in _SIZE_BOUND if name != "expm1"},
}
# Every function a formula can reach, mpmath's own included, over the reals only (Note [real rows]).
_MPMATH: dict[str, Any] = {
    **{name: _of_reals(f) for name, f in vars(mpmath).items() if not name.startswith("_") and inspect.isroutine(f)},
    **{name: _of_reals(f) for name, f in (("abs", abs), ("max", max), ("min", min))},  # Python's, as printed
    **{name: _of_reals(f) for name, f in _OWN.items()},
    "_real": _real,
}


class _Printer(MpmathPrinter):
    """lambdify's mpmath printer, with variable powers through `_power` (Note [runaway magnitudes])."""

    def _print_Pow(self, expr: sympy.Pow, rational: bool = False) -> str:  # noqa: N802
        if expr.exp.is_number:
            return super()._print_Pow(expr, rational=rational)
        return f"_power({self._print(expr.base)}, {self._print(expr.exp)})"

    def _print_where(self, expr: sympy.Function) -> str:
        """A conditional expression: only the branch taken is evaluated (Note [real rows])."""
        condition, taken, other = (self._print(a) for a in expr.args)
        return f"(_real({taken}) if ({condition}) else _real({other}))"


def _printer() -> _Printer:
    """The printer lambdify would choose for these modules, with `_Printer`'s powers."""
    settings = {"fully_qualified_modules": False, "inline": True, "allow_unknown_functions": True}
    return _Printer({**settings, "user_functions": {name: name for name in _MPMATH}})


@functools.cache
def _namespace() -> dict[str, Any]:
    """What `lambdify` makes of the modules `[_MPMATH, "mpmath"]` (mpmath's names, SymPy's names of
    them, ours over both): its functions' globals. Merged once; each compiled formula copies it."""
    return sympy.lambdify((), 0, modules=[_MPMATH, "mpmath"], printer=_printer(), docstring_limit=0).__globals__


# Note [float32 constants]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# A float32 op meets the numbers a spec computes from constants and non-tensor inputs alone
# (`1 - eps`, `0.044715`, `beta`) as float32 numbers: torch rounds a Python number to the
# tensor's dtype. At the clamp bound `1 - eps` with eps = 1e-6 that rounding alone moves
# `log(q / (1 - q))` by 1e-3, which no float32 op avoids. So the exact rows see those numbers
# rounded to float32 too (`_f32`); integers are left alone (exact in float32 up to 2 ** 24).
F32 = sympy.Function("_f32")


def _rounded(expr: sympy.Basic, tensors: set[sympy.Symbol], bools: set[sympy.Symbol]) -> sympy.Basic:
    """`expr` with each largest number-valued subexpression free of `tensors` rounded to float32
    (Note [float32 constants])."""
    number = isinstance(expr, sympy.Expr) and not isinstance(expr, sympy.Integer) and expr not in bools
    if number and not (expr.free_symbols & tensors):
        return F32(expr)
    if not expr.args:
        return expr
    return expr.func(*(_rounded(a, tensors, bools) for a in expr.args))


class Oracle:
    """Each output of `derived` (a spec derived as written), and the sum of the differentiable
    ones, turned into an mpmath function once, however many points read it."""

    def __init__(self, derived: Derived) -> None:
        symbols = derived.symbols
        spec = derived.spec
        self.order = [symbols.inputs[i.name] for i in spec.inputs]
        tensors = {symbols.inputs[i.name] for i in spec.tensor_inputs}
        bools = {symbols.inputs[i.name] for i in spec.inputs if i.type.kind == "bool"}
        rounded = [_rounded(expr, tensors, bools) for _, expr in derived.full.inlined]
        self.exprs = rounded  # each output as the rows compute it, constants rounded to float32
        self.unrounded = [expr for _, expr in derived.full.inlined]  # with the constants as the spec has them
        self.outputs = [self.compile(expr) for expr in rounded]
        self.differentiable_sum = sum(
            (e for e, o in zip(rounded, spec.outputs, strict=True) if o.differentiable), sympy.S.Zero
        )
        stopped = stopped_inputs(spec)  # finite differences see through a stop-gradient: no slope to check
        self.checked = {i.name for i in spec.tensor_inputs if spec.override(i.name) is None and i.name not in stopped}
        self.positions = {i.name: k for k, i in enumerate(spec.inputs)}

    @functools.cached_property
    def ties(self) -> list[Callable[..., Any]]:
        """Each kink of the differentiable outputs as a difference that is 0 at its tie (Note [slopes at ties])."""
        return [self.compile(kink) for kink in sorted(set(_kinks(self.differentiable_sum)), key=sympy.default_sort_key)]

    def at_tie(self, args: list[Any]) -> bool:
        """Whether a `max`, `min` or `clamp` sits on its kink at `args` (Note [slopes at ties])."""
        for tie in self.ties:
            with mpmath.workdps(DIGITS):
                try:
                    value = tie(*args)
                except MPMATH_ERRORS:
                    continue  # inside a branch not taken: no kink the op meets
                if not isinstance(value, mpmath.mpc) and abs(value) <= TIE:
                    return True
        return False

    @functools.cached_property
    def unrounded_outputs(self) -> list[Callable[..., Any]]:
        """Each output with its constants exact (compiled when first read): Note [constants both ways]
        in opgen.plan.digits."""
        return [self.compile(expr) for expr in self.unrounded]

    @functools.cached_property
    def total(self) -> Callable[..., Any]:
        """The sum of the differentiable outputs, whose slopes the rows check (compiled when first read)."""
        return self.compile(self.differentiable_sum)

    def compile(self, expr: sympy.Expr, order: list[sympy.Symbol] | None = None) -> Callable[..., Any]:
        """`expr` as an mpmath function of `order` (the spec's inputs, by default)."""
        order = self.order if order is None else order
        return sympy.lambdify(order, expr, modules=[_namespace()], printer=_printer(), docstring_limit=0)


# Note [slopes at ties]
# ~~~~~~~~~~~~~~~~~~~~~
# A formula can be smooth where one of its kink functions ties: CELU as PyTorch's docs write
# it, `max(0, x) + min(0, alpha * (exp(x / alpha) - 1))`, has the slope 1 on both sides of 0,
# yet each of `max` and `min` gives its tie to the number there (Note [kink conventions] in
# opgen/formula/functions.py), so plain autograd, and opgen with it, gives 0. There the slope
# is the conventions' and not a limit the difference quotients can find (Note [independent
# slopes]): a row checks no slope where `max` or `min` of a tensor and a number, or `clamp`,
# sits on its kink, whatever the one-sided slopes say. The other conventions are the slopes'
# own where the formula is smooth: `abs` at 0 contributes `sign(0) = 0` times a derivative
# that vanishes there unless another kink makes up for it (softsign's `x / (1 + abs(x))` has
# the slope 1), and `max` of two tensors gives each side half, the mean of two equal slopes.
TIE = mpmath.mpf(10) ** -(DIGITS - 10)  # a difference this small is a tie: what is left is rounding


def _kinks(expr: sympy.Basic) -> list[sympy.Expr]:
    """The differences that are 0 where a kink of `expr` takes a conventional slope (Note [slopes at ties])."""
    found: list[sympy.Expr] = []
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, (fn.maximum, fn.minimum)) and node.args[2] != 1:
            found.append(node.args[0] - node.args[1])
        elif isinstance(node, fn.clamp):
            found.extend((node.args[0] - node.args[1], node.args[0] - node.args[2]))
    return [kink for kink in found if not kink.is_number]


def _evaluate(function: Callable[..., Any], args: list[Any]) -> float | None:
    try:
        with mpmath.workdps(DIGITS):
            value = function(*args)
    except MPMATH_ERRORS:
        return None  # a branch or function undefined here, or not real (Note [real rows])
    if isinstance(value, (mpmath.mpc, complex)) or not mpmath.isfinite(value):
        return None
    result = float(value)
    return result if abs(result) <= FLOAT32_MAX else None


def mpf(value: float) -> Any:
    with mpmath.workdps(DIGITS):
        return mpmath.mpf(value)  # the float's exact binary value, which the op receives


def input_arguments(spec: Spec, others: dict[str, float]) -> list[Any]:
    """Every input's value, in order: the Tensor inputs where `others` puts them, the rest at their test values."""
    args: list[Any] = []
    for inp in spec.inputs:
        if inp.is_tensor:
            args.append(mpf(others[inp.name]))
        else:
            given = spec.test_value(inp)
            args.append(given if isinstance(given, bool) else mpf(given))
    return args


def _row(
    compiled: Oracle, name: str, point: float, args: list[Any]
) -> tuple[str, float, tuple[float, ...], float | None] | None:
    outputs = []
    for function in compiled.outputs:
        value = _evaluate(function, args)
        if value is None:
            return None
        outputs.append(value)
    checked = name in compiled.checked and not compiled.at_tie(args)
    slope = _slope(compiled.total, args, compiled.positions[name]) if checked else None
    return (name, point, tuple(outputs), slope)


# Note [independent slopes]
# ~~~~~~~~~~~~~~~~~~~~~~~~~
# The slope a row expects is not opgen's derived gradient (a bug there would be in both the op
# and its expectation) but the difference quotients of the formulas as written, from the left
# and from the right, over two steps of 1e-30 (relative) each side, at 90 digits: each is the
# derivative to about 30 digits. Where they differ the point is a kink, and which one-sided
# slope an op gives there is a convention; at a step they grow as the step shrinks (and may
# agree between the sides, as at `sign(0)`): the row checks no slope.
STEP = mpmath.mpf(10) ** -30


def _slope(total: Callable[..., Any], args: list[Any], k: int) -> float | None:
    """d total / d args[k] at `args`, or None at a kink or where it is not a float32 number."""

    def at(u: Any) -> Any:
        return total(*args[:k], u, *args[k + 1 :])

    try:
        with mpmath.workdps(DIGITS + 40):
            x = args[k]
            h = STEP * max(1, abs(x))
            values = [at(x + j * h) for j in (-2, -1, 0, 1, 2)]
            if any(isinstance(v, mpmath.mpc) or not mpmath.isfinite(v) for v in values):
                return None
            far_left, left, right, far_right = ((values[j + 1] - values[j]) / h for j in range(4))
            agree = (mpmath.almosteq(q, right, SLOPE_AGREEMENT, SLOPE_AGREEMENT) for q in (far_left, left, far_right))
            if not all(agree):
                return None
            value = float((left + right) / 2)
    except MPMATH_ERRORS:
        return None
    if abs(value) < FLOAT32_TINY:
        return 0.0  # no float32 tells it from 0; what is left is the differences' rounding
    return value if abs(value) <= FLOAT32_MAX else None
