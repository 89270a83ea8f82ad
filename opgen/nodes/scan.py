"""Scans along a named dimension: `cumsum(x, dim)`, as torch.cumsum.

Note [scans]
~~~~~~~~~~~~
`cumsum(x, dim=-1)` is `torch.cumsum(x, -1)`: entry i is the sum of the entries 0..i along `dim`, the
operand's shape kept. `dim` is a whole-number literal naming one of the operand's declared dimensions
(`Tensor[..., N]`: -1; counted from the front only without a batch `...`); it is kept counted from the
end, so that a batch of any depth in front leaves it the same.

It is linear: its tangent is the cumsum of the tangent, and the gradient of its operand the reversed
cumsum of the gradient (entry i the sum of the gradient's entries i..N-1: `flip(cumsum(flip(g)))`), a
differentiable torch op, so double backward, torch.func and torch.compile take it as any other. A
gradient narrower than the node (constant along a dimension: the scalar gradient of `sum(cumsum(x,
dim=-1))`) is expanded to the operand first: the node then carries the operand as its last argument
(`g.expand_as(x)`).
"""

from __future__ import annotations

import sympy
from sympy import Expr

from opgen.formula.dims import Shape, ShapeError, show, split
from opgen.formula.tensor import TensorOp, pull_number, shape_of
from opgen.nodes.base import Printer, Rearranging, Shown, Spelled, TorchCode


def scan_dim(name: str, operand: Shape, dim: int) -> int:
    """`dim` of `name(x, dim)` counted from the end of `x`'s dimensions; a `ShapeError` when it names none."""
    if operand is None:
        raise ShapeError(f"{name}() needs a tensor of declared dimensions, e.g. x: Tensor[..., N] with dim=-1")
    batch, dims = split(operand)
    if not dims:
        raise ShapeError(f"{name}() needs a named dimension to scan along; {show(operand)} has none")
    if -len(dims) <= dim < 0:
        return dim
    if 0 <= dim < len(dims) and not batch:
        return dim - len(dims)
    counted = f"-{len(dims)} to -1" + ("" if batch else f" or 0 to {len(dims) - 1}")
    raise ShapeError(f"{name}(): dim={dim} is not a dimension of {show(operand)}; it takes {counted}")


class Cumsum(Rearranging, Spelled, Shown, TensorOp):
    """`Cumsum(x, dim, reverse)` or `Cumsum(x, dim, reverse, like)`: the (reversed, with `reverse` 1) cumulative
    sum of `x` along `dim` (negative), `x` first expanded to `like`'s shape when given (Note [scans])."""

    nargs = (3, 4)

    @classmethod
    def eval(cls, operand: Expr, *rest: Expr) -> Expr | None:
        return pull_number(cls, operand, *rest)

    @property
    def dim(self) -> int:
        return int(self.args[1])

    @property
    def reverse(self) -> bool:
        return bool(self.args[2])

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return shape_of(self.args[-1] if len(self.args) == 4 else self.args[0], table)

    def vjp_operand(self, grad: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        return _fitted(grad, self.args[1], 1 - self.args[2], self, table)

    def tangent_of(self, tangent: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        return _fitted(tangent, self.args[1], self.args[2], self, table)

    def _torch(self, printer: TorchCode) -> str:
        text = printer._print(self.args[0])
        if len(self.args) == 4:
            text = f"{printer._postfix(self.args[0])}.expand_as({printer._print(self.args[3])})"
        if not self.reverse:
            return f"{printer.torch}.cumsum({text}, {self.dim})"
        flip = f"{printer.torch}.flip"
        return f"{flip}({printer.torch}.cumsum({flip}({text}, ({self.dim},)), {self.dim}), ({self.dim},))"

    def _docstring(self, printer: Printer) -> str:
        word = "reverse_cumsum" if self.reverse else "cumsum"
        return f"{word}({printer._print(self.args[0])}, dim={self.dim})"


def _fitted(value: Expr, dim: Expr, reverse: Expr, node: Cumsum, table: dict[sympy.Symbol, Shape]) -> Expr:
    """`Cumsum(value, dim, reverse)` of a `value` standing for a tensor of `node`'s shape, expanded to it first
    where it is narrower (Note [scans])."""
    like = node.args[3] if len(node.args) == 4 else node.args[0]
    if shape_of(value, table) == shape_of(node, table):
        return Cumsum(value, dim, reverse)
    return Cumsum(value, dim, reverse, like)


SCANS = ("cumsum",)  # the formula language's names (opgen.formula.reader)
