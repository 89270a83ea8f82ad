"""SymPy functions for the parts of the formula language SymPy lacks or treats differently.

SymPy has no `sigmoid` or `softplus`, and its `sign`, `floor`, `Max`, `Heaviside`, ...
differentiate to `DiracDelta` or to sums of step functions. PyTorch's ops instead have a
zero gradient almost everywhere and fixed choices at the kinks (Note [kink conventions]).
These classes carry exactly the derivative PyTorch's op has, so `sympy.diff` of a spec
formula gives PyTorch's gradient, and the printer maps each class to one torch call.

Note [kink conventions]
~~~~~~~~~~~~~~~~~~~~~~~
- `abs(x)`: gradient `sign(x)`, so 0 at x = 0 (as `torch.abs`).
- `max(x, c)` / `min(x, c)` where `c` holds no Tensor input: gradient 1 strictly above
  (below) `c`, 0 at the tie; `max(x, 0)` is `torch.relu`.
- `max(a, b)` / `min(a, b)` of two tensors: half the gradient to each side at a tie
  (as `torch.maximum` / `torch.minimum`).
- `clamp(x, lo, hi)`: gradient 1 for `lo <= x <= hi`, so it passes at the bounds (as
  `torch.clamp`); `lo` gets it where `x < lo < hi`, `hi` where `x > hi` or `hi < lo` (the
  value is `hi` wherever the bounds cross, as `torch.clamp`'s).
- `where(c, a, b)`: the condition gets no gradient; each branch gets the gradient where
  it was chosen.
- `sign floor ceil round heaviside` and comparisons: zero gradient everywhere.
- `heaviside(x)` is 1 for x >= 0 and 0 below; `round` rounds half to even.

Note [real kinks]
~~~~~~~~~~~~~~~~~
`where`, `max`, `min` and `clamp` say they are real. SymPy differentiates `abs(u)` of a
`u` it cannot prove real through the real and imaginary parts, as `re(u) re(u)' / abs(u)`,
which the rewrites turn into `sign(u) / u * u`: NaN at `u = 0`, where `torch.abs` gives 0
(`abs(max(x, y))` at `x = y = 0`). For a real `u` it is `sign(u) u'`, PyTorch's.
"""

from __future__ import annotations

import sympy
from sympy import Expr, Function, S
from sympy.core.logic import fuzzy_and

from opgen.nodes.base import Node


class Elementwise(Node, Function):
    """A one-argument function whose value at a number SymPy can compute via `rewrite`."""

    nargs = 1
    is_real = True

    def _eval_evalf(self, prec: int) -> Expr | None:
        arg = self.args[0]
        if arg.is_number:
            return self.elementary().evalf(prec)
        return None


class sigmoid(Elementwise):  # noqa: N801 - prints as the spec's name
    def fdiff(self, argindex: int = 1) -> Expr:
        return self * (1 - self)

    def elementary(self) -> Expr:
        return 1 / (1 + sympy.exp(-self.args[0]))


class softplus(Elementwise):  # noqa: N801
    def fdiff(self, argindex: int = 1) -> Expr:
        return sigmoid(self.args[0])

    def _eval_is_positive(self) -> bool | None:
        """log(1 + exp(u)) > 0 for real u: the stable rewrites of decaying factors need to know it
        (Note [decaying factors] in opgen/optimize/product_rules.py)."""
        return self.args[0].is_extended_real

    def elementary(self) -> Expr:
        return sympy.log(1 + sympy.exp(self.args[0]))


class log1p(Elementwise):  # noqa: N801
    def fdiff(self, argindex: int = 1) -> Expr:
        return 1 / (1 + self.args[0])

    def elementary(self) -> Expr:
        return sympy.log(1 + self.args[0])


class expm1(Elementwise):  # noqa: N801
    def fdiff(self, argindex: int = 1) -> Expr:
        return sympy.exp(self.args[0])

    def elementary(self) -> Expr:
        return sympy.exp(self.args[0]) - 1


class Step(Elementwise):
    """A piecewise-constant function: zero gradient everywhere, as PyTorch defines it."""

    def fdiff(self, argindex: int = 1) -> Expr:
        return S.Zero

    def _eval_evalf(self, prec: int) -> Expr | None:
        arg = self.args[0]
        if arg.is_number:
            return sympy.Float(self._value(float(arg.evalf(prec))), prec)
        return None

    @staticmethod
    def _value(x: float) -> float:
        raise NotImplementedError


class sign(Step):  # noqa: N801
    @staticmethod
    def _value(x: float) -> float:
        return float((x > 0) - (x < 0))


class floor(Step):  # noqa: N801
    @staticmethod
    def _value(x: float) -> float:
        import math

        return float(math.floor(x))


class ceil(Step):  # noqa: N801
    @staticmethod
    def _value(x: float) -> float:
        import math

        return float(math.ceil(x))


class round(Step):  # noqa: N801, A001 - the spec's name
    @staticmethod
    def _value(x: float) -> float:
        import builtins

        return float(builtins.round(x))  # half to even, as torch.round


class heaviside(Step):  # noqa: N801
    @staticmethod
    def _value(x: float) -> float:
        return 1.0 if x >= 0 else 0.0


def _real(args: tuple[sympy.Basic, ...]) -> bool | None:
    """Real when every argument is: formula values are real tensors and numbers (SymPy would
    otherwise call a comparison of them "non-real" and refuse it)."""
    return fuzzy_and(a.is_extended_real for a in args)


# Note [comparisons of a value with itself]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# SymPy decides `u < u` only when it knows `u` is real: not for a let's symbol or `sqrt(s)` when
# the formula is read, but for the let read in (`sum(x) < sum(x)`) or CSE's real `tmp < tmp` later.
# A `where` decided late drops a branch, and with it the shape that branch broadcast with as
# written: `sum(where(l < l, x @ x.T, -l), dim=-2)` summed N copies of `-l` when read, one when
# differentiated. A `where` decides a comparison of an expression with itself at once (`<`, `>`,
# `!=` false; `<=`, `>=`, `==` true), so every stage reads the same formula. (A NaN compares
# unequal to itself in torch; the formula is NaN there either way.)
_SAME_SIDES = {
    sympy.StrictLessThan: S.false,
    sympy.StrictGreaterThan: S.false,
    sympy.Ne: S.false,
    sympy.LessThan: S.true,
    sympy.GreaterThan: S.true,
    sympy.Eq: S.true,
}


def _decide_same_sides(cond: sympy.Basic) -> sympy.Basic:
    """`cond` with its comparisons of an expression with itself decided (Note [comparisons of a value with itself])."""
    if cond in (S.true, S.false):
        return cond
    decided = {
        r: _SAME_SIDES[type(r)]
        for r in cond.atoms(sympy.core.relational.Relational)
        if type(r) in _SAME_SIDES and r.lhs == r.rhs
    }
    return cond.xreplace(decided) if decided else cond


class where(Function):  # noqa: N801
    """`where(cond, a, b)`; the condition is a SymPy boolean and gets no gradient."""

    nargs = 3
    is_real = True  # every value of the formula language is (Note [real kinks])
    # False for a subclass whose derivative is not that of its branches: they need no guard
    # (Note [double where] in opgen/derive/guard.py).
    derivative_reads_branches = True

    def _eval_is_extended_real(self) -> bool | None:
        return _real(self.args[1:])

    def _eval_derivative(self, s: sympy.Symbol) -> Expr:
        cond, a, b = self.args
        return where(cond, a.diff(s), b.diff(s))

    @classmethod
    def eval(cls, cond: sympy.Basic, a: Expr, b: Expr) -> Expr | None:
        cond = _decide_same_sides(cond)
        if cond is S.true:
            return a
        if cond is S.false:
            return b
        if a == b:
            return a
        return None


class xlogy(Function):  # noqa: N801
    """`x * log(y)`, and 0 wherever `x` is 0 (also at `y = 0`: `0 * log(0) = 0`), as `torch.xlogy`.

    Its derivatives are `torch.xlogy`'s: `log(y)` along `x`, but 0 where `x` is 0 and `y <= 0`; `x / y`
    along `y`.
    """

    nargs = 2
    is_real = True

    def _eval_is_extended_real(self) -> bool | None:
        return _real(self.args)

    @classmethod
    def eval(cls, x: Expr, y: Expr) -> Expr | None:
        if x == 0:
            return S.Zero
        if y == 1:
            return S.Zero
        return None

    def fdiff(self, argindex: int = 1) -> Expr:
        x, y = self.args
        if argindex == 1:
            at_zero = sympy.Eq(x, 0, evaluate=False)
            if x != y:  # xlogy(u, u): u = 0 is the whole condition
                at_zero = sympy.And(at_zero, sympy.LessThan(y, 0, evaluate=False))
            return where(at_zero, S.Zero, sympy.log(y))
        return x / y

    def _eval_evalf(self, prec: int) -> Expr | None:
        x, y = self.args
        if x.is_number and y.is_number:
            return S.Zero if x == 0 else (x * sympy.log(y)).evalf(prec)
        return None


class xlog1py(Function):  # noqa: N801
    """`x * log1p(y)`, and 0 wherever `x` is 0 (also at `y = -1`), as `torch.special.xlog1py`:
    `(1 - p) * log(1 - p)` at p = 1 is its limit 0, and stays accurate where p is tiny.

    Its derivatives are those of `xlogy(x, 1 + y)`: `log1p(y)` along `x`, but 0 where `x` is 0 and
    `y <= -1`; `x / (1 + y)` along `y`.
    """

    nargs = 2
    is_real = True

    def _eval_is_extended_real(self) -> bool | None:
        return _real(self.args)

    @classmethod
    def eval(cls, x: Expr, y: Expr) -> Expr | None:
        if x == 0 or y == 0:
            return S.Zero
        return None

    def fdiff(self, argindex: int = 1) -> Expr:
        x, y = self.args
        if argindex == 1:
            at_zero = sympy.Eq(x, 0, evaluate=False)
            if x != 1 + y:  # xlog1py(1 + v, v): x = 0 is the whole condition
                at_zero = sympy.And(at_zero, sympy.LessThan(y, -1, evaluate=False))
            return where(at_zero, S.Zero, log1p(y))
        return x / (1 + y)

    def _eval_evalf(self, prec: int) -> Expr | None:
        x, y = self.args
        if x.is_number and y.is_number:
            return S.Zero if x == 0 else (x * sympy.log(1 + y)).evalf(prec)
        return None


def indicator(cond: sympy.Basic) -> Expr:
    """A condition used as a number: 1 where it holds, 0 elsewhere."""
    return where(cond, S.One, S.Zero)


class _Extremum(Function):
    """`max(a, b)` / `min(a, b)` with PyTorch's gradient conventions (Note [kink conventions]).

    `tensor_args` tells which arguments hold a Tensor input: this decides between the
    relu-style and the maximum-style gradient at a tie, so it is part of the node.
    """

    nargs = 3  # a, b, and a flag: 1 when both hold tensors
    is_real = True

    def _eval_is_extended_real(self) -> bool | None:
        return _real(self.args[:2])

    _wins = staticmethod(sympy.StrictGreaterThan)
    _number = staticmethod(sympy.Max)

    @classmethod
    def eval(cls, a: Expr, b: Expr, both: Expr) -> Expr | None:
        if a.is_number and b.is_number:  # a substitution left plain numbers: compute it
            return cls._number(a, b)
        return None

    def _eval_derivative(self, s: sympy.Symbol) -> Expr:
        a, b, both = self.args
        da, db = a.diff(s), b.diff(s)
        wins, loses = self._wins(a, b), self._wins(b, a)
        if both == 1:
            return where(wins, da, where(loses, db, (da + db) / 2))
        return where(wins, da, S.Zero) + where(loses, db, S.Zero)


class maximum(_Extremum):  # noqa: N801
    _wins = staticmethod(sympy.StrictGreaterThan)
    _number = staticmethod(sympy.Max)


class minimum(_Extremum):  # noqa: N801
    _wins = staticmethod(sympy.StrictLessThan)
    _number = staticmethod(sympy.Min)


class clamp(Function):  # noqa: N801
    nargs = 3
    is_real = True

    @classmethod
    def eval(cls, x: Expr, lo: Expr, hi: Expr) -> Expr | None:
        if x.is_number and lo.is_number and hi.is_number:  # a constant (`clamp(2, 0, 1)`, `l - l` of a let)
            return sympy.Min(sympy.Max(x, lo), hi)  # torch.clamp's: `hi` when lo > hi
        return None

    def _eval_is_extended_real(self) -> bool | None:
        return _real(self.args)

    def _eval_derivative(self, s: sympy.Symbol) -> Expr:
        x, lo, hi = self.args
        inside = sympy.And(sympy.GreaterThan(x, lo), sympy.LessThan(x, hi))
        below = sympy.And(sympy.StrictLessThan(x, lo), sympy.StrictLessThan(lo, hi))
        above = sympy.Or(sympy.StrictGreaterThan(x, hi), sympy.StrictLessThan(hi, lo))
        return where(inside, x.diff(s), S.Zero) + where(below, lo.diff(s), S.Zero) + where(above, hi.diff(s), S.Zero)


def std_of(variance: Expr) -> Expr:
    """Note [std at zero]
    ~~~~~~~~~~~~~~~~~~~~
    `std(x)` is `sqrt(var(x))` with `torch.std`'s gradient: 0 where the std is 0 (equal entries, or
    one entry with `correction=0`), where `sqrt`'s derivative `1 / (2 sqrt(v))` is infinite and
    times the zero derivative of the variance gives NaN. Written as `where(v == 0, 0, sqrt(v))`: the
    same value, and each branch differentiated on its own (`where`'s rule), so first and second
    derivatives are 0 there as PyTorch's. `sqrt(var(x))` written out keeps `sqrt`'s NaN, as plain
    autograd of it does."""
    if variance.is_number:
        return sympy.sqrt(variance)
    return where(sympy.Eq(variance, 0, evaluate=False), S.Zero, sympy.sqrt(variance))


class _real_abs(Function):  # noqa: N801
    """`abs(u)` while `real_diff` differentiates: its derivative is `sign(u) u'` (Note [real kinks])."""

    nargs = 1
    is_real = True

    def fdiff(self, argindex: int = 1) -> Expr:
        return sympy.sign(self.args[0])


def real_diff(expr: sympy.Basic, x: sympy.Symbol) -> Expr:
    """`sympy.diff(expr, x)` of a real formula. Every value of the formula language is real; SymPy takes
    `abs(u)` of a `u` it cannot prove real (`lgamma(...)`, `log(...)`) through its real and imaginary
    parts and rewrites the whole derivative with `sign`, so an `abs(v)` inside `u` became `v / sign(v)`,
    NaN at v = 0 where the formula has a value (Note [real kinks])."""
    if not expr.has(sympy.Abs):
        return sympy.diff(expr, x)
    return sympy.diff(expr.replace(sympy.Abs, _real_abs), x).replace(_real_abs, sympy.Abs)
