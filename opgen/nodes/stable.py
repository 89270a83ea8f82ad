"""The functions the stable rewrites introduce (opgen/optimize/rewrite.py, Note [stable rewrites]).

Each is a SymPy function with its exact derivative (`fdiff`), its value in elementary functions
(`elementary`, for evaluation at many digits) and its torch spelling (`_torch`): PyTorch's kernel
or, where PyTorch has none, its `stable_form()` (Note [printed stable forms] in
opgen/plan/blocks.py). Of plain numbers (Note [numbers and tensors] in opgen.formula.kinds)
each prints in a stable `math` form. Docstrings show them by name where the formula language
has it, else as their formula.
"""

from __future__ import annotations

import sympy
from sympy import Expr

from opgen.formula import functions as fn
from opgen.nodes.base import Spelled, TorchCode


class logsigmoid(Spelled, fn.Elementwise):  # noqa: N801 - prints as torch's name
    """log(sigmoid(u)) = -softplus(-u)."""

    def fdiff(self, argindex: int = 1) -> Expr:
        return fn.sigmoid(-self.args[0])

    def _torch(self, printer: TorchCode) -> str:
        if not printer.is_tensor(self):  # an atom in its parent
            return f"({printer._print(-fn.softplus(-self.args[0]))})"
        return f"{printer.functional}.logsigmoid({printer._print(self.args[0])})"

    def elementary(self) -> Expr:
        return -sympy.log(1 + sympy.exp(-self.args[0]))


class logcosh(Spelled, fn.Elementwise):  # noqa: N801
    """log(cosh(u)), printed as `|u| + softplus(-2|u|) - log(2)`, which cannot overflow.

    Its derivative is tanh(u), as plain autograd's of log(cosh(u)): 0 at u = 0, where the
    printed form has a kink whose derivative would be sign(u) * (1 - 2 sigmoid(-2|u|)).
    """

    def fdiff(self, argindex: int = 1) -> Expr:
        return sympy.tanh(self.args[0])

    def stable_form(self) -> Expr:
        """What forward computes: `|u| + softplus(-2|u|) - log(2)`, and below |u| = 1, where that
        cancels, `log1p(2 sinh(u/2)**2)` (Note [printed stable forms] in opgen/plan/blocks.py)."""
        u = self.args[0]
        size = sympy.Abs(u)
        small = fn.log1p(2 * sympy.sinh(u / 2) ** 2)
        return fn.where(sympy.StrictLessThan(size, 1), small, size + fn.softplus(-2 * size) - sympy.log(2))

    def _torch(self, printer: TorchCode) -> str:
        return printer._print(self.stable_form())  # Note [printed stable forms] in opgen/plan/blocks.py

    def elementary(self) -> Expr:
        return sympy.log(sympy.cosh(self.args[0]))


class log1mexp(Spelled, fn.Elementwise):  # noqa: N801
    """log(1 - exp(u)) for u < 0 (Mächler, "Accurately computing log(1 - exp(-|a|))"), printed as
    `log(-expm1(u))` above u = -log(2), where `1 - exp(u)` cancels, and `log1p(-exp(u))` below it,
    where `expm1(u)` rounds to -1. Its derivative is -1 / expm1(-u), finite away from u = 0."""

    def fdiff(self, argindex: int = 1) -> Expr:
        return -1 / fn.expm1(-self.args[0])

    def stable_form(self) -> Expr:
        """Note [printed stable forms] in opgen/plan/blocks.py."""
        u = self.args[0]
        near = sympy.log(-fn.expm1(u))
        return fn.where(sympy.StrictGreaterThan(u, -sympy.log(2)), near, fn.log1p(-sympy.exp(u)))

    def _torch(self, printer: TorchCode) -> str:
        return printer._print(self.stable_form())  # Note [printed stable forms] in opgen/plan/blocks.py

    def elementary(self) -> Expr:
        return sympy.log(1 - sympy.exp(self.args[0]))


class _Binary(Spelled, sympy.Function):
    """A function of two arguments; of tensors it prints as `torch.<name>`."""

    nargs = 2
    is_real = True

    def _eval_evalf(self, prec: int) -> Expr | None:
        if all(a.is_number for a in self.args):
            return self.elementary().evalf(prec)
        return None

    def _of_tensors(self, printer: TorchCode) -> str:
        """`torch.<name>(a, b)`, a number among them as a tensor: torch takes no number there."""
        a, b = self.args
        name = f"{printer.torch}.{type(self).__name__}"
        if not printer.is_tensor(a):
            return f"{name}({printer._as_tensor(a, b)}, {printer._print(b)})"
        if not printer.is_tensor(b):
            return f"{name}({printer._print(a)}, {printer._as_tensor(b, a)})"
        return f"{name}({printer._print(a)}, {printer._print(b)})"


class logaddexp(_Binary):  # noqa: N801
    """log(exp(a) + exp(b))."""

    def fdiff(self, argindex: int = 1) -> Expr:
        a, b = self.args
        return fn.sigmoid(a - b) if argindex == 1 else fn.sigmoid(b - a)

    def _torch(self, printer: TorchCode) -> str:
        if not printer.is_tensor(self):
            a, b = self.args
            larger = fn.where(sympy.GreaterThan(a, b), a, b)
            return f"({printer._print(larger + fn.log1p(sympy.exp(-sympy.Abs(a - b))))})"
        return self._of_tensors(printer)

    def elementary(self) -> Expr:
        a, b = self.args
        return sympy.log(sympy.exp(a) + sympy.exp(b))


class hypot(_Binary):  # noqa: N801
    """sqrt(a**2 + b**2)."""

    def fdiff(self, argindex: int = 1) -> Expr:
        return self.args[argindex - 1] / self

    def _torch(self, printer: TorchCode) -> str:
        if not printer.is_tensor(self):
            return f"{printer.math}.hypot({', '.join(printer._print(a) for a in self.args)})"
        return self._of_tensors(printer)

    def elementary(self) -> Expr:
        a, b = self.args
        return sympy.sqrt(a**2 + b**2)
