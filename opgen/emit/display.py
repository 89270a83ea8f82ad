"""Formulas as people read them, for docstrings: `grad_y * sigmoid(x)`, `max(x, 0)`.

Kernel nodes (opgen.nodes.kernels) show as the formulas they compute, and a fraction with a
shorter decimal as that decimal, as specs write it: `0.044715*x**3`, not `8943*x**3/200000`.
"""

from __future__ import annotations

import textwrap

import sympy
from sympy.printing.precedence import precedence
from sympy.printing.str import StrPrinter

from opgen.emit.tensor_print import TensorDisplay
from opgen.formula import functions as fn
from opgen.formula.aliases import ALIASES
from opgen.formula.vocabulary import ALL_FUNCTIONS
from opgen.nodes.base import Node, Shown
from opgen.nodes.kernels import KernelBackward, OutputBackward, Prime, Primitive


def _decimal(value: sympy.Rational) -> str | None:
    """`0.044715` for 8943/200000: a fraction's exact decimal, where it is shorter than `p/q`."""
    if value.is_Integer:
        return None
    text = repr(float(value))
    exact = "e" not in text and sympy.Rational(text) == value
    return text if exact and len(text) < len(f"{value.p}/{value.q}") else None


class DisplayPrinter(TensorDisplay, StrPrinter):
    """SymPy's str printer with the spec's own function names and gradient names; a node that brings its
    own spelling prints through its `_docstring` method (`printmethod`, Note [nodes] in opgen/nodes/base.py)."""

    printmethod = "_docstring"

    def __init__(self, names: dict[sympy.Symbol, str]) -> None:
        super().__init__({"order": None})
        self.names = names

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        return self.names.get(expr, expr.name)

    def _print_Rational(self, expr: sympy.Rational) -> str:
        return _decimal(expr) or str(super()._print_Rational(expr))

    def _print_Mul(self, expr: sympy.Mul) -> str:
        coeff, rest = expr.as_coeff_Mul()
        decimal = _decimal(abs(coeff)) if coeff.is_Rational else None
        if decimal is None or rest == 1:
            return str(super()._print_Mul(expr))
        return f"{'-' if coeff < 0 else ''}{decimal}*{self.parenthesize(rest, precedence(expr))}"

    def _print_maximum(self, expr: fn.maximum) -> str:
        return f"max({self._print(expr.args[0])}, {self._print(expr.args[1])})"

    def _print_minimum(self, expr: fn.minimum) -> str:
        return f"min({self._print(expr.args[0])}, {self._print(expr.args[1])})"

    def _print_Max(self, expr: sympy.Max) -> str:
        name = "max" if isinstance(expr, sympy.Max) else "min"
        return f"{name}({', '.join(self._print(a) for a in expr.args)})"

    _print_Min = _print_Max

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


def kernels_as_formulas(expr: sympy.Basic) -> sympy.Basic:
    """`expr` with each kernel node as the formula it computes."""
    if expr.has(KernelBackward, OutputBackward, Prime):  # `has` reads the tree; `replace` rebuilds it
        expr = expr.replace(lambda e: isinstance(e, (KernelBackward, OutputBackward, Prime)), lambda e: e.elementary())
    if not expr.has(Primitive):
        return expr
    return expr.replace(lambda e: isinstance(e, Primitive), lambda e: e.elementary())


def unguarded(expr: sympy.Basic, known: frozenset[sympy.Basic] = frozenset()) -> sympy.Basic:
    """`expr` with each `where` whose condition holds where it stands as the branch it takes:
    `where(abs(x) < 0.0001, p, q(where(abs(x) >= 0.0001, x, 1)))` shows as `... q(x)`. A reader
    sees the formula; its guards (Note [double where] in opgen/derive/guard.py) are in the code."""
    if not expr.has(fn.where):
        return expr
    if isinstance(expr, fn.where):
        cond, a, b = expr.args
        if cond in known:
            return unguarded(a, known)
        if sympy.Not(cond) in known:
            return unguarded(b, known)
        return fn.where(cond, unguarded(a, known | {cond}), unguarded(b, known | {sympy.Not(cond)}))
    return expr.func(*(unguarded(arg, known) for arg in expr.args))


_WORDS = frozenset({*ALL_FUNCTIONS, *ALIASES})


def _written_out(expr: sympy.Basic) -> sympy.Basic:
    """`expr` with each node a spec could not write (a stable rewrite's `sinc`, a saved `Rstd`) as the formula
    it computes, in the language: a node that brings no spelling of its own for docstrings, written out
    before printing, gets the parentheses its formula needs (`w/sqrt(v)**3`, not `w*1/sqrt(v)**3`)."""

    def plain(e: sympy.Basic) -> bool:
        if isinstance(e, Shown):
            return type(e)._docstring is Shown._docstring
        return isinstance(e, Node) and type(e).__name__ not in _WORDS and type(e).elementary is not Node.elementary

    return expr.replace(plain, lambda e: e.elementary()) if expr.find(plain) else expr


def display(expr: sympy.Basic, names: dict[sympy.Symbol, str]) -> str:
    return str(DisplayPrinter(names).doprint(unguarded(_written_out(kernels_as_formulas(expr)))))


def display_lines(target: str, expr: sympy.Basic, names: dict[sympy.Symbol, str], width: int) -> list[str]:
    """`target = formula`, wrapped at spaces to `width`; continuation lines indented four more."""
    lead = target[: len(target) - len(target.lstrip())]
    return textwrap.wrap(
        f"{target.strip()} = {display(expr, names)}",
        width=width,
        initial_indent=lead,
        subsequent_indent=lead + "    ",
        break_long_words=False,
        break_on_hyphens=False,
    )
