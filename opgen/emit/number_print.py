"""Numbers and constants as the torch printer writes them: literals as `ruff format` writes them,
exact constants as the expressions they are.

Note [constants as written]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
A spec's decimal stays the decimal it wrote (`0.044715`, read exactly as 8943/200000 and printed
back as its shortest float literal). A constant SymPy keeps exact, made of rationals, `pi`, `E`
and square roots of them, prints as that expression of `math` constants, never as its value:
`pi**2/3` is `math.pi**2 / 3`, `2*sqrt(2)/sqrt(pi)` is `2 * math.sqrt(2 / math.pi)` (square
roots are gathered under one root). Python evaluates it once, in float64, to the value or one
unit in the last place from it (tests/test_generated_style.py checks the values against SymPy).
Anything else that is a number (`log(2)`, `erf(1)`) prints as its float64 value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn
from opgen.spec.quote import float_literal

# Note [spacing]
# ~~~~~~~~~~~~~~
# Generated code is what `ruff format` (Black's style) would write, so the printer spaces
# binary operators (`a * b`, `a / b`) and leaves `**` unspaced only between simple operands
# (names, attribute chains, number literals, each with an optional unary minus): `x**2`,
# `math.pi**2`, but `(a + b) ** 2` and `f(x) ** 2`. A negated power is parenthesized,
# `-(x**2)`, as ruff writes it. tests/test_generated_style.py checks all.
_SIMPLE_OPERAND = re.compile(r"-?(?:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*|\d+(?:\.\d*)?(?:e-?\d+)?)")


def power(base: str, exponent: str) -> str:
    """`base**exponent`, spaced as ruff formats it (Note [spacing])."""
    simple = _SIMPLE_OPERAND.fullmatch(base) and _SIMPLE_OPERAND.fullmatch(exponent)
    return f"{base}**{exponent}" if simple else f"{base} ** {exponent}"


def decimal(value: sympy.Rational) -> str | None:
    """A fraction as a float literal when that is the same number or short, else None (`p / q`)."""
    text = float_literal(float(value))
    return text if sympy.Rational(text) == value or len(text) <= 12 else None


def is_exact_constant(expr: sympy.Basic) -> bool:
    """Rationals, `pi` and `E` under `+`, `*` and rational powers (Note [constants as written])."""
    if isinstance(expr, (sympy.Rational, sympy.NumberSymbol)):
        return True
    if isinstance(expr, sympy.exp):
        return expr.args[0].is_Rational
    if isinstance(expr, sympy.Pow):
        return bool(expr.exp.is_Rational) and is_exact_constant(expr.base)
    return isinstance(expr, (sympy.Add, sympy.Mul)) and all(is_exact_constant(a) for a in expr.args)


def _sigmoid_of_number(u: Expr) -> Expr:
    """sigmoid(u) with `math.exp` of a non-positive argument only: it never overflows."""
    e = sympy.exp(-sympy.Abs(u))
    return fn.where(sympy.GreaterThan(u, 0), 1 / (1 + e), e / (1 + e))


def _softplus_of_number(u: Expr) -> Expr:
    """softplus(u) = max(u, 0) + log1p(exp(-|u|)): no overflow, no cancellation."""
    return fn.where(sympy.StrictGreaterThan(u, 0), u, S.Zero) + fn.log1p(sympy.exp(-sympy.Abs(u)))


def _sign_of_number(u: Expr) -> Expr:
    return fn.where(sympy.StrictGreaterThan(u, 0), S.One, fn.where(sympy.StrictLessThan(u, 0), S.NegativeOne, S.Zero))


# Functions of a number that `math` lacks, as formulas of what it has.
_NUMBER_FORMULAS = {"sigmoid": _sigmoid_of_number, "softplus": _softplus_of_number, "sign": _sign_of_number}


class NumberPrinting:
    """Literals and exact constants (Note [constants as written]); mixed into `TorchPrinter`."""

    if TYPE_CHECKING:  # provided by TorchPrinter
        math: str
        torch: str

        def _print(self, expr: Any, **kwargs: Any) -> str: ...
        def _print_Pow(self, expr: sympy.Pow, rational: bool = False) -> str: ...  # noqa: N802

    def _print_Max(self, expr: sympy.Max) -> str:  # noqa: N802
        """Of exact constants the number; of parameters (Note [parameters of lowered primitives] in
        opgen.optimize.lower) Python's own `max`/`min`: a number input is a Python float."""
        if expr.is_number:
            return self._print_number(expr)
        name = "max" if isinstance(expr, sympy.Max) else "min"
        return f"{name}({', '.join(self._print(a) for a in sorted(expr.args, key=sympy.default_sort_key))})"

    _print_Min = _print_Max

    def _print_Integer(self, expr: sympy.Integer) -> str:  # noqa: N802
        # torch takes a Python int as int64 and raises beyond it (`x ** 10**100`): its float64 value
        return str(int(expr)) if abs(expr) < 2**63 else float_literal(float(expr))

    def _print_Rational(self, expr: sympy.Rational) -> str:  # noqa: N802
        text = decimal(expr)
        return text if text is not None else f"{expr.p} / {expr.q}"

    def _print_Float(self, expr: sympy.Float) -> str:  # noqa: N802
        return float_literal(float(expr))

    def _print_Half(self, expr: Expr) -> str:  # noqa: N802
        return "0.5"

    def _print_Infinity(self, expr: Expr) -> str:  # noqa: N802
        return f"{self.math}.inf"

    def _print_NegativeInfinity(self, expr: Expr) -> str:  # noqa: N802
        return f"-{self.math}.inf"

    def _print_Exp1(self, expr: Expr) -> str:  # noqa: N802
        return f"{self.math}.e"

    def _print_Pi(self, expr: Expr) -> str:  # noqa: N802
        return f"{self.math}.pi"

    def _print_NumberSymbol(self, expr: Expr) -> str:  # noqa: N802
        """Constants the math module lacks (`digamma(1)` is `-EulerGamma`): their float64 value. SymPy's own
        rule collects them for a `doprint` this printer does not run (an internal error)."""
        return float_literal(float(expr))

    def _print_number(self, expr: Expr) -> str:
        """A number that is no literal: the expression it is when exact, else its float64 value."""
        if is_exact_constant(expr) and not expr.is_Add:
            return self._print_constant(expr)
        value = expr.evalf(17)
        if not value.is_Float:  # no value SymPy can compute: print it as Python
            return str(super()._print(expr))  # type: ignore[misc]
        return float_literal(float(value))

    def _print_constant(self, expr: Expr) -> str:
        """`math.pi**2 / 3`, `-(math.pi**2) / 3`, `2 * math.sqrt(2 / math.pi)`: a product of exact constants."""
        negative = expr.could_extract_minus_sign()
        coeff, factors = (-expr if negative else expr).as_coeff_mul()
        roots = [f for f in factors if f.is_Pow and f.exp in (S.Half, -S.Half)]
        top = [str(coeff.p)] if coeff.p != 1 else []
        bottom = [str(coeff.q)] if coeff.q != 1 else []
        for factor in factors:
            if factor in roots:
                continue
            base, exponent = factor.as_base_exp()
            if exponent.is_negative:
                bottom.append(self._factor(base ** (-exponent)))
            else:
                top.append(self._factor(factor))
        if roots:
            radicand = sympy.Mul(*(f.base ** (2 * f.exp) for f in roots))
            top.append(f"{self.math}.sqrt({self._print_constant(radicand)})")
        top = top or ["1"]
        if negative:  # ruff writes a negated power `-(x**2)` (Note [spacing])
            top[0] = f"-({top[0]})" if "**" in top[0] else f"-{top[0]}"
        text = " * ".join(top)
        if bottom:
            text += f" / {bottom[0]}" if len(bottom) == 1 else f" / ({' * '.join(bottom)})"
        return text

    def _factor(self, expr: Expr) -> str:
        """One factor of an exact constant: `math.pi`, `math.pi**2`, `math.exp(2)`, a sum's value."""
        if isinstance(expr, sympy.Pow):
            return self._print_Pow(expr)
        if isinstance(expr, sympy.exp):
            return f"{self.math}.exp({self._print(expr.args[0])})"
        if isinstance(expr, sympy.NumberSymbol):
            return self._print(expr)
        return self._print_number(expr) if expr.is_Add else self._print(expr)

    def _number_function(self, name: str, *args: sympy.Basic) -> str:
        """A function `math` lacks, of numbers: a formula of `math` functions where one is exact,
        else PyTorch's own function of a float64 scalar tensor, back as a Python float."""
        if name in _NUMBER_FORMULAS:
            formula = _NUMBER_FORMULAS[name](*args)
            text = self._print(formula)
            return f"({text})" if isinstance(formula, (sympy.Add, sympy.Mul, sympy.Pow)) else text
        *extra, arg = args
        scalar = f"{self.torch}.tensor({self._print(arg)}, dtype={self.torch}.float64)"
        return f"{self.torch}.{name}({''.join(self._print(e) + ', ' for e in extra)}{scalar}).item()"


# Note [common factors]
# ~~~~~~~~~~~~~~~~~~~~~
# SymPy spreads a number over a sum (`2 * (x - t)` is `2*x - 2*t`), so a printed gradient
# multiplies each tensor term by it: a pass over the tensors per term. Where two terms or more
# of a tensor sum hold tensors times one number, the sum prints with the number taken out,
# `2 * (x - t)`: one multiplication. Only where every term is a small whole multiple of the
# number (at most MULTIPLE times it), so that no term grows on the way: `1e-20 * (1.2e36 * x
# + ...)` would overflow float32 where `1.2e16 * x + 1e-20 * x**2` does not.
MULTIPLE = 16


def common_factor(expr: sympy.Add, is_tensor: Callable[[sympy.Basic], bool]) -> sympy.Rational | None:
    """The number every term of the sum `expr` is a small multiple of, where it is worth taking out
    (Note [common factors]); negative where every term is negative; None otherwise."""
    coefficients = [term.as_coeff_Mul()[0] for term in expr.args]
    if not all(c.is_Rational and c != 0 for c in coefficients):
        return None
    common = abs(coefficients[0])
    for c in coefficients[1:]:
        if common == 1:
            return None
        # the gcd of two fractions, as sympy.gcd gives it, without its polynomial machinery (slow in a long sum)
        common = sympy.Rational(math.gcd(common.p, c.p), math.lcm(common.q, c.q))
    if common == 1 or any(not (c / common).is_Integer or abs(c / common) > MULTIPLE for c in coefficients):
        return None
    if sum(1 for t, c in zip(expr.args, coefficients, strict=True) if is_tensor(t) and abs(c) != 1) < 2:
        return None
    return -common if all(c < 0 for c in coefficients) else common
