"""Diagonals over named dimensions: `diagonal(c)` of a square `[..., N, N]`, `diag_embed(v)` of `[..., N]`, `diag`.

Note [diagonals]
~~~~~~~~~~~~~~~~
Redundancy-reduction losses (Barlow Twins: `sum((diagonal(c) - 1)**2) + lam * (sum(c**2) -
sum(diagonal(c)**2))`) and covariance terms read the diagonal of a square matrix of named
dimensions, and build a diagonal matrix from a vector. `Diagonal(a)` is `torch.diagonal(a, dim1=-2,
dim2=-1)`: the last two dimensions of `a` must be the same named dimension `N` (a square matrix,
checked where the formula is written), and it leaves `[..., N]`. `DiagEmbed(v)` is
`torch.diag_embed(v)`: `[..., N]` -> `[..., N, N]`, zeros off the diagonal. `diag(x)` is torch.diag:
the matrix of a vector `[N]`, the diagonal of a matrix `[N, N]` (no batch: `diag_embed` and
`diagonal` take one). `eye(N)` is the identity `[N, N]` of a named dimension, `torch.eye(N)` in the
dtype and on the device of a Tensor input that has `N` (which backward then keeps, where a gradient
uses the identity): a constant, with no gradient.

Both are linear, and each is the other's adjoint: the gradient of `Diagonal(a)` is
`DiagEmbed(grad)`, that of `DiagEmbed(v)` is `Diagonal(grad)`; a tangent is the node of the tangent.
These are differentiable torch ops, so double backward, torch.func and torch.compile take them as
they take any other. A gradient or tangent may be narrower than the node (constant along a
dimension: the scalar gradient of `sum(diagonal(c))`): the node then carries the size of `N` as a
second argument and expands its operand to it first (`g.expand(*g.shape[:-1], N)`).
"""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.formula.dims import BATCH, Shape, ShapeError, dim_size, show, split
from opgen.formula.tensor import TensorOp, Unsqueeze, pull_number, shape_of
from opgen.nodes.base import Printer, Rearranging, Shown, Spelled, TorchCode


def diagonal_shape(a: Shape) -> Shape:
    """`[..., N, N]` -> `[..., N]`; anything else is a `ShapeError` saying what to write."""
    if a is None:
        raise ShapeError("diagonal() needs a matrix of declared dimensions, e.g. Tensor[N, N]")
    dims = split(a)[1]
    if len(dims) < 2:
        raise ShapeError(
            f"diagonal() needs at least two dimensions; {show(a)} has {len(dims)}; diag_embed(v) makes a matrix of"
            " a vector"
        )
    if dims[-1] != dims[-2] or dims[-1] == 1:
        raise ShapeError(
            f"diagonal() needs a square matrix, its last two dimensions the same named dimension; {show(a)} has "
            f"{dims[-2]} and {dims[-1]} (a product `z.T @ z` of `z: Tensor[B, D]` is [D, D])"
        )
    return a[:-1]


def diag_embed_shape(v: Shape) -> Shape:
    """`[..., N]` -> `[..., N, N]`."""
    if v is None:
        raise ShapeError("diag_embed() needs a vector of declared dimensions, e.g. Tensor[N]")
    dims = split(v)[1]
    if not dims or dims[-1] == 1:
        raise ShapeError(f"diag_embed() needs a last dimension with a name, e.g. Tensor[..., N]; {show(v)} has none")
    return (*v, v[-1])


def _dim_name(size: Expr) -> str:
    if not isinstance(size, sympy.Symbol) or not size.name.startswith("size:"):
        raise ShapeError("a diagonal of a part of a dimension is not supported")
    return size.name.removeprefix("size:")


class _Diagonals(Rearranging, Spelled, Shown, TensorOp):
    """`node(operand)` or `node(operand, size)`: with a size, the operand may be narrower and is expanded.
    The operand's last `takes` dimensions are `N`, the node's last `gives`; the gradient is the adjoint's."""

    nargs = (1, 2)
    takes = gives = 0
    word = call = ""  # the formula language's name; torch's call, `{}` the operand

    @classmethod
    def eval(cls, operand: Expr, *size: Expr) -> Expr | None:
        return pull_number(cls, operand, *size)

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        operand = shape_of(self.args[0], table)
        if len(self.args) == 1:
            return _STATIC_SHAPES[type(self)](operand)
        batch, dims = split(operand or ())
        return (*((BATCH,) if batch else ()), *dims[: -self.takes], *[_dim_name(self.args[1])] * self.gives)

    def vjp_operand(self, grad: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        return _applied(_ADJOINTS[type(self)], grad, self, table)

    def tangent_of(self, tangent: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        return _applied(type(self), tangent, self.args[0], table)

    def _torch(self, printer: TorchCode) -> str:
        """torch's call of the operand, expanded first to the size in its last `takes` dimensions when the
        node has one."""
        operand = self.args[0]
        text = printer._print(operand)
        if len(self.args) == 2:
            text, size = printer._postfix(operand), printer._print(self.args[1])
            text = f"{text}.expand(*{text}.shape[:{-self.takes}], {', '.join([size] * self.takes)})"
        return self.call.format(torch=printer.torch, operand=text)

    def _docstring(self, printer: Printer) -> str:
        return f"{self.word}({printer._print(self.args[0])})"


class Diagonal(_Diagonals):
    """`torch.diagonal(a, dim1=-2, dim2=-1)` of a square `[..., N, N]` (Note [diagonals])."""

    takes, gives, word, call = 2, 1, "diagonal", "{torch}.diagonal({operand}, dim1=-2, dim2=-1)"


class DiagEmbed(_Diagonals):
    """`torch.diag_embed(v)`: `[..., N]` -> `[..., N, N]`, `v` on the diagonal (Note [diagonals])."""

    takes, gives, word, call = 1, 2, "diag_embed", "{torch}.diag_embed({operand})"


_ADJOINTS: dict[type[_Diagonals], type[_Diagonals]] = {Diagonal: DiagEmbed, DiagEmbed: Diagonal}
_STATIC_SHAPES = {Diagonal: diagonal_shape, DiagEmbed: diag_embed_shape}


class Eye(Rearranging, Spelled, Shown, TensorOp):
    """`eye(N)`: the identity `[N, N]`, `Eye(like, size)` with `like` a Tensor input it takes its dtype and
    device from; a constant: no gradient, no tangent (Note [diagonals])."""

    nargs = 2

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        name = _dim_name(self.args[1])
        return (name, name)

    def vjp_operand(self, grad: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        return S.Zero

    def tangent_of(self, tangent: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        return S.Zero

    def _torch(self, printer: TorchCode) -> str:
        like, size = printer._postfix(self.args[0]), printer._print(self.args[1])
        return f"{printer.torch}.eye({size}, dtype={like}.dtype, device={like}.device)"

    def _docstring(self, printer: Printer) -> str:
        return f"eye({_dim_name(self.args[1])})"


def _applied(node: type[_Diagonals], value: Expr, like: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
    """`node(value)`, `value` standing for a tensor of `like`'s shape, whose last dimension is `N`: as it
    is where it has that shape, else with size-1 dimensions put in front to as many named dimensions as
    `like` has, and the size of `N` to expand to (Note [diagonals])."""
    have, want = shape_of(value, table), shape_of(like, table)
    assert want is not None, like
    if have == want:
        return node(value)
    have_dims, want_dims = split(have or ())[1], split(want)[1]
    for k in range(len(have_dims), len(want_dims)):
        value = Unsqueeze(value, sympy.Integer(-k - 1))
    return node(value, dim_size(str(want_dims[-1])))


DIAGONALS = ("diagonal", "diag_embed", "diag", "eye")  # the formula language's names (opgen.formula.reader)


def node_for(name: str, operand: Shape) -> type[_Diagonals]:
    """The node `name(x)` of an `x` of shape `operand` is (not `eye`): `diag` is torch.diag, which takes no batch."""
    if name == "diagonal":
        return Diagonal
    if name == "diag_embed":
        return DiagEmbed
    if operand is None or split(operand)[0] or len(operand) not in (1, 2):
        raise ShapeError(
            f"diag() takes a vector [N] or a square matrix [N, N], as torch.diag; {show(operand)} is neither: "
            "write diag_embed(v) for the matrices of a batch of vectors, diagonal(c) for the diagonals of matrices"
        )
    return DiagEmbed if len(operand) == 1 else Diagonal


def call_shape(name: str, operand: Shape) -> Shape:
    """The shape of `name(x)`, `x` of shape `operand` (the shapes as written, opgen.formula.written)."""
    node = node_for(name, operand)
    return diagonal_shape(operand) if node is Diagonal else diag_embed_shape(operand)
