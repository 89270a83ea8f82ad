"""Integer parts and remainders: `trunc(x)`, `fmod(a, b)` and `a % b` (`torch.remainder`), as PyTorch has them.

Note [integer parts]
~~~~~~~~~~~~~~~~~~~~
`trunc(x)` rounds toward zero; like `floor`, a step: its gradient is 0 everywhere (PyTorch's). `frac(x)`
is `x - trunc(x)` (opgen.formula.words), gradient 1, as `torch.frac`'s.

`a % b` is `torch.remainder`, Python's remainder: the sign of `b`, `a - b * floor(a / b)`; `fmod(a, b)`
is C's, the sign of `a`, `a - b * trunc(a / b)`. Their derivatives are PyTorch's backward formulas:

    d/da = 1        d/db = -floor(a / b) (remainder)      -trunc(a / b) (fmod)

of differentiable torch ops (a step's derivative is 0), so a gradient of any order is one. Each prints as
its torch function, of two plain numbers as Python's `%` and `math.fmod`; its exact value (the mpmath
oracle) is the formula above.
"""

from __future__ import annotations

import math

import sympy
from sympy import Expr, Function, S

from opgen.formula import functions as fn
from opgen.nodes.base import Printer, Shown, Spelled, TorchCode


class trunc(Spelled, Shown, fn.Step):  # noqa: N801 - prints as torch's name
    """Toward zero: floor of a positive number, ceil of a negative one."""

    @staticmethod
    def _value(x: float) -> float:
        return float(math.trunc(x))

    def elementary(self) -> Expr:
        x = self.args[0]
        return fn.where(sympy.GreaterThan(x, 0), fn.floor(x), fn.ceil(x))

    def _torch(self, printer: TorchCode) -> str:
        arg = self.args[0]
        if not printer.is_tensor(arg):
            return f"float({printer.math}.trunc({printer._print(arg)}))"
        return f"{printer.torch}.trunc({printer._print(arg)})"

    def _docstring(self, printer: Printer) -> str:
        return f"trunc({printer._print(self.args[0])})"

    def _mpmathcode(self, printer: Printer) -> str:
        return f"({printer._print(self.elementary())})"


class _Remainder(Spelled, Shown, Function):
    """`a - b * step(a / b)`: the remainder of a division whose quotient `step` rounds."""

    nargs = 2
    is_real = True
    torch_name = ""

    @staticmethod
    def step(quotient: Expr) -> Expr:
        raise NotImplementedError

    @staticmethod
    def whole(quotient: sympy.Rational) -> Expr:
        """`step` of a rational number, exactly."""
        raise NotImplementedError

    @classmethod
    def eval(cls, a: Expr, b: Expr) -> Expr | None:
        if a.is_Rational and b.is_Rational and b != 0:  # exact: `7 % 2` is 1
            return a - b * cls.whole(a / b)
        return None

    def fdiff(self, argindex: int = 1) -> Expr:
        a, b = self.args
        return S.One if argindex == 1 else -self.step(a / b)

    def elementary(self) -> Expr:
        a, b = self.args
        return a - b * self.step(a / b)

    def _eval_evalf(self, prec: int) -> Expr | None:
        if all(arg.is_number for arg in self.args):
            return self.elementary().evalf(prec)
        return None

    def _torch(self, printer: TorchCode) -> str:
        a, b = self.args
        if not printer.is_tensor(self):
            return self._number_code(printer)
        first = printer._print(a) if printer.is_tensor(a) else printer._as_tensor(a, b)
        return f"{printer.torch}.{self.torch_name}({first}, {printer._print(b)})"

    def _number_code(self, printer: TorchCode) -> str:
        raise NotImplementedError

    def _docstring(self, printer: Printer) -> str:
        a, b = (printer._print(arg) for arg in self.args)
        return f"{type(self).__name__}({a}, {b})"

    def _mpmathcode(self, printer: Printer) -> str:
        return f"({printer._print(self.elementary())})"


class remainder(_Remainder):  # noqa: N801
    """`a % b`: the sign of `b`, as Python's `%` and `torch.remainder`."""

    torch_name = "remainder"

    @staticmethod
    def step(quotient: Expr) -> Expr:
        return fn.floor(quotient)

    @staticmethod
    def whole(quotient: sympy.Rational) -> Expr:
        return sympy.floor(quotient)

    def _number_code(self, printer: TorchCode) -> str:
        a, b = (printer._print(arg) for arg in self.args)
        return f"(({a}) % ({b}))"


class fmod(_Remainder):  # noqa: N801
    """`fmod(a, b)`: the sign of `a`, as C's fmod and `torch.fmod`."""

    torch_name = "fmod"

    @staticmethod
    def step(quotient: Expr) -> Expr:
        return trunc(quotient)

    @staticmethod
    def whole(quotient: sympy.Rational) -> Expr:
        return sympy.Integer(int(quotient))

    def _number_code(self, printer: TorchCode) -> str:
        a, b = (printer._print(arg) for arg in self.args)
        return f"{printer.math}.fmod({a}, {b})"


REMAINDERS: dict[str, type[_Remainder]] = {"remainder": remainder, "fmod": fmod}
