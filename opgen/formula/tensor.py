"""Tensor-level formula nodes and their shapes: `@`, `.T`, reductions, over named dimensions.

The formula parser builds these SymPy `Function` subclasses for the non-elementwise parts of
a formula; to SymPy they are opaque nodes inside ordinary (elementwise) expressions, so
`sympy.diff`, `cse` and printing treat everything between them as usual. `opgen.derive.vjp` gives
their gradients by exact rules, `opgen.emit.tensor_print` prints them as torch code.

Shapes are static: a tuple of dimension names (`"N"`), literal `1`s (from `keepdim=true`)
and, first, an optional `"..."` standing for any number of leading batch dimensions that
broadcast as in PyTorch (Note [batch dimensions]). `None` is the shape of a plain `Tensor`
input, whose rank is unknown: elementwise formulas accept it, tensor operations do not. The
rules of broadcasting, `@` and `.T` on shapes are `opgen.formula.shape_rules`; `shape_of` applies them.

Note [batch dimensions]
~~~~~~~~~~~~~~~~~~~~~~~
`Tensor[N, K]` is exactly two-dimensional. `Tensor[..., N, K]` has any number (also zero) of
leading batch dimensions before `N, K`; the batch dimensions of all inputs broadcast together
as PyTorch broadcasts them. ReductionBase dims are counted from the end (`dim=-1`) whenever a
`...` is involved, and may not reach into the batch. `@` needs two operands with at least two
dimensions each and contracts the last dimension of the left one with the second-to-last of
the right one; everything before those broadcasts (batch matmul). `x.T` swaps the last two
dimensions (`.mT` when batch dimensions are possible).

Note [vector @ matrix]
~~~~~~~~~~~~~~~~~~~~~~
`x @ w` with `x` of `[..., D]` (one named dimension) and `w` a plain matrix `[D, H]` (no `...`) is
what `F.linear` takes: each row `x[r]` of the batch times `w`, giving `[..., H]` (torch.matmul's
vector-matrix product, batched). Its gradients: `g @ w.T` for `x` (torch.matmul again), and for `w`
the sum over rows of `outer(x[r], g[r])`, `RowsOuter`, printed as one matrix product of the rows
(`x` expanded first: the gradient's batch dimensions may be bigger than `x`'s). A matrix times a
vector on the right is refused: torch would read a batched vector as a batch of matrices.
"""

from __future__ import annotations

from typing import Any

import sympy
from sympy import Expr, Function, S
from sympy.printing.precedence import PRECEDENCE
from sympy.printing.str import StrPrinter

from opgen.formula.dims import BATCH as BATCH
from opgen.formula.dims import Dim as Dim
from opgen.formula.dims import Shape
from opgen.formula.dims import ShapeError as ShapeError
from opgen.formula.dims import dim_size as dim_size
from opgen.formula.dims import is_dim_size as is_dim_size
from opgen.formula.dims import split as split
from opgen.formula.reduce_shapes import dims_count as dims_count
from opgen.formula.reduce_shapes import reduce_dim as reduce_dim
from opgen.formula.reduce_shapes import reduce_dims as reduce_dims
from opgen.formula.reduce_shapes import reduce_shape, unsqueeze_shape
from opgen.formula.reduce_shapes import unsqueeze_dim as unsqueeze_dim
from opgen.formula.shape_rules import broadcast, matmul_shape, transpose_shape
from opgen.nodes.base import Node, Shaped

# -- nodes -------------------------------------------------------------------------------------


class TensorOp(Node, Function):
    """A non-elementwise node; the subclasses say how it prints, what shape it has and its gradient."""

    is_real = True
    is_commutative = True  # as a value inside elementwise products; `@` keeps its own order


def pull_number(cls: type[Function], operand: Expr, *rest: sympy.Basic) -> Expr | None:
    """A linear node of `-2*g` is `-2` times the node of `g`: `-(g.sum(-1))`, not `(-g).sum(-1)`."""
    if operand == 0:  # a linear node of zero is zero (a gradient whose every term vanished)
        return sympy.S.Zero
    coeff, body = operand.as_coeff_Mul()
    if coeff == 1 or body == 1:
        return None
    return coeff * cls(body, *rest)


def _zero_gradient(grad: Expr) -> Expr | None:
    """Note [kernels of a zero gradient]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    A node that is linear in an incoming gradient (a backward kernel, a fitting to a shape) is 0 when
    that gradient is: SymPy may prove it zero only after the node was built (`where(n > n, g, 0)`),
    and a kernel printed with a literal 0 (`_log_softmax_backward_data(0, ...)`) fails at run time."""
    return S.Zero if grad == 0 else None


class _Linear(TensorOp):
    """A node linear in its first argument: numeric factors move outside."""

    @classmethod
    def eval(cls, operand: Expr, *rest: sympy.Basic) -> Expr | None:
        return pull_number(cls, operand, *rest)


class ShapedOp(TensorOp):
    """A node whose shape follows from its first argument's alone (the parts of `opgen.formula.slicing`)."""

    def static_shape(self, operand: Shape) -> Shape:
        raise NotImplementedError


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

    def _sympystr(self, printer: Any) -> str:
        """`a @ b` for `str()`: SymPy's StrPrinter took this for its matrix product (by the class name)."""
        own = getattr(type(printer), "_print_MatMul", None)
        if own is not None and own is not StrPrinter._print_MatMul:
            return str(own(printer, self))
        a, b = (printer.parenthesize(arg, self.precedence) for arg in self.args)
        return f"{a} @ {b}"


class RowsOuter(TensorOp):
    """`sum over rows of outer(a[r], g[r])` for `a` of [..., D] and `g` of [..., H]: the gradient of the matrix
    in `a @ m` (Note [vector @ matrix]); the batch dimensions of `a` and `g` broadcast, then are summed."""

    nargs = 2

    @classmethod
    def eval(cls, a: Expr, g: Expr) -> Expr | None:
        return _zero_gradient(a * g)


class Transpose(_Linear):
    """`a.T`: swaps the last two dimensions."""

    nargs = 1

    @property
    def arg(self) -> Expr:
        """What SymPy's own printer reads of a transpose, taking this for its matrix one where SymPy prints a
        formula inside itself (an assumption query on `tanh(a.T @ a + ...)`): it failed on `.arg` before."""
        return self.args[0]

    @classmethod
    def eval(cls, a: Expr) -> Expr | None:
        if isinstance(a, Transpose):
            return a.args[0]
        if isinstance(a, MatMul):
            # (a @ b).T == b.T @ a.T: the form a careful person writes for weight gradients.
            return MatMul(Transpose(a.args[1]), Transpose(a.args[0]))
        return pull_number(cls, a)


class ReductionBase(TensorOp):  # "Base": SymPy printers look up `_print_ReductionBase` for subclasses
    """`f(a, dims, keepdim)`: `dims` a SymPy Integer (one dim, counted from the end), a Tuple of them in
    increasing order (several dims), or the empty Tuple (every dimension: Note [reductions over every
    dimension] in opgen.formula.reduce_shapes); `keepdim` 0 or 1."""

    nargs = 3
    spec_name = ""

    @property
    def operand(self) -> Expr:
        return self.args[0]

    @property
    def dims(self) -> tuple[int, ...]:
        """The reduced dims, from the end; () for every dimension."""
        arg = self.args[1]
        return tuple(int(d) for d in arg) if isinstance(arg, sympy.Tuple) else (int(arg),)

    @property
    def every_dim(self) -> bool:
        return self.args[1] == sympy.Tuple()

    @property
    def dim(self) -> int:
        assert not isinstance(self.args[1], sympy.Tuple), "a reduction over several dims"
        return int(self.args[1])

    @property
    def keepdim(self) -> bool:
        return bool(self.args[2])


class _LinearReduction(ReductionBase):
    @classmethod
    def eval(cls, operand: Expr, dim: sympy.Basic, keepdim: sympy.Integer) -> Expr | None:
        return pull_number(cls, operand, dim, keepdim)


class ReduceSum(_LinearReduction):
    spec_name = "sum"


class ReduceMean(_LinearReduction):
    spec_name = "mean"


class ReduceAmax(ReductionBase):
    spec_name = "amax"


class ReduceLogSumExp(ReductionBase):
    spec_name = "logsumexp"


class ReduceNorm(ReductionBase):
    """The Euclidean norm (p = 2) over `dims`: `torch.linalg.vector_norm`."""

    spec_name = "norm"


class ReduceVar(ReductionBase):
    """The variance over `dims` with Bessel's `correction` (a whole number, 1 as in torch): `torch.var`."""

    nargs = 4
    spec_name = "var"

    @property
    def correction(self) -> int:
        return int(self.args[3])


REDUCTION_CLASSES: dict[str, type[ReductionBase]] = {
    cls.spec_name: cls for cls in (ReduceSum, ReduceMean, ReduceAmax, ReduceLogSumExp, ReduceNorm, ReduceVar)
}


def dims_arg(dims: int | tuple[int, ...]) -> sympy.Basic:
    """One dim as an Integer (as reductions always held it), several (or none: every dim) as a Tuple."""
    if isinstance(dims, int):
        return sympy.Integer(dims)
    if len(dims) == 1:
        return sympy.Integer(dims[0])
    return sympy.Tuple(*(sympy.Integer(d) for d in sorted(dims)))


def reduction(name: str, a: Expr, dims: int | tuple[int, ...], keepdim: bool, correction: int = 1) -> Expr:
    extra = (sympy.Integer(correction),) if name == "var" else ()
    return REDUCTION_CLASSES[name](a, dims_arg(dims), sympy.Integer(int(keepdim)), *extra)


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

    @classmethod
    def eval(cls, g: Expr, y: Expr, dim: sympy.Basic) -> Expr | None:
        return _zero_gradient(g)

    def elementary(self) -> Expr:
        g, y, dim = self.args
        return y * (g - ReduceSum(g * y, dim, S.One))


class LogSoftmaxBackward(TensorOp):
    """`g - exp(y) * sum(g, dim, keepdim=true)`, the gradient through `y = log_softmax(a, dim)`."""

    nargs = 3  # g, y, dim

    @classmethod
    def eval(cls, g: Expr, y: Expr, dim: sympy.Basic) -> Expr | None:
        return _zero_gradient(g)

    def elementary(self) -> Expr:
        g, y, dim = self.args
        return g - sympy.exp(y) * ReduceSum(g, dim, S.One)


class Unsqueeze(_Linear):
    """`g.unsqueeze(dim)`, `dim` counted from the end: the formula language's `unsqueeze`, and gradients."""

    nargs = 2


class SumDims(_Linear):
    """`g.sum(dims)` over leading dims (`keepdim` 0) or dims from the end (`keepdim` 1); gradients only."""

    nargs = 3


# Nodes linear in their first argument: a factor that is a number moves outside (opgen.plan.numbers).
LINEAR: tuple[type[TensorOp], ...] = (_Linear, _LinearReduction)


def has_tensor_ops(expr: sympy.Basic) -> bool:
    return bool(expr.atoms(TensorOp))


# -- shapes --------------------------------------------------------------------------------------


class SumTo(TensorOp):
    """`grad.sum_to_size(shape)`, `shape` a `broadcast_shape` symbol of one input: one part of a
    plain Tensor's gradient summed to the input's shape before it meets parts spread over other
    shapes (Note [counts of unknown shapes]). A third argument flags, per dimension of the input,
    those where `grad` has size 1 (constant along them): summed to 1 there, then expanded."""

    nargs = (2, 3)

    @classmethod
    def eval(cls, grad: Expr, shape: sympy.Basic, narrow: sympy.Basic = S.Zero) -> Expr | None:
        return _zero_gradient(grad)


class BroadcastTo(TensorOp):
    """`grad.expand(shape)`, `shape` a `broadcast_shape` symbol: a gradient spread over the shape of
    plain Tensors broadcast together (Note [counts of unknown shapes])."""

    nargs = 2

    @classmethod
    def eval(cls, grad: Expr, shape: sympy.Basic) -> Expr | None:
        return _zero_gradient(grad)


def shape_of(expr: sympy.Basic, table: dict[sympy.Symbol, Shape]) -> Shape:
    """The static shape of `expr`; symbols not in `table` are plain numbers."""
    if isinstance(expr, sympy.Symbol):
        return table.get(expr, ())
    if not expr.args or expr.is_number:
        return ()
    if isinstance(expr, Shaped):  # a node of a later stage (a layer norm) knows its own shape
        return expr.shape_in(table)
    if isinstance(expr, MatMul):
        return matmul_shape(shape_of(expr.args[0], table), shape_of(expr.args[1], table))
    if isinstance(expr, Transpose):
        return transpose_shape(shape_of(expr.args[0], table))
    if isinstance(expr, RowsOuter):
        a, g = (shape_of(arg, table) for arg in expr.args)
        assert a is not None and g is not None
        return (a[-1], g[-1])
    if isinstance(expr, (Softmax, LogSoftmax)):
        return shape_of(expr.args[0], table)
    if isinstance(expr, (BroadcastTo, SumTo)):
        return None
    if isinstance(expr, ReductionBase):
        return reduce_shape(shape_of(expr.operand, table), expr.dims, expr.keepdim)
    if isinstance(expr, ShapedOp):
        return expr.static_shape(shape_of(expr.args[0], table))
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


def top_tensor_ops(expr: sympy.Basic, x: sympy.Symbol) -> set[Expr]:
    """The outermost tensor operations in `expr` that depend on `x` (the leaves of both modes)."""
    found: set[Expr] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if x not in node.free_symbols:
            continue
        if isinstance(node, TensorOp):
            found.add(node)
            continue
        stack.extend(node.args)
    return found
