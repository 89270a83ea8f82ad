"""Tensor-level formula nodes and their shapes: `@`, `.T`, reductions, over named dimensions.

The formula parser builds these SymPy `Function` subclasses for the non-elementwise parts of
a formula; to SymPy they are opaque nodes inside ordinary (elementwise) expressions, so
`sympy.diff`, `cse` and printing treat everything between them as usual. `opgen.derive.vjp` gives
their gradients by exact rules, `opgen.emit.tensor_print` prints them as torch code.

Shapes are static: a tuple of dimension names (`"N"`), literal `1`s (from `keepdim=true`)
and, first, an optional `"..."` standing for any number of leading batch dimensions that
broadcast as in PyTorch (Note [batch dimensions]). `None` is the shape of a plain `Tensor`
input, whose rank is unknown: elementwise formulas accept it, tensor operations do not.

Note [batch dimensions]
~~~~~~~~~~~~~~~~~~~~~~~
`Tensor[N, K]` is exactly two-dimensional. `Tensor[..., N, K]` has any number (also zero) of
leading batch dimensions before `N, K`; the batch dimensions of all inputs broadcast together
as PyTorch broadcasts them. ReductionBase dims are counted from the end (`dim=-1`) whenever a
`...` is involved, and may not reach into the batch. `@` needs two operands with at least two
dimensions each and contracts the last dimension of the left one with the second-to-last of
the right one; everything before those broadcasts (batch matmul). `x.T` swaps the last two
dimensions (`.mT` when batch dimensions are possible).
"""

from __future__ import annotations

from typing import Union

import sympy
from sympy import Expr, Function, S
from sympy.printing.precedence import PRECEDENCE

BATCH = "..."
Dim = Union[str, int]  # noqa: UP007 - a runtime alias, also on Python 3.9 tooling  # a dimension name, the literal 1, or BATCH (first only)
Shape = Union[tuple[Dim, ...], None]  # noqa: UP007


class ShapeError(Exception):
    """Shapes that do not fit; the parser adds where."""


def show(shape: Shape) -> str:
    if shape is None:
        return "[any shape]"
    return "[" + ", ".join(str(d) for d in shape) + "]"


def split(shape: tuple[Dim, ...]) -> tuple[bool, tuple[Dim, ...]]:
    """(has leading batch dimensions, the dimensions after them)."""
    if shape[:1] == (BATCH,):
        return True, shape[1:]
    return False, shape


# -- nodes -------------------------------------------------------------------------------------


class TensorOp(Function):
    """A non-elementwise node; the subclasses say how it prints, what shape it has and its gradient."""

    is_real = True
    is_commutative = True  # as a value inside elementwise products; `@` keeps its own order


def _pull_number(cls: type[Function], operand: Expr, *rest: sympy.Basic) -> Expr | None:
    """A linear node of `-2*g` is `-2` times the node of `g`: `-(g.sum(-1))`, not `(-g).sum(-1)`."""
    if operand == 0:  # a linear node of zero is zero (a gradient whose every term vanished)
        return sympy.S.Zero
    coeff, body = operand.as_coeff_Mul()
    if coeff == 1 or body == 1:
        return None
    return coeff * cls(body, *rest)


class _Linear(TensorOp):
    """A node linear in its first argument: numeric factors move outside."""

    @classmethod
    def eval(cls, operand: Expr, *rest: sympy.Basic) -> Expr | None:
        return _pull_number(cls, operand, *rest)


class MatMul(TensorOp):
    """`a @ b` (torch.matmul): batch dimensions broadcast, the inner dimension contracts."""

    nargs = 2
    precedence = PRECEDENCE["Mul"]

    @classmethod
    def eval(cls, a: Expr, b: Expr) -> Expr | None:
        if a == 0 or b == 0:
            return sympy.S.Zero
        ca, ba = a.as_coeff_Mul()
        cb, bb = b.as_coeff_Mul()
        if (ca == 1 and cb == 1) or ba == 1 or bb == 1:
            return None
        return ca * cb * MatMul(ba, bb)


class Transpose(_Linear):
    """`a.T`: swaps the last two dimensions."""

    nargs = 1

    @classmethod
    def eval(cls, a: Expr) -> Expr | None:
        if isinstance(a, Transpose):
            return a.args[0]
        if isinstance(a, MatMul):
            # (a @ b).T == b.T @ a.T: the form a careful person writes for weight gradients.
            return MatMul(Transpose(a.args[1]), Transpose(a.args[0]))
        return _pull_number(cls, a)


class ReductionBase(TensorOp):  # "Base": SymPy printers look up `_print_ReductionBase` for subclasses
    """`f(a, dim, keepdim)`: `dim` a SymPy Integer counted from the end, `keepdim` 0 or 1."""

    nargs = 3
    spec_name = ""

    @property
    def operand(self) -> Expr:
        return self.args[0]

    @property
    def dim(self) -> int:
        return int(self.args[1])

    @property
    def keepdim(self) -> bool:
        return bool(self.args[2])


class ReduceSum(ReductionBase):
    spec_name = "sum"

    @classmethod
    def eval(cls, operand: Expr, dim: sympy.Integer, keepdim: sympy.Integer) -> Expr | None:
        return _pull_number(cls, operand, dim, keepdim)


class ReduceMean(ReductionBase):
    spec_name = "mean"

    @classmethod
    def eval(cls, operand: Expr, dim: sympy.Integer, keepdim: sympy.Integer) -> Expr | None:
        return _pull_number(cls, operand, dim, keepdim)


class ReduceAmax(ReductionBase):
    spec_name = "amax"


class ReduceLogSumExp(ReductionBase):
    spec_name = "logsumexp"


REDUCTION_CLASSES: dict[str, type[ReductionBase]] = {
    cls.spec_name: cls for cls in (ReduceSum, ReduceMean, ReduceAmax, ReduceLogSumExp)
}


def reduction(name: str, a: Expr, dim: int, keepdim: bool) -> Expr:
    return REDUCTION_CLASSES[name](a, sympy.Integer(dim), sympy.Integer(int(keepdim)))


class Softmax(TensorOp):
    """`exp(a - logsumexp(a, dim, keepdim=true))`, computed by `torch.softmax` (one fused kernel)."""

    nargs = 2


class LogSoftmax(TensorOp):
    """`a - logsumexp(a, dim, keepdim=true)`, computed by `torch.log_softmax`."""

    nargs = 2


class SoftmaxBackward(TensorOp):
    """`y * (g - sum(g * y, dim, keepdim=true))`, the gradient through `y = softmax(a, dim)`.

    Printed as PyTorch's own backward kernel, which is one pass instead of four and has a
    derivative of its own, so double backward still works.
    """

    nargs = 3  # g, y, dim

    def elementary(self) -> Expr:
        g, y, dim = self.args
        return y * (g - ReduceSum(g * y, dim, S.One))


class LogSoftmaxBackward(TensorOp):
    """`g - exp(y) * sum(g, dim, keepdim=true)`, the gradient through `y = log_softmax(a, dim)`."""

    nargs = 3  # g, y, dim

    def elementary(self) -> Expr:
        g, y, dim = self.args
        return g - sympy.exp(y) * ReduceSum(g, dim, S.One)


def _log_softmax_parts(expr: Expr) -> tuple[Expr, sympy.Integer] | None:
    """(a, dim) when `expr` is `a - logsumexp(a, dim, keepdim=true)`."""
    if not isinstance(expr, sympy.Add):
        return None
    for term in expr.args:
        coeff, body = term.as_coeff_Mul()
        if coeff == -1 and isinstance(body, ReduceLogSumExp) and body.keepdim:
            rest = sympy.Add(*[t for t in expr.args if t is not term])
            if rest == body.operand:
                return body.operand, body.args[1]
    return None


def fuse_softmax(expr: Expr) -> Expr:
    """Softmax and log-softmax written through logsumexp become PyTorch's fused ops (same values)."""
    found: dict[sympy.Basic, Expr] = {}
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.exp) and (parts := _log_softmax_parts(node.args[0])):
            found[node] = Softmax(*parts)
        elif isinstance(node, sympy.Add) and (parts := _log_softmax_parts(node)):
            found[node] = LogSoftmax(*parts)
    return expr.xreplace(found) if found else expr


class Unsqueeze(_Linear):
    """`g.unsqueeze(dim)`, `dim` counted from the end: the formula language's `unsqueeze`, and gradients."""

    nargs = 2


class SumDims(_Linear):
    """`g.sum(dims)` over leading dims (`keepdim` 0) or dims from the end (`keepdim` 1); gradients only."""

    nargs = 3


def dim_size(name: str) -> sympy.Symbol:
    """The size of the named dimension `name`, a positive integer known at call time."""
    return sympy.Symbol("size:" + name, integer=True, positive=True)


def is_dim_size(symbol: sympy.Basic) -> bool:
    return isinstance(symbol, sympy.Symbol) and symbol.name.startswith("size:")


def has_tensor_ops(expr: sympy.Basic) -> bool:
    return bool(expr.atoms(TensorOp))


# -- shapes --------------------------------------------------------------------------------------


def broadcast(a: Shape, b: Shape) -> Shape:
    """The shape of an elementwise result, as PyTorch broadcasts; a mismatch is a `ShapeError`."""
    if a is None or b is None:
        return None
    batch_a, dims_a = split(a)
    batch_b, dims_b = split(b)
    for batch, dims, shape, other_dims, other in ((batch_a, dims_a, a, dims_b, b), (batch_b, dims_b, b, dims_a, a)):
        if batch and len(other_dims) > len(dims):
            # Which dimensions `...` would line up with depends on its length at run time.
            raise ShapeError(
                f"the batch dimensions `...` of {show(shape)} would line up with {other_dims[-len(dims) - 1]} of"
                f" {show(other)}; declare the same dimensions after `...` on both sides"
            )
    n = max(len(dims_a), len(dims_b))
    padded_a = (1,) * (n - len(dims_a)) + dims_a
    padded_b = (1,) * (n - len(dims_b)) + dims_b
    out: list[Dim] = []
    for x, y in zip(padded_a, padded_b, strict=True):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeError(f"cannot broadcast {show(a)} with {show(b)}: dimension {x} does not match {y}")
    return ((BATCH,) if batch_a or batch_b else ()) + tuple(out)


def matmul_shape(a: Shape, b: Shape) -> Shape:
    if a is None or b is None:
        raise ShapeError("`@` needs operands with declared dimensions, e.g. Tensor[N, K]")
    batch_a, dims_a = split(a)
    batch_b, dims_b = split(b)
    for shape, dims in ((a, dims_a), (b, dims_b)):
        if len(dims) < 2:
            raise ShapeError(f"`@` needs operands with at least two dimensions; {show(shape)} has {len(dims)}")
    if dims_a[-1] != dims_b[-2]:
        raise ShapeError(
            f"`@` of {show(a)} and {show(b)}: the inner dimensions {dims_a[-1]} and {dims_b[-2]} differ"
            " (is a `.T` missing?)"
        )
    left = ((BATCH,) if batch_a else ()) + dims_a[:-2]
    right = ((BATCH,) if batch_b else ()) + dims_b[:-2]
    return (broadcast(left, right) or ()) + (dims_a[-2], dims_b[-1])


def transpose_shape(a: Shape) -> Shape:
    if a is None:
        raise ShapeError("`.T` needs an operand with declared dimensions, e.g. Tensor[N, K]")
    batch, dims = split(a)
    if len(dims) < 2:
        raise ShapeError(f"`.T` needs at least two dimensions; {show(a)} has {len(dims)}")
    return a[: len(a) - 2] + (a[-1], a[-2])


def reduce_dim(a: Shape, dim: int, what: str) -> int:
    """`dim` as a negative index into `a`; a dimension that is not there is a `ShapeError`."""
    if a is None:
        raise ShapeError(f"{what} needs an operand with declared dimensions, e.g. Tensor[..., N]")
    batch, dims = split(a)
    rank = len(dims)
    if batch and dim >= 0:
        raise ShapeError(f"{what}: with batch dimensions `...` count dim from the end (dim=-1: the last of {show(a)})")
    if not -rank <= dim < rank:
        raise ShapeError(f"{what}: dim={dim} is not a dimension of {show(a)}, which has {rank} dimensions")
    return dim - rank if dim >= 0 else dim


def unsqueeze_dim(a: Shape, dim: int) -> int:
    """`dim` of `unsqueeze(a, dim=...)` counted from the end (-1: a new last dimension), checked."""
    if not a:  # a plain Tensor (unknown rank) or a number
        raise ShapeError("unsqueeze() needs a tensor operand with declared dimensions, e.g. Tensor[..., N, K]")
    batch, dims = split(a)
    rank = len(dims)
    if batch and dim >= 0:
        raise ShapeError(
            f"unsqueeze(): with batch dimensions `...` count dim from the end (dim=-1: after the last of {show(a)})"
        )
    if not -rank - 1 <= dim <= rank:
        raise ShapeError(f"unsqueeze(): dim={dim} is not a place in {show(a)}, which has {rank} dimensions")
    return dim - rank - 1 if dim >= 0 else dim


def unsqueeze_shape(a: Shape, dim: int) -> Shape:
    """`a` with a dimension of size 1 at `dim` (from the end, as `unsqueeze_dim` gives it)."""
    assert a is not None and dim < 0
    k = len(a) + dim + 1
    return a[:k] + (1,) + a[k:]


def reduce_shape(a: Shape, dim: int, keepdim: bool) -> Shape:
    assert a is not None and dim < 0
    k = len(a) + dim
    return a[:k] + ((1,) if keepdim else ()) + a[k + 1 :]


def shape_of(expr: sympy.Basic, table: dict[sympy.Symbol, Shape]) -> Shape:
    """The static shape of `expr`; symbols not in `table` are plain numbers."""
    if isinstance(expr, sympy.Symbol):
        return table.get(expr, ())
    if not expr.args or expr.is_number:
        return ()
    if isinstance(expr, MatMul):
        return matmul_shape(shape_of(expr.args[0], table), shape_of(expr.args[1], table))
    if isinstance(expr, Transpose):
        return transpose_shape(shape_of(expr.args[0], table))
    if isinstance(expr, (Softmax, LogSoftmax)):
        return shape_of(expr.args[0], table)
    if isinstance(expr, ReductionBase):
        return reduce_shape(shape_of(expr.operand, table), expr.dim, expr.keepdim)
    if isinstance(expr, Unsqueeze):
        return unsqueeze_shape(shape_of(expr.args[0], table), int(expr.args[1]))
    if isinstance(expr, SumDims):
        inner = shape_of(expr.args[0], table)
        assert inner is not None
        dims = {int(d) % len(inner) for d in expr.args[1]}  # from the front or the end
        if expr.args[2]:
            return tuple(1 if k in dims else d for k, d in enumerate(inner))
        return tuple(d for k, d in enumerate(inner) if k not in dims)
    shape: Shape = ()
    for arg in expr.args:
        if isinstance(arg, (sympy.Basic)) and not isinstance(arg, sympy.logic.boolalg.BooleanAtom):
            shape = broadcast(shape, shape_of(arg, table))
    return shape
