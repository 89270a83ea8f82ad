"""Printing the functions of two arguments `xlogy`, `xlog1py` and the normalised `sinc` as torch code.

`FunctionPrinting` is mixed into `TorchPrinter`: one `_print_<function>` method each, for functions
of the formula language (opgen.formula.functions) and of the stable rewrites (opgen.optimize.product_rules)
that bring no spelling of their own (the node families of opgen.nodes do: Note [nodes]). Of plain
numbers (Note [numbers and tensors] in opgen.formula.kinds) each prints in a stable `math` form.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sympy

from opgen.formula import functions as fn


class FunctionPrinting:
    """`torch.xlogy(x, y)`, `torch.special.xlog1py(x, y)`, `torch.sinc(u)`."""

    if TYPE_CHECKING:  # provided by TorchPrinter
        torch: str

        def _print(self, expr: Any, **kwargs: Any) -> str: ...

        def _call(self, name: str, *args: sympy.Basic) -> str: ...

        def is_tensor(self, expr: sympy.Basic) -> bool: ...

        def _as_tensor(self, value: sympy.Basic, like: sympy.Basic) -> str: ...

    def _print_xlogy(self, expr: fn.xlogy) -> str:
        x, y = expr.args
        if not self.is_tensor(expr):  # numbers: 0 where x is 0, as torch.xlogy
            return self._number_form(fn.where(sympy.Eq(x, 0), sympy.S.Zero, x * sympy.log(y)))
        y_text = self._print(y) if self.is_tensor(y) else self._as_tensor(y, x)  # torch.xlogy takes no number second
        return f"{self.torch}.xlogy({self._print(x)}, {y_text})"

    def _print_xlog1py(self, expr: fn.xlog1py) -> str:
        x, y = expr.args
        if not self.is_tensor(expr):  # numbers: 0 where x is 0, as torch.special.xlog1py
            return self._number_form(fn.where(sympy.Eq(x, 0), sympy.S.Zero, x * fn.log1p(y)))
        y_text = self._print(y) if self.is_tensor(y) else self._as_tensor(y, x)
        return f"{self.torch}.special.xlog1py({self._print(x)}, {y_text})"

    def _number_form(self, form: sympy.Basic) -> str:
        """`form` standing where the call was: in parentheses unless it is one name, number or call
        (`n / xlogy(K, n)` is `n / (K * math.log(n))`, not `n / K * math.log(n)`)."""
        text = self._print(form)
        return text if form.is_Atom or (form.is_Function and not isinstance(form, fn.where)) else f"({text})"

    def _print_sinc(self, expr: sympy.Function) -> str:
        u = expr.args[0]
        if not self.is_tensor(expr):
            return self._print(fn.where(sympy.Eq(u, 0), sympy.S.One, sympy.sin(sympy.pi * u) / (sympy.pi * u)))
        return self._call(f"{self.torch}.sinc", u)
