"""The functions the stable rewrites introduce (opgen/optimize/rewrite.py, Note [stable rewrites]).

Each is a SymPy function with its exact derivative (`fdiff`) and its value in elementary functions
(`elementary`, for evaluation at many digits); the torch printer prints it as PyTorch's kernel
or, where PyTorch has none, as its `stable_form()` (Note [printed stable forms] in
opgen/emit/statements.py).
"""

from __future__ import annotations

import sympy
from sympy import Expr

from opgen.formula import functions as fn
from opgen.nodes.base import Node


class logsigmoid(fn._Elementwise):  # noqa: N801 - prints as torch's name
    """log(sigmoid(u)) = -softplus(-u)."""

    def fdiff(self, argindex: int = 1) -> Expr:
        return fn.sigmoid(-self.args[0])

    def elementary(self) -> Expr:
        return -sympy.log(1 + sympy.exp(-self.args[0]))


class logcosh(fn._Elementwise):  # noqa: N801
    """log(cosh(u)), printed as `|u| + softplus(-2|u|) - log(2)`, which cannot overflow (opgen.emit.kernel_print).

    Its derivative is tanh(u), as plain autograd's of log(cosh(u)): 0 at u = 0, where the
    printed form has a kink whose derivative would be sign(u) * (1 - 2 sigmoid(-2|u|)).
    """

    def fdiff(self, argindex: int = 1) -> Expr:
        return sympy.tanh(self.args[0])

    def stable_form(self) -> Expr:
        """What forward computes: `|u| + softplus(-2|u|) - log(2)`, and below |u| = 1, where that
        cancels, `log1p(2 sinh(u/2)**2)` (Note [printed stable forms] in opgen/emit/statements.py)."""
        u = self.args[0]
        size = sympy.Abs(u)
        small = fn.log1p(2 * sympy.sinh(u / 2) ** 2)
        return fn.where(sympy.StrictLessThan(size, 1), small, size + fn.softplus(-2 * size) - sympy.log(2))

    def elementary(self) -> Expr:
        return sympy.log(sympy.cosh(self.args[0]))


class log1mexp(fn._Elementwise):  # noqa: N801
    """log(1 - exp(u)) for u < 0 (Mächler, "Accurately computing log(1 - exp(-|a|))"), printed as
    `log(-expm1(u))` above u = -log(2), where `1 - exp(u)` cancels, and `log1p(-exp(u))` below it,
    where `expm1(u)` rounds to -1. Its derivative is -1 / expm1(-u), finite away from u = 0."""

    def fdiff(self, argindex: int = 1) -> Expr:
        return -1 / fn.expm1(-self.args[0])

    def stable_form(self) -> Expr:
        """Note [printed stable forms] in opgen/emit/statements.py."""
        u = self.args[0]
        near = sympy.log(-fn.expm1(u))
        return fn.where(sympy.StrictGreaterThan(u, -sympy.log(2)), near, fn.log1p(-sympy.exp(u)))

    def elementary(self) -> Expr:
        return sympy.log(1 - sympy.exp(self.args[0]))


class _Binary(Node, sympy.Function):
    """A function of two arguments; the torch printer prints it as `torch.<name>` (opgen.emit.kernel_print)."""

    nargs = 2
    is_real = True

    def _eval_evalf(self, prec: int) -> Expr | None:
        if all(a.is_number for a in self.args):
            return self.elementary().evalf(prec)
        return None


class logaddexp(_Binary):  # noqa: N801
    """log(exp(a) + exp(b))."""

    def fdiff(self, argindex: int = 1) -> Expr:
        a, b = self.args
        return fn.sigmoid(a - b) if argindex == 1 else fn.sigmoid(b - a)

    def elementary(self) -> Expr:
        a, b = self.args
        return sympy.log(sympy.exp(a) + sympy.exp(b))


class hypot(_Binary):  # noqa: N801
    """sqrt(a**2 + b**2)."""

    root_of_squares = True  # a square root to the conjugate form (Note [conjugate form])

    def fdiff(self, argindex: int = 1) -> Expr:
        return self.args[argindex - 1] / self

    def elementary(self) -> Expr:
        a, b = self.args
        return sympy.sqrt(a**2 + b**2)
