"""The modified Bessel functions of the first kind `i0`, `i1` and their scaled forms `i0e`, `i1e`, as torch.special.

Note [modified Bessel functions]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
`i0(x)` and `i1(x)` are I_0 and I_1; `i0e(x) = exp(-|x|) i0(x)` and `i1e(x) = exp(-|x|) i1(x)` do not
overflow (a von Mises likelihood's `log(i0(kappa))` is `log(i0e(kappa)) + kappa`, finite at any
kappa). Their derivatives, as torch.special's backward formulas have them:

    i0'  = i1                      i1'  = i0 - i1 / x                 (1/2 at x = 0)
    i0e' = i1e - sign(x) i0e       i1e' = i0e - i1e * (sign(x) + 1/x)  (1/2 at x = 0)

The quotients `i1(x) / x` and `i1e(x) / x` are 0/0 at x = 0, where their limit is 1/2; they are
written `where(x == 0, 1/2, i1(x) / where(x == 0, 1, x))`, the divisor guarded too, so that the
derivative of the derivative stays finite there (Note [double where] in opgen/derive/guard.py), as
`sinc`'s is. `i0e` and `i1e` have a kink at 0 (through `|x|`): their slope there takes
`sign(0) = 0`, as torch's. Each prints as `torch.special.<name>`, of plain numbers as that function
of a float64 scalar; its exact value (the mpmath oracle, digits) is mpmath's `besseli`.
"""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn
from opgen.nodes.base import Printer, Shown, Spelled, TorchCode


def over_x(value: Expr, x: Expr) -> Expr:
    """`value / x` for a `value` that is x/2 + O(x**3) near 0: 1/2 at x = 0 (Note [modified Bessel functions])."""
    at_zero = sympy.Eq(x, 0)
    return fn.where(at_zero, S.Half, value / fn.where(at_zero, S.One, x))


class TorchSpecial(Spelled, Shown, fn.Elementwise):
    """One of torch.special's functions (the modified Bessel functions here): `torch.special.<name>`."""

    def _torch(self, printer: TorchCode) -> str:
        name = f"{printer.torch}.special.{type(self).__name__}"
        arg = printer._print(self.args[0])
        if not printer.is_tensor(self.args[0]):
            return f"{name}({printer.torch}.tensor({arg}, dtype={printer.torch}.float64)).item()"
        return f"{name}({arg})"

    def _docstring(self, printer: Printer) -> str:
        return f"{type(self).__name__}({printer._print(self.args[0])})"

    def _mpmathcode(self, printer: Printer) -> str:
        """The exact value, for the accuracy tests' mpmath oracle (opgen.plan.extremes); in parentheses, as the
        printer puts none around a function's spelling (`i0e(x)**2` is not `exp(-abs(x))*besseli(0, x)**2`)."""
        return f"({printer._print(self.elementary())})"


class i0(TorchSpecial):  # noqa: N801 - prints as torch's name
    """I_0, even, 1 at 0."""

    def fdiff(self, argindex: int = 1) -> Expr:
        return i1(self.args[0])

    def _eval_is_positive(self) -> bool | None:
        return self.args[0].is_extended_real

    def elementary(self) -> Expr:
        return sympy.besseli(0, self.args[0])


class i1(TorchSpecial):  # noqa: N801
    """I_1, odd, 0 at 0."""

    def fdiff(self, argindex: int = 1) -> Expr:
        x = self.args[0]
        return i0(x) - over_x(self, x)

    def elementary(self) -> Expr:
        return sympy.besseli(1, self.args[0])


class i0e(TorchSpecial):  # noqa: N801
    """exp(-|x|) I_0(x)."""

    def fdiff(self, argindex: int = 1) -> Expr:
        x = self.args[0]
        return i1e(x) - fn.sign(x) * self

    def _eval_is_positive(self) -> bool | None:
        return self.args[0].is_extended_real

    def elementary(self) -> Expr:
        x = self.args[0]
        return sympy.exp(-sympy.Abs(x)) * sympy.besseli(0, x)


class i1e(TorchSpecial):  # noqa: N801
    """exp(-|x|) I_1(x)."""

    def fdiff(self, argindex: int = 1) -> Expr:
        x = self.args[0]
        return i0e(x) - fn.sign(x) * self - over_x(self, x)

    def elementary(self) -> Expr:
        x = self.args[0]
        return sympy.exp(-sympy.Abs(x)) * sympy.besseli(1, x)


BESSEL: dict[str, type[TorchSpecial]] = {"i0": i0, "i0e": i0e, "i1": i1, "i1e": i1e}
