"""The words of the formula language: its functions, constants and the kinds of value.

What a name in a formula may be besides the spec's own names (spec format, section 3):
`FUNCTIONS` maps each elementwise function to its arity and SymPy builder; `where`, `max`,
`min` and the reductions are read by opgen.formula.reader itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn
from opgen.formula.words import REDUCTIONS as REDUCTIONS
from opgen.nodes.bessel import BESSEL
from opgen.nodes.diagonal import DIAGONALS
from opgen.nodes.integer_parts import REMAINDERS, trunc
from opgen.nodes.scan import PRODUCT, SCANS
from opgen.nodes.special import NORMAL
from opgen.nodes.stop_gradient import stop_gradient

# A parsed value is a number-like SymPy expression or a SymPy boolean (a condition).
NUM, BOOL = "number", "condition"


@dataclass(frozen=True)
class Value:
    expr: sympy.Basic
    kind: str  # NUM or BOOL


def _elementwise(f: Callable[[Expr], Expr]) -> tuple[int, Callable[..., Expr]]:
    return 1, f


EXACT_UP_TO = 1000  # lgamma/digamma of a larger integer: SymPy would sum its exact factorial or harmonic number


def _numeric_when_large(f: Callable[..., Expr]) -> tuple[int, Callable[..., Expr]]:
    """`f`, which SymPy evaluates exactly at a rational number (`lgamma(n)` is `log((n-1)!)`, `digamma(n)`
    a harmonic number): at a large one, its value to 30 digits instead (`lgamma(1e7)` took minutes)."""

    def build(x: Expr) -> Expr:
        return exact_when_small(f, x)

    return 1, build


def exact_when_small(f: Callable[..., Expr], x: Expr, *before: Expr) -> Expr:
    """`f(*before, x)`, exact at a small rational `x`, to 30 digits at a large one (`_numeric_when_large`)."""
    if x.is_Rational and abs(x) > EXACT_UP_TO and not (x.is_integer and x < 0):  # not a pole
        return f(*before, x, evaluate=False).evalf(30)
    return f(*before, x)


MAX_POLYGAMMA = 20  # polygamma(n, x)'s largest order: n! / x**(n + 1) leaves float32 past it near x = 1


def polygamma_of_number(order: int, x: Expr) -> Expr:
    """polygamma(order, x) of a number `x`: its exact value, or 30 digits of it for a large one."""
    return exact_when_small(sympy.polygamma, x, sympy.Integer(order))


FUNCTIONS: dict[str, tuple[int, Callable[..., Expr]]] = {
    "exp": _elementwise(sympy.exp),
    "log": _elementwise(sympy.log),
    "log1p": _elementwise(fn.log1p),
    "expm1": _elementwise(fn.expm1),
    "sqrt": _elementwise(sympy.sqrt),
    "rsqrt": _elementwise(lambda x: 1 / sympy.sqrt(x)),
    "sin": _elementwise(sympy.sin),
    "cos": _elementwise(sympy.cos),
    "tan": _elementwise(sympy.tan),
    "asin": _elementwise(sympy.asin),
    "acos": _elementwise(sympy.acos),
    "atan": _elementwise(sympy.atan),
    "atan2": (2, sympy.atan2),
    "sinh": _elementwise(sympy.sinh),
    "cosh": _elementwise(sympy.cosh),
    "tanh": _elementwise(sympy.tanh),
    "asinh": _elementwise(sympy.asinh),
    "acosh": _elementwise(sympy.acosh),
    "atanh": _elementwise(sympy.atanh),
    "sigmoid": _elementwise(fn.sigmoid),
    "softplus": _elementwise(fn.softplus),
    "erf": _elementwise(sympy.erf),
    "erfc": _elementwise(sympy.erfc),
    "erfinv": _elementwise(sympy.erfinv),
    "lgamma": _numeric_when_large(sympy.loggamma),
    "digamma": _numeric_when_large(lambda x, **options: sympy.polygamma(0, x, **options)),
    "abs": _elementwise(sympy.Abs),
    "sign": _elementwise(fn.sign),
    "floor": _elementwise(fn.floor),
    "ceil": _elementwise(fn.ceil),
    "round": _elementwise(fn.round),
    "trunc": _elementwise(trunc),  # Note [integer parts] in opgen.nodes.integer_parts
    **{name: (2, f) for name, f in REMAINDERS.items()},
    "heaviside": _elementwise(fn.heaviside),
    "clamp": (3, fn.clamp),
    "xlogy": (2, fn.xlogy),
    "stop_gradient": _elementwise(stop_gradient),  # Note [stop-gradient] in opgen.nodes.stop_gradient
    **{name: _elementwise(f) for name, f in BESSEL.items()},  # Note [modified Bessel functions]
    **{name: _elementwise(f) for name, f in NORMAL.items()},  # Note [normal distribution functions]
}


SPECIAL_FUNCTIONS = ("where", "max", "min", "polygamma")  # polygamma(n, x): n a whole-number literal


# `unsqueeze(x, dim=-3)`: a new dimension of size 1 (a batch of matrices meeting a batch of weights);
# `chunk(x, 2, dim=-1)[0]`: one of equal parts of a named dimension (opgen.formula.slicing)
SHAPE_FUNCTIONS = (
    "unsqueeze",
    "chunk",
    "cat",
    "stack",
    *DIAGONALS,
    *SCANS,
    PRODUCT,
)  # cat, stack: opgen.nodes.concat; the diagonals: opgen.nodes.diagonal; the scans: opgen.nodes.scan


ALL_FUNCTIONS = tuple(sorted([*FUNCTIONS, *SPECIAL_FUNCTIONS, *REDUCTIONS, *SHAPE_FUNCTIONS]))


CONSTANTS: dict[str, Value] = {
    "pi": Value(sympy.pi, NUM),
    "inf": Value(S.Infinity, NUM),
    "true": Value(S.true, BOOL),
    "false": Value(S.false, BOOL),
    "True": Value(S.true, BOOL),
    "False": Value(S.false, BOOL),
}
