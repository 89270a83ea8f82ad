"""Stable rewrites of products with sines and logarithms: Note [stable rewrites] in opgen/optimize/rewrite.py.

    2 sin(u) cos(u) q       -> sin(2u) q               (`double_angle`)
    exp(v) (1 - tanh(u)**2) -> 4 exp(v - 2u) sigmoid(2u)**2  (`exp_decaying`, u >= 0: no inf * 0;
    exp(v) sigmoid(-u)      -> exp(v - u) sigmoid(u)          the same for (1 - sigmoid(u))**k,
    exp(v) cosh(u)**-k      -> 2**k exp(v - k u) sigmoid(2u)**k   Note [decaying factors])
    (a + b exp(v)) exp(-k exp(t)) -> a exp(-k exp(t)) + b exp(v - k exp(t))  (`exp_into_sum`, after
                                                        `exp_decaying`: Note [sums beside a decaying exponential])
    sinh(u) cosh(u)**-k     -> tanh(u) cosh(u)**(1 - k)  (`sinh_over_cosh`: no inf / inf)
    u * log(u)              -> xlogy(u, u)             (`x_log_x`; 0 at u = 0, the limit; unless u > 0;
                                                        also u log(u w), and u**g log(u) as torch.pow's rule)
    (1 + v) * log1p(v)      -> xlog1py(1 + v, v)       (the same, where `log(1 - p)` became `log1p(-p)`)
    sin(a) / a * q          -> sinc(a / pi) * q        (`to_sinc`; sinc(t) = sin(pi t) / (pi t))

and `unsinc`, which writes a sinc back as `sin(a) / a` in a gradient where it buys nothing
(Note [sinc that buys nothing]). Each rule takes a product (its factors, or the node) and returns
its rewritten form, or None; `opgen.optimize.rewrite` tries them after its own rules of products.
"""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn


class sinc(fn.Elementwise):  # noqa: N801
    """The normalised sinc, sin(pi u) / (pi u), with sinc(0) = 1 (as torch.sinc)."""

    # Finite everywhere, but its derivative divides by its argument: inside a `where` branch
    # not taken near 0 it needs the same guard as `1/u` (Note [double where] in opgen/derive/guard.py).
    guard_domain = ((0,), S.One)

    def fdiff(self, argindex: int = 1) -> Expr:
        u = self.args[0]
        # torch.sinc's own gradient: 0 at u = 0, where the quotient below is 0/0; the
        # divisor is guarded too, so that the derivative of this one stays finite there
        # (Note [double where] in opgen/derive/guard.py).
        at_zero = sympy.Eq(u, 0)
        return fn.where(at_zero, S.Zero, (sympy.cos(sympy.pi * u) - self) / fn.where(at_zero, S.One, u))

    def elementary(self) -> Expr:
        u = self.args[0]
        return sympy.sin(sympy.pi * u) / (sympy.pi * u) if u != 0 else S.One


def x_log_x(factors: list[Expr]) -> Expr | None:
    """u log(u w) q -> xlogy(u, u w) q (also -u log(u w)): 0 at u = 0, the limit, where `0 * log(0)` is NaN
    (`t log(t / p)`, a KL divergence's term, at t = 0); and u**g log(u) q, the derivative of a power in
    its exponent, 0 at u = 0 as torch.pow has it (Note [powers at a zero base]).

    Left alone where u is positive (nothing to gain, and xlogy's derivative has a select); the
    derivative at u = 0 is xlogy's (log term 0 there, so 1), where the formula's is NaN.
    """
    for factor in factors:
        if isinstance(factor, sympy.log):
            v = factor.args[0]
            found = [(u, fn.xlogy(u, v)) for u in (v, *sympy.Mul.make_args(v)) if not u.is_positive]
            found += [(power, _power_log(power)) for power in factors if _power_of(power, v)]
        elif isinstance(factor, fn.log1p):  # (1 + v) log1p(v): log(1 - p) was rewritten first
            u = 1 + factor.args[0]
            found = [] if u.is_positive else [(u, fn.xlog1py(u, factor.args[0]))]
        else:
            continue
        for u, form in found:
            for sign, term in ((1, u), (-1, -u)):
                if term in factors and term is not factor:
                    rest = [f for f in factors if f is not factor]
                    rest.remove(term)
                    return sign * sympy.Mul(form, *rest)
    return None


def _power_log(power: Expr) -> Expr:
    """`u**g log(u)` as torch.pow's backward takes it at u = 0 (Note [powers at a zero base])."""
    u, g = power.as_base_exp()
    zero = sympy.And(sympy.Eq(u, 0), sympy.GreaterThan(g, 0))
    return fn.where(zero, S.Zero, power * sympy.log(fn.where(zero, S.One, u)))


def _power_of(factor: Expr, base: Expr) -> bool:
    """`factor` is `base**g`, `g` not a number, `base` not known positive.

    Note [powers at a zero base]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    The derivative of `u**g` in `g` is `u**g log(u)`: NaN at u = 0 (0 * -inf), in float64 too, where
    its limit from u > 0 is 0 for g > 0, the value torch.pow's backward gives (`relu(x)**p` with a
    learnable `p` has p.grad = nan from one zero input as written). It becomes torch.pow's rule,
    `where(u == 0 & g >= 0, 0, u**g log(where(u == 0 & g >= 0, 1, u)))` (at g = 0 a convention: there
    is no limit), the log's argument guarded so that the derivatives of the selected 0 are 0 too
    (Note [double where] in opgen/derive/guard.py); `xlogy(u**g, u)` has that value, but its
    derivative in `u` is `u**g / u`, 0/0 there.
    """
    b, g = factor.as_base_exp()
    return b == base and not g.is_number and not b.is_positive


def double_angle(factors: list[Expr]) -> Expr | None:
    """2 sin(u) cos(u) q -> sin(2u) q: one call of sin instead of sin and cos (snake's slope 1 + sin(2ax))."""
    for factor in factors:
        if isinstance(factor, sympy.sin) and sympy.cos(factor.args[0]) in factors:
            u = factor.args[0]
            rest = [f for f in factors if f is not factor and f != sympy.cos(u)]
            return sympy.Mul(sympy.sin(2 * u), *rest) / 2
    return None


def _sech_squared(factor: Expr) -> Expr | None:
    """`u` when `factor` is `1 - tanh(u)**2` (SymPy's derivative of tanh) with `u` known non-negative."""
    if isinstance(factor, sympy.Add) and len(factor.args) == 2 and S.One in factor.args:
        square = -(factor - 1)
        if isinstance(square, sympy.Pow) and square.exp == 2 and isinstance(square.base, sympy.tanh):
            u = square.base.args[0]
            return u if u.is_nonnegative else None
    return None


def _sigmoid_complement(base: Expr) -> Expr | None:
    """`u` when `base` is `1 - sigmoid(u)` (SymPy's derivative of sigmoid has it) with `u` known non-negative."""
    if isinstance(base, sympy.Add) and len(base.args) == 2 and S.One in base.args:
        rest = -(base - 1)
        if isinstance(rest, fn.sigmoid) and rest.args[0].is_nonnegative:
            return rest.args[0]
    return None


def _decaying(factor: Expr) -> Expr | None:
    """`factor` as `exp(-w) * rest` with `rest` at most 1 (Note [decaying factors]); else None."""
    u = _sech_squared(factor)
    if u is not None:
        return 4 * sympy.exp(-2 * u) * fn.sigmoid(2 * u) ** 2
    base, power = factor.as_base_exp()
    if not (power.is_Integer and power != 0):
        return None
    u = _sigmoid_complement(base)
    if u is not None and power > 0:
        return sympy.exp(-power * u) * fn.sigmoid(u) ** power
    if isinstance(base, fn.sigmoid) and power > 0 and (-base.args[0]).is_nonnegative:
        return sympy.exp(power * base.args[0]) * fn.sigmoid(-base.args[0]) ** power
    if isinstance(base, sympy.cosh) and power < 0 and base.args[0].is_nonnegative:
        u = base.args[0]
        return 2 ** (-power) * sympy.exp(power * u) * fn.sigmoid(2 * u) ** (-power)
    return None


def exp_decaying(factors: list[Expr]) -> Expr | None:
    """exp(v) q times a factor that decays like exp(-w) -> exp(v - w) q times what is left of it.

    Note [decaying factors]
    ~~~~~~~~~~~~~~~~~~~~~~~
    For u >= 0, `1 - tanh(u)**2`, `1 - sigmoid(u)`, `sigmoid(-u)` and `1/cosh(u)` are 0 in float32
    past u = 88 or so, and a growing `exp(v)` beside them is inf not much later: TanhExp's slope
    `x exp(x) (1 - tanh(exp(x))**2)` is inf * 0 = NaN past x = 88, `sigmoid(exp(x))`'s
    `exp(x) sigmoid(exp(x)) (1 - sigmoid(exp(x)))` too, and `1/cosh(exp(x))`'s. Each is exactly
    `exp(-w) * rest` with `rest` between 0 and 1:

        1 - tanh(u)**2   = 4 exp(-2u) sigmoid(2u)**2
        (1 - sigmoid(u))**k = sigmoid(-u)**k = exp(-k u) sigmoid(u)**k
        cosh(u)**-k      = 2**k exp(-k u) sigmoid(2u)**k

    and SymPy joins `exp(v) exp(-w)` into `exp(v - w)`, which is 0 where the product is (TanhExp's
    `exp(x - 2 exp(x))`). Only where SymPy knows u >= 0 (`exp(x)`, `x**2 + c`, `abs(x)`,
    `softplus(x)`): for a negative u, exp(-w) is what overflows.
    """
    if not any(isinstance(f, sympy.exp) for f in factors):
        return None
    for factor in factors:
        form = _decaying(factor)
        if form is not None:
            return form * sympy.Mul(*[f for f in factors if f is not factor])
    return exp_into_sum(factors)


def exp_into_sum(factors: list[Expr]) -> Expr | None:
    """(a + b exp(v)) exp(u - k exp(t)) q -> (a exp(u - k exp(t)) + b exp(v + u - k exp(t))) q, k > 0.

    Note [sums beside a decaying exponential]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    The decaying factors of Note [decaying factors] leave an exponential that falls doubly fast
    beside a sum that grows: the slope of `exp(x) / (1 + exp(exp(x)))**2` holds
    `(1 - 2 exp(x)) exp(x - 2 exp(x))`, -inf * 0 = NaN in float32 past x = 88, where the exact
    value is 0. Multiplied into the sum, each growing term joins the exponential (the power rule
    of the next pass: `exp(x) exp(x - 2 exp(x)) = exp(2x - 2 exp(x))`), 0 there:
    `exp(x - 2 exp(x)) - 2 exp(2x - 2 exp(x))`. Only for an exponent with a term `-k exp(t)` and a
    sum with a term that holds an exponential; elsewhere the product is the cheaper form.
    """
    decaying = [f for f in factors if isinstance(f, sympy.exp) and any(map(_falls, sympy.Add.make_args(f.args[0])))]
    if not decaying:
        return None
    for factor in factors:
        if isinstance(factor, sympy.Add) and any(
            isinstance(f, sympy.exp) for t in factor.args for f in sympy.Mul.make_args(t)
        ):
            rest = [f for f in factors if f is not factor and f is not decaying[0]]
            return sympy.Mul(sympy.Add(*(sympy.Mul(t, decaying[0]) for t in factor.args)), *rest)
    return None


def _falls(term: Expr) -> bool:
    """`term` is `-k exp(t)`, k > 0 a number."""
    coeff, body = term.as_coeff_Mul()
    return bool(coeff.is_negative) and isinstance(body, sympy.exp)


def sinh_over_cosh(factors: list[Expr]) -> Expr | None:
    """sinh(u) cosh(u)**-k q -> tanh(u) cosh(u)**(1 - k) q: the derivative of `1/cosh(u)**m` is inf / inf
    in float32 past u = 89 (`sinh(x**2) / cosh(x**2)**3` at x = 10), where tanh(u) / cosh(u)**2 is 0."""
    for factor in factors:
        if not isinstance(factor, sympy.sinh):
            continue
        u = factor.args[0]
        for other in factors:
            base, power = other.as_base_exp()
            if base == sympy.cosh(u) and power.is_Integer and power < 0:
                rest = [f for f in factors if f is not factor and f is not other]
                return sympy.Mul(sympy.tanh(u), sympy.cosh(u) ** (power + 1), *rest)
    return None


def to_sinc(node: sympy.Mul) -> Expr | None:
    """sin(a) / a * q -> sinc(a / pi) * q, where the product divides by `a` and `q` does not."""
    for factor in node.args:
        if isinstance(factor, sympy.sin):
            a = factor.args[0]
            rest = node * a / factor
            if _divides_by(node, a) and not _divides_by(rest, a):
                return sinc(a / sympy.pi) * rest
    return None


def unsinc(expr: Expr) -> Expr:
    """`expr` with each sinc of a sum's term written back as `sin(a) / a` where that divides by nothing new.

    Note [sinc that buys nothing]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    `sin(a) / a -> sinc(a / pi)` keeps a term finite at a = 0; but where another term of the same
    sum divides by every base the quotient would, the sum is undefined there anyway, and
    torch.sinc costs a second sine and a select (snake's slope in `a`: `2 x**2 cos(ax) sinc(ax/pi)
    - sin(ax)**2 / a**2` is `(x sin(2ax) - sin(ax)**2 / a) / a`, with the sine of the other term).
    """
    if not expr.has(sinc):
        return expr
    if not isinstance(expr, sympy.Add):
        return expr.func(*(unsinc(a) if isinstance(a, Expr) else a for a in expr.args))
    terms = list(expr.args)
    for k, term in enumerate(terms):
        if not term.has(sinc):
            continue
        others = set().union(*(_divisors(t) for i, t in enumerate(terms) if i != k))
        plain = term.replace(lambda e: isinstance(e, sinc), _sin_over)
        if _divisors(plain) <= others:
            terms[k] = plain
    return sympy.Add(*terms)


def _sin_over(e: sinc) -> Expr:
    a = sympy.pi * e.args[0]
    return sympy.sin(a) / a


def _divisors(expr: sympy.Basic) -> set[sympy.Basic]:
    return {p.base for p in expr.atoms(sympy.Pow) if p.exp.is_negative}


def _divides_by(expr: sympy.Basic, a: Expr) -> bool:
    return any(p.exp.is_negative and p.base.free_symbols & a.free_symbols for p in expr.atoms(sympy.Pow))
