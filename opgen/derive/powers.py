"""The power rule as a careful person writes it: `d u**g = g * u**(g - 1)`, never `g * u**g / u`.

Receives a SymPy expression (a derivative `sympy.diff` just returned); returns it with the
powers of one base in each product combined (Note [power rule]). `opgen.derive.gradients`
applies it to every derivative, so it holds whether or not the spec's formulas are rewritten,
and `opgen.optimize.rewrite` uses the same rule on the rewritten gradients.

Note [power rule]
~~~~~~~~~~~~~~~~~
SymPy differentiates `u**g` as `g * u**g / u` and keeps the two powers apart when `g` is a
symbol and `u` is not one (`(1 - p)**g / (1 - p)`); it may also write the divisor with the
sign flipped (`1 / (p - 1)`). At `u = 0` that is 0/0, NaN, where `g * u**(g - 1)` (PyTorch's
own pow backward) is finite for `g >= 1`: the multi-class focal loss `-(1 - p)**gamma * log(p)`
at p = 1. Powers of one base in a product are combined, `u**a * u**b -> u**(a + b)`, also when
one base is the other negated and its exponent an integer (`(-u)**k = (-1)**k * u**k`). The
result is the same value wherever the product was defined, and defined in more places.
"""

from __future__ import annotations

import sympy
from sympy import Expr


def same_base(factors: list[Expr]) -> Expr | None:
    """The product of `factors` with the powers of one base combined; None if no two share a base."""
    split = [factor.as_base_exp() for factor in factors]
    exponents: dict[Expr, list[Expr]] = {}
    for base, power in split:  # bases of other than integer powers first: a negated one joins them
        if not power.is_Integer:
            exponents.setdefault(base, []).append(power)
    sign = sympy.S.One
    for base, power in split:
        if power.is_Integer:
            if base not in exponents and -base in exponents:
                base, sign = -base, sign * (-1) ** power
            exponents.setdefault(base, []).append(power)
    if all(len(powers) == 1 for powers in exponents.values()):
        return None
    return sign * sympy.Mul(*(base ** sympy.Add(*powers) for base, powers in exponents.items()))


def combine_powers(expr: Expr) -> Expr:
    """`expr` with the powers of one base combined in every product (Note [power rule])."""

    def combine(node: sympy.Mul) -> Expr:
        combined = same_base(list(node.args))
        return node if combined is None else combined

    return expr.replace(lambda e: isinstance(e, sympy.Mul), combine)
