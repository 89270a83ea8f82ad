"""The inline stop-gradient `stop_gradient(e)` (also `detach(e)`): the value of `e`, no gradient through it.

Note [stop-gradient]
~~~~~~~~~~~~~~~~~~~~
Papers stop a gradient part-way through a formula: the straight-through estimator
`x + stop_gradient(round(x) - x)` has the value `round(x)` and the gradient of `x`, a target
term `(y - stop_gradient(t))**2` moves `y` alone. The node is the identity for values and has a
zero derivative (`fdiff`), so SymPy's derivatives of every order, and forward mode's tangents,
leave out every path through it; its shape is its argument's. Printed, a tensor argument is
`(e).detach()`: where a gradient formula keeps the node (`x * stop_gradient(v)` has the gradient
`grad * stop_gradient(v)`), autograd's differentiation of backward, for double backward, stops
there too, as the zero derivative says. Of plain numbers it is the number itself. The reference
of the generated tests is `torch.detach` of the formula written in plain torch, its exact value
(the mpmath oracle, `_mpmathcode`) its argument's.
"""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn
from opgen.nodes.base import Printer, Shown, Spelled, TorchCode


class stop_gradient(Spelled, Shown, fn.Elementwise):  # noqa: N801 - prints as the spec's name
    """The value of its argument; its derivative is 0 (Note [stop-gradient])."""

    @classmethod
    def eval(cls, arg: Expr) -> Expr | None:
        if arg.is_number:
            return arg  # a constant has no gradient to stop
        if isinstance(arg, stop_gradient):
            return arg
        return None

    def fdiff(self, argindex: int = 1) -> Expr:
        return S.Zero

    def _eval_is_real(self) -> bool | None:
        return self.args[0].is_real

    def _eval_is_positive(self) -> bool | None:
        return self.args[0].is_positive

    def _eval_is_nonnegative(self) -> bool | None:
        return self.args[0].is_nonnegative

    def _eval_is_integer(self) -> bool | None:
        return self.args[0].is_integer

    def elementary(self) -> Expr:
        return self.args[0]

    def _torch(self, printer: TorchCode) -> str:
        arg = self.args[0]
        if not printer.is_tensor(arg):
            return printer._print(arg)
        return f"{printer._postfix(arg)}.detach()"

    def _mpmathcode(self, printer: Printer) -> str:
        """The exact value, for the accuracy tests' mpmath oracle (opgen.plan.extremes): its argument's."""
        return printer._print(self.args[0])

    def _docstring(self, printer: Printer) -> str:
        return f"stop_gradient({printer._print(self.args[0])})"


def without_stops(expr: sympy.Basic) -> sympy.Basic:
    """`expr` with every stop-gradient replaced by its argument: the same value."""
    if not expr.has(stop_gradient):
        return expr
    return expr.replace(lambda e: isinstance(e, stop_gradient), lambda e: e.args[0])
