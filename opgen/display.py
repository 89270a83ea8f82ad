"""Formulas as people read them, for docstrings: `grad_y * sigmoid(x)`, `max(x, 0)`."""

from __future__ import annotations

import sympy
from sympy.printing.str import StrPrinter

from opgen import functions as fn
from opgen.tensor_print import TensorDisplay


class DisplayPrinter(TensorDisplay, StrPrinter):
    """SymPy's str printer with the spec's own function names and gradient names."""

    def __init__(self, names: dict[sympy.Symbol, str]) -> None:
        super().__init__({"order": None})
        self.names = names

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        return self.names.get(expr, expr.name)

    def _print_maximum(self, expr: fn.maximum) -> str:
        return f"max({self._print(expr.args[0])}, {self._print(expr.args[1])})"

    def _print_minimum(self, expr: fn.minimum) -> str:
        return f"min({self._print(expr.args[0])}, {self._print(expr.args[1])})"

    def _print_loggamma(self, expr: sympy.loggamma) -> str:
        return f"lgamma({self._print(expr.args[0])})"

    def _print_polygamma(self, expr: sympy.polygamma) -> str:
        order, arg = expr.args
        if order == 0:
            return f"digamma({self._print(arg)})"
        return f"polygamma({self._print(order)}, {self._print(arg)})"

    def _print_where(self, expr: fn.where) -> str:
        cond, a, b = expr.args
        if a == 1 and b == 0:
            return f"({self._print(cond)})"
        return f"where({self._print(cond)}, {self._print(a)}, {self._print(b)})"

    def _print_Abs(self, expr: sympy.Abs) -> str:
        return f"abs({self._print(expr.args[0])})"

    def _print_And(self, expr: sympy.And) -> str:
        return " & ".join(f"({self._print(a)})" for a in sorted(expr.args, key=sympy.default_sort_key))

    def _print_Or(self, expr: sympy.Or) -> str:
        return " | ".join(f"({self._print(a)})" for a in sorted(expr.args, key=sympy.default_sort_key))

    def _print_Not(self, expr: sympy.Not) -> str:
        return f"~({self._print(expr.args[0])})"

    def _print_Relational(self, expr: sympy.core.relational.Relational) -> str:
        return f"{self._print(expr.lhs)} {expr.rel_op} {self._print(expr.rhs)}"

    def _print_Exp1(self, expr: sympy.Expr) -> str:
        return "exp(1)"

    def _print_Pi(self, expr: sympy.Expr) -> str:
        return "pi"

    def _print_Infinity(self, expr: sympy.Expr) -> str:
        return "inf"


def display(expr: sympy.Basic, names: dict[sympy.Symbol, str]) -> str:
    return str(DisplayPrinter(names).doprint(expr))
