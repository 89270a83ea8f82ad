"""Sums that cancel against a square root, written in the conjugate form where they cancel.

Receives one `Add` node of a (rewritten bottom-up) formula; returns the same value computed
without cancellation, or None (Note [conjugate form]). Called by `opgen.optimize.rewrite`.

Note [conjugate form]
~~~~~~~~~~~~~~~~~~~~~
`r + c * sqrt(w)` (c a number) loses every digit where the two terms nearly cancel: squareplus
`(x + sqrt(x**2 + b)) / 2` is 0 in float32 at x = -1e4 (exact 1e-4 for b = 4). Multiplying by
the conjugate, `r + c sqrt(w) = D / (r - c sqrt(w))` with `D = r**2 - c**2 w`, has no
cancellation where `r` and `c` have opposite signs, and when `D` is simpler than `r**2` (a term
of `r**2` cancels in it: `x**2 - (x**2 + b) = -b`) it is computed without any. So the sum becomes

    where(r < 0, -D / (|r| + c sqrt(w)), r + c sqrt(w))     for c > 0
    where(r > 0,  D / (|r| - c sqrt(w)), r + c sqrt(w))     for c < 0

The conjugate's divisor `|r| + |c| sqrt(w)` is a sum of two non-negative terms, positive
unless both are 0, in either branch: no branch divides by zero where the other is taken.
A `hypot(a, b)` is `sqrt(a**2 + b**2)` here. Where `D` is no simpler (`x + sqrt(y)`), the
cancellation is in `D` too and the sum stays as written.
"""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn

MAX_OPS = 40  # expanding `r**2` of a longer sum costs more than the rule is worth


def _root(term: Expr, hypot: type[sympy.Function]) -> tuple[Expr, Expr] | None:
    """(c, w) when `term` is `c * sqrt(w)` (or `c * hypot(a, b)`, w = a**2 + b**2), `c` a number."""
    coeff, body = term.as_coeff_Mul()
    if coeff == 0 or not coeff.is_number:
        return None
    if isinstance(body, sympy.Pow) and body.exp == S.Half:
        return coeff, body.base
    if isinstance(body, hypot):
        a, b = body.args
        return coeff, a**2 + b**2
    return None


def conjugate(node: sympy.Add, hypot: type[sympy.Function]) -> Expr | None:
    """`r + c * sqrt(w)` in the conjugate form where it cancels (Note [conjugate form]); None if it cannot."""
    for term in node.args:
        found = _root(term, hypot)
        if found is None:
            continue
        c, w = found
        r = node - term
        if r == 0 or r.is_number or sympy.count_ops(r) + sympy.count_ops(w) > MAX_OPS:
            continue
        square = sympy.expand(r**2)
        d = sympy.expand(square - c**2 * w)
        kept = set(sympy.Add.make_args(d))
        if d == 0 or all(t in kept for t in sympy.Add.make_args(square)):
            continue  # nothing cancels in D: the conjugate would not help
        if (r.is_nonnegative and c.is_positive) or (r.is_nonpositive and c.is_negative):
            continue  # the terms have one sign: nothing cancels
        divisor = sympy.Abs(r) + abs(c) * term / c
        cancels = _sign_test(r, negative=bool(c.is_positive))
        return fn.where(cancels, (-d if c.is_positive else d) / divisor, node)
    return None


def _sign_test(r: Expr, negative: bool) -> sympy.Basic:
    """`r < 0` (or `r > 0`), with `r`'s positive factor and its sign left out: `x < 0` for `x/2 < 0`."""
    content, body = r.as_content_primitive()
    if body.could_extract_minus_sign():
        body, negative = -body, not negative
    return sympy.StrictLessThan(body, 0) if negative else sympy.StrictGreaterThan(body, 0)


def is_conjugate_form(node: fn.where, hypot: type[sympy.Function]) -> bool:
    """Whether `node` is what `conjugate` made of its last branch: rewritten already."""
    branch = node.args[2]
    return isinstance(branch, sympy.Add) and conjugate(branch, hypot) == node
