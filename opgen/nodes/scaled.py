"""`scaled(u, d)`: `u` divided by its largest absolute entry along `d`, held constant for gradients.

Note [scaled vectors]
~~~~~~~~~~~~~~~~~~~~~
The vectors of a scale-free ratio (Note [scale-free ratios] in opgen.optimize.scales) are divided by
their largest entry first. Written as `u * stop_gradient(amax(abs(u)))**-1`, SymPy's derivative
multiplies that scale with the scale the chain rule brings, `u * s**-2`, which overflows (s = 1e20)
or underflows (s = 1e-25) in float32 where `(u/s)/s` does not. As a node, the scaled vector stays
one value in every derivative: its derivative is `1/s` (diagonal: the scale is a stop-gradient), so
each gradient is the bounded ratio's own times `1/s`.
"""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn
from opgen.formula.tensor import ReduceAmax
from opgen.nodes.base import Printer, Shown, Spelled, TorchCode
from opgen.nodes.stop_gradient import stop_gradient


class scaled(Spelled, Shown, fn.Elementwise):  # noqa: N801 - named as the stable forms are
    """`u / stop_gradient(amax(abs(u), d, keepdim=true))` (Note [scaled vectors])."""

    nargs = 2

    def scale(self) -> Expr:
        u, dim = self.args
        return stop_gradient(ReduceAmax(sympy.Abs(u), dim, S.One))

    def fdiff(self, argindex: int = 1) -> Expr:
        return 1 / self.scale() if argindex == 1 else S.Zero

    def elementary(self) -> Expr:
        return self.args[0] / self.scale()

    def _torch(self, printer: TorchCode) -> str:
        return printer._print(self.elementary())

    def _mpmathcode(self, printer: Printer) -> str:
        return printer._print(self.elementary())

    def _docstring(self, printer: Printer) -> str:
        return f"scaled({printer._print(self.args[0])}, {self.args[1]})"
