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

Note [derivative of the conjugate form]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The form's branches differentiated one by one are long (the quotient's derivative, each branch
guarded against the other's domain: squareplus's backward made 36 full-size tensors where plain
autograd makes 8), and the derivative of the sum as written, `r' + c w' / (2 sqrt(w))`, cancels
where the sum does. With `n = r + c sqrt(w)` (the node's value) and `D' = 2 r r' - c**2 w'`,

    n' = (2 r' n - D') / (2 c sqrt(w))

exactly, at every point and in either branch: no `where`, and nothing cancels where `D'` is 0 or
simpler than `r**2`'s derivative (squareplus: `n / sqrt(x**2 + b)`; `sqrt(x**2 + 1) - x`:
`-n / sqrt(x**2 + 1)`). The node (this module's `where`) differentiates itself so, and reads its own
value, which the save stage then takes from the op's output where the output is the node
(Note [save policies] in opgen.optimize.save). Its branches are not guarded (Note [double where]
in opgen/derive/guard.py): its derivative does not read them.
"""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn
from opgen.nodes.stable import hypot

MAX_OPS = 40  # expanding `r**2` of a longer sum costs more than the rule is worth


class where(fn.where):  # noqa: N801
    """The conjugate form's `where`, named as its parent so that every printer prints it as one (SymPy's
    printers skip a parent's `_print_where` for a subclass of another name):
    `where(cancels, -D / (|r| + |c| sqrt(w)), r + c sqrt(w))` as `conjugate` writes it; its derivative
    is that of the identity, not of its branches (Note [derivative of the conjugate form])."""

    derivative_reads_branches = False

    def _eval_derivative(self, s: sympy.Symbol) -> Expr:
        found = _split(self.args[2])
        if found is None:  # a branch rebuilt by a later pass: the branches' own derivative
            return super()._eval_derivative(s)
        r, c, term, w = found
        d = sympy.expand(r**2 - c**2 * w)
        return (2 * sympy.diff(r, s) * self - sympy.diff(d, s)) / (2 * term)


def _root(term: Expr) -> tuple[Expr, Expr] | None:
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


def _split(node: Expr) -> tuple[Expr, Expr, Expr, Expr] | None:
    """(r, c, term, w) of a sum `r + term`, `term = c * sqrt(w)`: its first root term."""
    if not isinstance(node, sympy.Add):
        return None
    for term in node.args:
        found = _root(term)
        if found is not None and node != term:
            return node - term, found[0], term, found[1]
    return None


def conjugate(node: sympy.Add) -> Expr | None:
    """`r + c * sqrt(w)` in the conjugate form where it cancels (Note [conjugate form]); None if it cannot.

    A number every term shares is taken out first (`x/2 + sqrt(x**2 + b)/2` is `(x + sqrt(x**2 + b)) / 2`):
    the form of the sum without it has no division of each branch by it."""
    content, primitive = node.as_content_primitive()
    if content != 1 and isinstance(primitive, sympy.Add):
        inner = conjugate(primitive)
        return None if inner is None else content * inner
    for term in node.args:
        found = _root(term)
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
        return where(cancels, (-d if c.is_positive else d) / divisor, node)
    return None


def _sign_test(r: Expr, negative: bool) -> sympy.Basic:
    """`r < 0` (or `r > 0`), with `r`'s positive factor and its sign left out: `x < 0` for `x/2 < 0`."""
    content, body = r.as_content_primitive()
    if body.could_extract_minus_sign():
        body, negative = -body, not negative
    return sympy.StrictLessThan(body, 0) if negative else sympy.StrictGreaterThan(body, 0)


def is_conjugate_form(node: fn.where) -> bool:
    """Whether `node` is what `conjugate` made of its last branch: rewritten already."""
    branch = node.args[2]
    return isinstance(branch, sympy.Add) and conjugate(branch) == node
