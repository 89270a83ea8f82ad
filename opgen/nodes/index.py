"""Integer indexing of a dimension of literal size: `b[..., 0]` of boxes `b: Tensor[..., 4]`.

Note [integer indexing]
~~~~~~~~~~~~~~~~~~~~~~~
Box losses read a box's coordinates: `b[..., 0]`, `b[..., 2]` of `b: Tensor[..., 4]` (Note [literal
sizes] in opgen.formula.dims). An integer index picks one entry of a dimension of literal size
and removes that dimension, as in Python: `Pick(b, dim, index)`, `dim` from the end, `index`
from 0 (a negative one counts from the end, as Python's). Only a literal size can be indexed: a
named dimension's size is known at call time alone, so whether `x[..., 3]` exists would be too.

Its gradient puts the incoming gradient back at `index` among zeros, `PutAt(grad, dim, index,
size)`: `F.pad(grad.unsqueeze(dim), ...)`, and `PutAt`'s gradient is the pick again; each node's
tangent is the node of the tangent. All are differentiable torch ops, so double backward,
torch.func and torch.compile take them as any other. A gradient or tangent narrower than the node
(constant along a dimension: the scalar gradient of `sum(b[..., 0])`) gets its missing dimensions
in front first; one constant along the picked dimension is its own pick.
"""

from __future__ import annotations

import ast

import sympy
from sympy import Expr

from opgen.formula.dims import BATCH, Shape, ShapeError, show, split
from opgen.formula.tensor import TensorOp, Unsqueeze, pull_number, shape_of
from opgen.nodes.base import Printer, Rearranging, Shown, Spelled, TorchCode


def pick_dim(node: ast.Subscript, shape: Shape) -> tuple[int, int, int] | None:
    """(dim from the end, index from 0, size) of an integer index `x[..., k]` of a literal size; None when
    the index holds no integer (a slice: opgen.formula.slicing); a `ShapeError` when it is not allowed."""
    items = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
    numbers = [k for k, item in enumerate(items) if _integer(item) is not None]
    for item in items:
        if _integer(item) is None and not isinstance(item, ast.Slice) and not _whole(item):
            raise ShapeError(
                f"`{ast.unparse(item)}` is no index: write a whole number (b[..., 0] of Tensor[..., 4]) or a slice"
                " of a named dimension (x[..., :D // 2])"
            )
    if not numbers:
        return None
    usage = "pick one entry of a dimension of literal size by one whole number, e.g. b[..., 0] of Tensor[..., 4]"
    others = [item for k, item in enumerate(items) if k not in numbers]
    if len(numbers) > 1 or not all(_whole(item) for item in others):
        raise ShapeError(usage)
    if shape is None or shape == ():
        raise ShapeError(f"an integer index needs an operand with declared dimensions; {usage}")
    batch, named = split(shape)
    ellipsis = [k for k, item in enumerate(items) if isinstance(item, ast.Constant) and item.value is Ellipsis]
    position = numbers[0]
    if len(ellipsis) > 1 or len(items) - len(ellipsis) > len(named):
        raise ShapeError(f"the index has more entries than {show(shape)} has named dimensions")
    if ellipsis and ellipsis[0] < position:
        dim = position - len(items)
    elif batch:
        raise ShapeError(
            f"with batch dimensions `...` index from the end: b[..., 0] picks from the last of {show(shape)}"
        )
    else:
        dim = position - len(named)
    entry = named[dim]
    if not isinstance(entry, str) or not entry.isdigit():
        raise ShapeError(
            f"only a dimension of literal size can be indexed by a number, as Tensor[..., 4]; {show(shape)} has "
            f"{entry} there (a part of a named dimension is a slice: x[..., :D // 2])"
        )
    size, index = int(entry), _integer(items[position])
    assert index is not None
    if not -size <= index < size:
        raise ShapeError(f"index {index} is outside the dimension of size {size} of {show(shape)}")
    return dim, index % size, size


def _integer(item: ast.expr) -> int | None:
    if isinstance(item, ast.Constant) and type(item.value) is int:
        return item.value
    if isinstance(item, ast.UnaryOp) and isinstance(item.op, ast.USub):
        inner = _integer(item.operand)
        return None if inner is None else -inner
    return None


def _whole(item: ast.expr) -> bool:
    """`...` or `:`: an entry that keeps its dimension whole."""
    if isinstance(item, ast.Constant) and item.value is Ellipsis:
        return True
    return isinstance(item, ast.Slice) and item.lower is None and item.upper is None and item.step is None


class _Indexed(Rearranging, Spelled, Shown, TensorOp):
    """(operand, dim from the end, index), and for `PutAt` the size of the new dimension."""

    nargs = (3, 4)

    @classmethod
    def eval(cls, operand: Expr, *rest: Expr) -> Expr | None:
        return pull_number(cls, operand, *rest)

    @property
    def where(self) -> tuple[int, int, int]:
        return int(self.args[1]), int(self.args[2]), int(self.args[3]) if len(self.args) == 4 else 0


class Pick(_Indexed):
    """`x[..., index]` along `dim`: that dimension removed (Note [integer indexing])."""

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        operand = shape_of(self.args[0], table)
        assert operand is not None
        dim = self.where[0]
        return operand[:dim] + operand[len(operand) + dim + 1 :]

    def vjp_operand(self, grad: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        operand = shape_of(self.args[0], table)
        assert operand is not None
        entry = operand[self.where[0]]
        size = sympy.Integer(int(entry) if isinstance(entry, int) or entry.isdigit() else 1)
        return PutAt(_ranked(grad, self, table), *self.args[1:3], size)

    def tangent_of(self, tangent: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        return _picked(tangent, self.args[0], self.args[1:3], table)

    def _torch(self, printer: TorchCode) -> str:
        dim, index, _ = self.where
        operand = printer._postfix(self.args[0])
        return f"{operand}[..., {index}]" if dim == -1 else f"{operand}.select({dim}, {index})"

    def _docstring(self, printer: Printer) -> str:
        dim, index, _ = self.where
        return f"{printer._print(self.args[0])}[..., {index}{', :' * (-dim - 1)}]"


class PutAt(_Indexed):
    """The operand put at `index` of a new dimension of `size` along `dim`, zeros elsewhere: a pick's gradient."""

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        operand = shape_of(self.args[0], table)
        assert operand is not None
        dim, _, size = self.where
        at = len(operand) + dim + 1
        return operand[:at] + (str(size),) + operand[at:]

    def vjp_operand(self, grad: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        return _picked(grad, self, self.args[1:3], table)

    def tangent_of(self, tangent: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        return PutAt(_ranked(tangent, self.args[0], table), *self.args[1:])

    def _torch(self, printer: TorchCode) -> str:
        dim, index, size = self.where
        widths = ", ".join(["0, 0"] * (-dim - 1) + [f"{index}, {size - 1 - index}"])
        operand = printer._postfix(self.args[0])
        return f"{printer.functional}.pad({operand}.unsqueeze({dim}), ({widths}))"

    def _docstring(self, printer: Printer) -> str:
        dim, index, size = self.where
        return f"put_at({printer._print(self.args[0])}, dim={dim}, index={index}, size={size})"


def _ranked(value: Expr, like: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
    """`value`, for a tensor of `like`'s shape, with size-1 dimensions in front to as many named ones as `like`."""
    have, want = shape_of(value, table), shape_of(like, table)
    assert want is not None
    for k in range(len(split(have or ())[1]), len(split(want)[1])):
        value = Unsqueeze(value, sympy.Integer(-k - 1))
    return value


def _picked(value: Expr, like: Expr, where: tuple[Expr, ...], table: dict[sympy.Symbol, Shape]) -> Expr:
    """The pick of `value`, for a tensor of `like`'s shape: constant along the picked dimension (size 1 or
    missing there), its own pick: squeezed there, or as it is."""
    have = split(shape_of(value, table) or ())[1]
    dim = int(where[0])
    if len(have) < -dim:
        return value
    if have[dim] in (1, BATCH):
        return Pick(value, where[0], sympy.Integer(0))
    return Pick(value, *where)
