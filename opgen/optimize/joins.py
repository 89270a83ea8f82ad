"""Joins of two branches: `max(0, s) + min(0, f(s))` is `where(s > 0, s, f(s))` where both sides meet at
0 with one slope, so the derivative there is that slope, not a kink convention (used by `opgen.optimize.rewrite`)."""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn

MAX_PASSES = 8  # each pass rewrites bottom-up; a fixpoint is reached in two or three


def is_exp(expr: sympy.Basic) -> bool:
    return isinstance(expr, sympy.exp) or (isinstance(expr, sympy.Pow) and expr.base == S.Exp1)


def joined_branches(node: sympy.Add) -> Expr | None:
    """`max(0, a) + min(0, b)` -> `where(s > 0, a, b)` where `a` and `b` have the sign of one symbol `s`.

    Note [branches that join]
    ~~~~~~~~~~~~~~~~~~~~~~~~~
    CELU written with max and min, `max(0, x) + min(0, alpha*(exp(x/alpha) - 1))`, is differentiable at
    x = 0 (both sides have slope 1), but each of its kinks there takes its own convention (relu's slope
    0 at 0, and the min's), and the sum's slope at 0 comes out 0. Where one of `a`, `b` is a symbol `s`
    and the other a function `f(s)` with `f(0) = 0` and `f' > 0` (SymPy proves it positive), both have
    the sign of `s`: the sum is `a` for `s > 0`, `b` for `s < 0` and 0 at 0, exactly `where(s > 0, a, b)`,
    whose slope at the join is `b`'s, the slope of the function where the two sides agree. Each branch
    reads `s` clamped to its side (`f(where(s > 0, 0, s))`: f(0) = 0, the same value where it is taken),
    so that the branch not taken is finite under autograd (`exp(x)` at x = 1e4: Note [double where] in
    opgen/derive/guard.py).
    """
    terms = node.args
    for high in terms:
        if not (isinstance(high, fn.maximum) and S.Zero in high.args[:2]):
            continue
        a = high.args[1] if high.args[0] == 0 else high.args[0]
        for low in terms:
            if not (isinstance(low, fn.minimum) and S.Zero in low.args[:2]):
                continue
            b = low.args[1] if low.args[0] == 0 else low.args[0]
            s = _common_sign(a, b)
            if s is not None:
                rest = [t for t in terms if t is not high and t is not low]
                right = sympy.StrictGreaterThan(s, 0)
                if a != s:
                    a = a.xreplace({s: fn.where(right, s, S.Zero)})
                if b != s:
                    b = b.xreplace({s: fn.where(right, S.Zero, s)})
                return sympy.Add(fn.where(right, a, b), *rest)
    return None


def _common_sign(a: Expr, b: Expr) -> sympy.Symbol | None:
    """The symbol whose sign both `a` and `b` have, one being it and the other increasing through 0 with it."""
    for s, f in ((a, b), (b, a)):
        if not (isinstance(s, sympy.Symbol) and f.has(s)):
            continue
        at_zero = f.subs(s, 0).replace(fn.expm1, lambda u: sympy.exp(u) - 1)
        if sympy.simplify(at_zero) == 0 and _increasing(sympy.diff(f, s)):
            return s
    return None


def _increasing(slope: Expr) -> bool:
    """Whether `slope` is > 0 wherever it is defined: positive as SymPy knows, or a product of positive
    numbers and exponentials."""
    if slope.is_positive:
        return True
    return all(f.is_positive or is_exp(f) for f in sympy.Mul.make_args(slope))
