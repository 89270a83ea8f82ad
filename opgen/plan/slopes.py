"""Float32 gradients at the extreme rows: where opgen's derived gradient is no finite float32 number.

Receives a spec's oracle (`opgen.plan.extremes.Oracle`), its optimized derivation after the
save stage (what backward computes: the gradients may read outputs and residuals) and its
residuals; for an output, a Tensor input and a row of the float32 test at extreme inputs,
says how the output's part of the input's gradient (its contribution with an incoming
gradient of 1) is not a finite float32 number there, or None. `opgen.plan.domain` warns of
it where the row's exact slope is a finite float32 number (Note [float32 slopes]).

Note [float32 slopes]
~~~~~~~~~~~~~~~~~~~~~
TanhExp `x * tanh(exp(x))` has a finite value and slope at x = 100, but its slope as SymPy
derives it, `tanh(exp(x)) + x exp(x) (1 - tanh(exp(x))**2)`, is inf * 0 = NaN in float32
there; where the optimizer knows no exact form that avoids it, the generated float32 test
at extreme inputs fails with that NaN. So each gradient is evaluated at each row in float32,
with the outputs, lets and residuals it reads computed as forward computes them.

The exact model is Note [float32 digits] (opgen/plan/digits.py): each call one correctly
rounded operation, held to float32's range. Compiling a gradient for it costs milliseconds
(lambdify), as much as a small spec's whole generation, so a quick model goes first: the
gradient walked once into Python closures over floats, each operation's value rounded to
float32 (±inf past its range, 0 below its smallest subnormal), the functions PyTorch computes
stably (sigmoid, softplus, ...) computed so, kernel nodes from their elementary forms. Only
where it finds a value that is not finite is the gradient compiled and checked in the exact
model, and only that one warns: the quick model may be wrong in one direction alone (a
kernel's elementary form overflowing where the kernel does not), and costs a compile there.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

import sympy

from opgen.derive.gradients import Derived
from opgen.formula import functions as fn
from opgen.nodes.kernels import TENSOR_ARG, Prime, prime_formula
from opgen.optimize.save import Residual
from opgen.plan.digits import Digits, float32_value, node_form
from opgen.plan.extremes import F32, FLOAT32_MAX, FLOAT32_TINY, Oracle

Quick = Callable[[dict[sympy.Basic, float]], float]
_HOLD = sympy.Function("_hold")  # a value forward computes on its own, rounded as a whole


def _f32(value: float) -> float:
    """`value` rounded to float32 (±inf past its range, as IEEE float32)."""
    if value != value or abs(value) == math.inf:
        return value
    if abs(value) > FLOAT32_MAX:
        return math.copysign(math.inf, value)
    if abs(value) < FLOAT32_TINY:
        return 0.0
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _ieee(function: Callable[..., float]) -> Callable[..., float]:
    """`function` with IEEE's answers where Python raises: ±inf on overflow, NaN outside the domain."""

    def call(*args: float) -> float:
        try:
            return _f32(function(*args))
        except OverflowError:
            return math.inf
        except (ValueError, ZeroDivisionError, TypeError):
            return math.nan

    return call


def _divide(a: float, b: float) -> float:
    if b == 0:
        return math.nan if a == 0 or a != a else math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _power(base: float, exponent: float) -> float:
    if base == 0 and exponent < 0:
        return math.inf
    value = base**exponent
    return math.nan if isinstance(value, complex) else value


def _sigmoid(u: float) -> float:
    """torch.sigmoid's float32 kernel, `1 / (1 + exp(-u))`: 0 where exp(-u) overflows (u < -88.7)."""
    if -u > _LOG_FLOAT32_MAX:
        return 0.0
    return 1 / (1 + math.exp(-u)) if u >= 0 else math.exp(u) / (1 + math.exp(u))


_LOG_FLOAT32_MAX = math.log(FLOAT32_MAX)


def _softplus(u: float) -> float:
    return max(u, 0.0) + math.log1p(math.exp(-abs(u)))


_CALLS: dict[type, Callable[..., float]] = {
    sympy.exp: math.exp,
    sympy.log: math.log,
    sympy.sin: math.sin,
    sympy.cos: math.cos,
    sympy.tan: math.tan,
    sympy.tanh: math.tanh,
    sympy.sinh: math.sinh,
    sympy.cosh: math.cosh,
    sympy.atan: math.atan,
    sympy.asin: math.asin,
    sympy.acos: math.acos,
    sympy.asinh: math.asinh,
    sympy.acosh: math.acosh,
    sympy.atanh: math.atanh,
    sympy.erf: math.erf,
    sympy.erfc: math.erfc,
    sympy.Abs: abs,
    sympy.sign: lambda u: float((u > 0) - (u < 0)),
    fn.sign: lambda u: float((u > 0) - (u < 0)),
    fn.sigmoid: _sigmoid,
    fn.softplus: _softplus,
    fn.log1p: math.log1p,
    fn.expm1: math.expm1,
    fn.floor: math.floor,
    fn.ceil: math.ceil,
    fn.heaviside: lambda u: float(u >= 0),
    fn.maximum: lambda a, b, _: max(a, b),
    fn.minimum: lambda a, b, _: min(a, b),
    fn.clamp: lambda u, low, high: min(max(u, low), high),
    fn.xlogy: lambda a, b: 0.0 if a == 0 else a * math.log(b),
    fn.xlog1py: lambda a, b: 0.0 if a == 0 else a * math.log1p(b),
    sympy.Max: max,
    sympy.Min: min,
    sympy.And: lambda *truths: float(all(truths)),
    sympy.Or: lambda *truths: float(any(truths)),
    sympy.Not: lambda truth: float(not truth),
    F32: lambda value: value,  # a constant the rows round to float32: `_ieee` rounds every call
}
_RELATIONS: dict[type, Callable[[float, float], bool]] = {
    sympy.StrictLessThan: lambda a, b: a < b,
    sympy.LessThan: lambda a, b: a <= b,
    sympy.StrictGreaterThan: lambda a, b: a > b,
    sympy.GreaterThan: lambda a, b: a >= b,
    sympy.Eq: lambda a, b: a == b,
    sympy.Ne: lambda a, b: a != b,
}


class _Unknown(Exception):
    """A node the quick model does not know: the exact model decides."""


def _quick(expr: sympy.Basic) -> Quick:
    """`expr` as a function of an environment of symbol values, in the quick float32 model."""
    if isinstance(expr, sympy.Symbol):
        return lambda env: env[expr]
    if expr.is_Number or expr.is_NumberSymbol:
        value = _f32(float(expr))
        return lambda env: value
    if expr in (sympy.true, sympy.false):
        truth = float(bool(expr))
        return lambda env: truth
    if isinstance(expr, Prime):  # its formula in `TENSOR_ARG`, shared with the stages that print it
        return _kernel(expr)
    args = [_quick(a) for a in expr.args]
    if isinstance(expr, _HOLD):
        return args[0]
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        join = (lambda a, b: a + b) if isinstance(expr, sympy.Add) else (lambda a, b: a * b)
        return lambda env: functools.reduce(lambda a, f: _f32(join(a, f(env))), args[1:], args[0](env))
    if isinstance(expr, sympy.Pow):
        base, exponent = args
        if expr.exp == -1:
            return lambda env: _f32(_divide(1.0, base(env)))
        return lambda env: _ieee(_power)(base(env), exponent(env))
    if isinstance(expr, fn.where):
        test, taken, other = args
        return lambda env: taken(env) if test(env) else other(env)
    if type(expr) in _RELATIONS:
        relation, (a, b) = _RELATIONS[type(expr)], args
        return lambda env: float(relation(a(env), b(env)))
    if type(expr) in _CALLS:
        call = _ieee(_CALLS[type(expr)])
        return lambda env: call(*(a(env) for a in args))
    return _node(expr)


def _node(expr: sympy.Basic) -> Quick:
    """A node opgen defines, from its elementary form; one the quick model cannot read is `_Unknown`."""
    dummies, form = _form_of(expr.func, len(expr.args))
    args = [_quick(a) for a in expr.args]
    return lambda env: form({**env, **{d: a(env) for d, a in zip(dummies, args, strict=True)}})


@functools.lru_cache(maxsize=256)
def _form_of(function: Any, arity: int) -> tuple[tuple[sympy.Dummy, ...], Quick]:
    """The quick model of a node's elementary form, in dummies for its arguments: built once for all specs."""
    dummies = tuple(sympy.Dummy(f"a{k}", real=True) for k in range(arity))
    form = node_form(function(*dummies))
    if form is None:
        raise _Unknown(function.__name__)
    return dummies, _quick(form)


def _kernel(expr: Prime) -> Quick:
    """A kernel's derivative: its formula in `TENSOR_ARG`, the tensor argument (`opgen.nodes.kernels`)."""
    form = prime_formula(str(expr.args[0]), "elementary", tuple(expr.args[2:]))
    inner, tensor = _quick(form), _quick(expr.args[1])
    return lambda env: inner({**env, TENSOR_ARG: tensor(env)})


def _symbols(derived: Derived, residuals: Sequence[Residual]) -> dict[sympy.Symbol, sympy.Expr]:
    """What backward reads besides the inputs: each let, residual and output, as forward computes it."""
    variant, symbols = derived.full, derived.symbols
    found = {symbols.lets[name]: expr for name, expr in variant.lets}
    found |= {r.symbol: r.expr for r in residuals}
    found |= {symbols.outputs[name]: expr for name, expr in variant.outputs}
    return found


def _held(expr: sympy.Expr, defined: dict[sympy.Symbol, sympy.Expr]) -> sympy.Expr:
    """`expr` in terms of the inputs: each symbol of `defined` replaced by its formula, held whole."""
    return expr.xreplace(
        {
            s: _HOLD(_held(defined[s], defined))
            for s in expr.free_symbols
            if isinstance(s, sympy.Symbol) and s in defined
        }
    )


def quick_model(expr: sympy.Basic) -> Quick | None:
    """`expr` in the quick float32 model; None where the model does not know a node of it."""
    try:
        return _quick(expr)
    except _Unknown:
        return None


def finite_at(quick: Quick, order: Sequence[sympy.Symbol], args: list[Any]) -> bool:
    """Whether the quick model's value at `args` (the spec's inputs, in `order`) is a finite number."""
    env = {s: _f32(float(a)) for s, a in zip(order, args, strict=True) if not isinstance(a, bool)}
    env |= {s: float(a) for s, a in zip(order, args, strict=True) if isinstance(a, bool)}
    return math.isfinite(quick(env))


class Slopes:
    """Each output's part of each Tensor input's gradient, as backward computes it, in float32."""

    def __init__(self, oracle: Oracle, derived: Derived, residuals: Sequence[Residual], digits: Digits) -> None:
        self.oracle = oracle
        self.digits = digits
        spec = derived.spec
        defined = _symbols(derived, residuals)
        self.factors: dict[tuple[int, str], sympy.Expr] = {}
        outputs = {o.name: k for k, o in enumerate(spec.outputs) if o.differentiable}
        for gradient in derived.full.gradients:
            if gradient.overridden or gradient.fit is not None:
                continue
            for c in gradient.contributions:
                if c.output in outputs:
                    key = (outputs[c.output], gradient.input)
                    self.factors[key] = self.factors.get(key, sympy.S.Zero) + _held(c.factor, defined)
        self.order = oracle.order

    @functools.cache  # noqa: B019 - one Slopes per spec, dropped with it
    def _quick(self, key: tuple[int, str]) -> Quick | None:
        return quick_model(self.factors[key])

    @functools.cache  # noqa: B019
    def _exact(self, key: tuple[int, str]) -> Callable[..., Any]:
        return self.digits.in_float32(self.factors[key])

    def not_finite(self, output: int, name: str, args: list[Any]) -> str | None:
        """How output `output`'s part of the gradient of `name` at `args` is no finite float32 number; None
        where it is one, or where backward does not compute it from a derivation (an override)."""
        key = (output, name)
        if key not in self.factors:
            return None
        quick = self._quick(key)
        if quick is not None and finite_at(quick, self.order, args):
            return None
        return float32_value(self._exact(key), args)
