"""torch.special's functions of the normal distribution: `erfcx`, `log_ndtr`, `ndtri`.

Note [normal distribution functions]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Written from their definitions they overflow or round away in float32 where their values are plain
numbers: `exp(x**2) * erfc(x)` is inf * 0 at x = 30 (0.0188), `log(0.5 * erfc(-x / sqrt(2)))` is
log(0) at x = -1e4 (-5e7), `sqrt(2) * erfinv(2*p - 1)` is erfinv(-1) = -inf at p = 1e-30 (-11.4).
torch.special computes each without that. They are words of the formula language, and the stable
rewrites (Note [stable rewrites] in opgen/optimize/rewrite.py) find them written out:

    exp(v) * erfc(u)      -> exp(v - u**2) * erfcx(u)      (where v - u**2 is simpler than v)
    log(m erfc(u))        -> log(2 m) + log_ndtr(-sqrt(2) u)   (also m (2 - erfc(w)), SymPy's erfc(-w))
    erfinv(v)             -> ndtri((1 + v) / 2) / sqrt(2)  (where (1 + v) / 2 is simpler than v)

Their derivatives, each finite where the function is:

    erfcx'(u)    = 2 u erfcx(u) - 2 / sqrt(pi)
    log_ndtr'(u) = sqrt(2 / pi) / erfcx(-u / sqrt(2))       (phi(u) / Phi(u), no exp(-u**2/2) / 0; for
                                                            u > 0 exp(-u**2/2 - log_ndtr(u)) / sqrt(2 pi))
    ndtri'(p)    = sqrt(2 pi) exp(ndtri(p)**2 / 2)

Their exact values (the mpmath oracle, digits) are the definitions at 50 digits.
"""

from __future__ import annotations

import sympy
from sympy import Expr

from opgen.formula import functions as fn
from opgen.nodes.bessel import TorchSpecial


class erfcx(TorchSpecial):  # noqa: N801 - prints as torch's name
    """exp(u**2) erfc(u), positive."""

    def fdiff(self, argindex: int = 1) -> Expr:
        u = self.args[0]
        return 2 * u * self - 2 / sympy.sqrt(sympy.pi)

    def _eval_is_positive(self) -> bool | None:
        return self.args[0].is_extended_real

    def elementary(self) -> Expr:
        u = self.args[0]
        return sympy.exp(u**2) * sympy.erfc(u)


class log_ndtr(TorchSpecial):  # noqa: N801
    """log of the standard normal distribution function, log(erfc(-u / sqrt(2)) / 2)."""

    def fdiff(self, argindex: int = 1) -> Expr:
        """phi(u) / Phi(u): `sqrt(2/pi) / erfcx(-u/sqrt(2))` for u <= 0, where erfcx is at most 1, and
        `exp(-u**2/2 - log_ndtr(u)) / sqrt(2 pi)` for u > 0, where erfcx(-u/sqrt(2)) overflows and
        log_ndtr(u) is small; each branch reads u clamped to its side, so the branch not taken stays
        finite under the derivative of the derivative (Note [double where] in opgen/derive/guard.py)."""
        u = self.args[0]
        right = sympy.StrictGreaterThan(u, 0)
        pos, neg = fn.where(right, u, sympy.S.Zero), fn.where(right, sympy.S.Zero, u)
        above = sympy.exp(-(pos**2) / 2 - log_ndtr(pos)) / sympy.sqrt(2 * sympy.pi)
        return fn.where(right, above, sympy.sqrt(2 / sympy.pi) / erfcx(-neg / sympy.sqrt(2)))

    def elementary(self) -> Expr:
        return sympy.log(sympy.erfc(-self.args[0] / sympy.sqrt(2)) / 2)


class ndtri(TorchSpecial):  # noqa: N801
    """The standard normal distribution's quantile function, sqrt(2) erfinv(2 p - 1)."""

    def fdiff(self, argindex: int = 1) -> Expr:
        return sympy.sqrt(2 * sympy.pi) * sympy.exp(self**2 / 2)

    def elementary(self) -> Expr:
        return sympy.sqrt(2) * sympy.erfinv(2 * self.args[0] - 1)


NORMAL: dict[str, type[TorchSpecial]] = {"erfcx": erfcx, "log_ndtr": log_ndtr, "ndtri": ndtri}


def erfc_times_exp(factors: list[Expr]) -> Expr | None:
    """`exp(v) erfc(u) q` -> `exp(v - u**2) erfcx(u) q` where that exponent is simpler (Note [normal
    distribution functions])."""
    for factor in factors:
        if not isinstance(factor, sympy.erfc):
            continue
        u = factor.args[0]
        for other in factors:
            if isinstance(other, sympy.exp):
                left = sympy.expand(other.args[0] - u**2)
                if sympy.count_ops(left) < sympy.count_ops(other.args[0]):
                    rest = [f for f in factors if f is not factor and f is not other]
                    return sympy.Mul(sympy.exp(left), erfcx(u), *rest)
    return None


def log_erfc(arg: Expr) -> Expr | None:
    """log(m erfc(u)) = log(2 m) + log_ndtr(-sqrt(2) u), m > 0; SymPy writes `erfc(-w)` as `2 - erfc(w)`,
    so `m (2 - erfc(w))` is taken as `m erfc(-w)` too."""
    m, body = arg.as_coeff_Mul()
    if isinstance(body, sympy.erfc) and m.is_positive:
        return sympy.log(2 * m) + log_ndtr(-sympy.sqrt(2) * body.args[0])
    if not isinstance(arg, sympy.Add) or len(arg.args) != 2:
        return None
    constant, term = arg.as_coeff_Add()
    m, body = term.as_coeff_Mul()
    if isinstance(body, sympy.erfc) and m.is_negative and constant == -2 * m:
        return sympy.log(-2 * m) + log_ndtr(sympy.sqrt(2) * body.args[0])
    return None


def quantile(node: sympy.erfinv) -> Expr | None:
    """erfinv(v) -> ndtri((1 + v) / 2) / sqrt(2) where (1 + v) / 2 is simpler than v."""
    v = node.args[0]
    p = sympy.expand((1 + v) / 2)
    if sympy.count_ops(p) >= sympy.count_ops(v):
        return None
    return ndtri(p) / sympy.sqrt(2)
