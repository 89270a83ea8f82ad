"""Shapes as written: what each formula broadcasts with before SymPy simplifies it.

Receives the syntax tree of a `let` or output formula, what its names mean, the declared
shapes and what the earlier formulas broadcast with; returns the formula's `Piece`s, whose
broadcast is the formula's shape as written, for one variant (some `Tensor?` inputs None).
`uncovered` tells which pieces a simplified formula no longer broadcasts with, so forward
can expand the output to the shape torch gives the formula as written.

Note [shapes as written]
~~~~~~~~~~~~~~~~~~~~~~~~
SymPy simplifies `where(c, x, x)` to `x`, `x + 0 * z` and `x + z - z` to `x`: the same
values, but torch broadcasts the formula as written, so its result has the shape of `c`
or `z` too when they are larger. The pieces are read from the formula text, as the tie
rule reads which names hold tensors (Note [tensor-valued lets]): a Tensor input used
elementwise is a piece with its own shape; a tensor operation (`@`, `.T`, a reduction) is
a piece with the static shape it has as written, and the batch dimensions `...` of the
inputs inside it. A `let` or output used in a formula brings its own pieces. A `Tensor?`
input that is None removes the terms that use it (spec format section 2) and so their
pieces, by the rule `opgen.derive.gradients.drop_terms` applies to the SymPy formula: a side of `+`
or `-` goes alone, anything else goes whole. Forward then expands an output whose
simplified formula misses a piece to `torch.broadcast_shapes` of its own shape and the
missing pieces' shapes (nothing for outputs that miss none), and every shape the later
stages read (the output's, its incoming gradient's) is the shape as written.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sympy

from opgen.formula import shape_rules, slicing, tensor
from opgen.formula.dims import batch_count_size, dim_size, show, split
from opgen.formula.syntax import reduction_dims
from opgen.formula.tensor import BATCH, Shape, ShapeError, TensorOp
from opgen.formula.vocabulary import REDUCTIONS, SHAPE_FUNCTIONS
from opgen.nodes import concat, diagonal, index, scan

SHAPED = (*REDUCTIONS, *SHAPE_FUNCTIONS)  # calls whose first argument sets the shape: reductions, unsqueeze


@dataclass(frozen=True)
class Piece:
    """One shape a formula broadcasts with: a tensor used elementwise, or a tensor operation."""

    tensor: sympy.Symbol | None  # a Tensor input used elementwise (its own shape), else None
    dims: Shape  # the static shape: declared (None: a plain Tensor), or of the tensor operation
    batch: tuple[sympy.Symbol, ...] = ()  # the inputs whose batch dimensions `...` it has
    # A Tensor input a tensor operation reads, for the dtype and device of a constant output
    # (Note [constant outputs] in opgen.emit.forward); not part of what the piece is.
    reads: sympy.Symbol | None = field(default=None, compare=False)


Pieces = frozenset[Piece]


def sort_key(piece: Piece) -> tuple[str, str, tuple[str, ...]]:
    return (piece.tensor.name if piece.tensor else "", str(piece.dims), tuple(s.name for s in piece.batch))


class Walk:
    """The pieces of formulas of one variant; `defined` gains each let's and output's as they are read."""

    def __init__(
        self,
        names: dict[str, sympy.Basic],
        inputs: frozenset[sympy.Symbol],
        shapes: dict[sympy.Symbol, Shape],
        absent: frozenset[sympy.Symbol],
    ) -> None:
        self.names = names
        self.inputs = inputs  # the Tensor inputs
        self.shapes = shapes
        self.absent = absent
        self.defined: dict[sympy.Basic, Pieces | None] = {}  # let/output symbol -> pieces, None if dropped

    def pieces(self, node: ast.expr) -> Pieces | None:
        """The pieces of `node`; None when the term is dropped (it uses an absent input)."""
        if isinstance(node, ast.Name):
            return self.name(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            kept = [p for p in (self.pieces(node.left), self.pieces(node.right)) if p is not None]
            return frozenset().union(*kept) if kept else None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            return self.operation(node, [node.left, node.right])
        if isinstance(node, ast.Attribute):
            return self.operation(node, [node.value])
        if isinstance(node, ast.Subscript):  # a part of a dimension (opgen.formula.slicing)
            return self.operation(node, [_chunked(node.value) or node.value])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("cat", "stack"):
            return self.operation(node, list(node.args[0].elts))  # type: ignore[attr-defined]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "eye":
            name = ast.unparse(node.args[0])  # the reader checked it is a named dimension
            return frozenset([Piece(None, (name, name))])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in SHAPED:
            return self.operation(node, node.args[:1])
        # A call's pieces are its arguments' (each walked once: a walk of the name too doubles the work per level)
        children = node.args if isinstance(node, ast.Call) else ast.iter_child_nodes(node)
        parts = [self.pieces(child) for child in children if isinstance(child, ast.expr)]
        if any(p is None for p in parts):
            return None
        return frozenset().union(*parts)  # type: ignore[arg-type]

    def name(self, name: str) -> Pieces | None:
        symbol = self.names.get(name)
        if symbol is None:
            return frozenset()  # a constant such as pi or true
        if symbol in self.absent:
            return None
        if symbol in self.defined:
            return self.defined[symbol]
        if symbol not in self.inputs:
            return frozenset()  # a number input or a dimension's size
        dims = self.shapes.get(symbol)
        return frozenset([Piece(symbol, dims, (symbol,) if dims and BATCH in dims else ())])

    def operation(self, node: ast.expr, operands: list[ast.expr]) -> Pieces | None:
        """A tensor operation: one piece with its static shape as written."""
        parts = [self.pieces(operand) for operand in operands]
        if any(p is None for p in parts):
            return None
        try:
            shapes = [broadcast_all(p) for p in parts]  # type: ignore[arg-type]
            dims = self.operation_shape(node, shapes)
        except ShapeError:  # what is left of it after dropped terms no longer fits: SymPy's shape decides
            return frozenset()
        batch = tuple(sorted({s for p in parts for piece in p for s in piece.batch}, key=lambda s: s.name))  # type: ignore[union-attr]
        batch = batch if dims is None or BATCH in dims else ()  # a reduction over every dim has none left
        reads = sorted({t for p in parts for piece in p for t in (piece.tensor, piece.reads) if t}, key=str)  # type: ignore[union-attr]
        return frozenset([Piece(None, dims, batch, reads[0] if reads else None)])

    def operation_shape(self, node: ast.expr, shapes: list[Shape]) -> Shape:
        if isinstance(node, ast.BinOp):
            return shape_rules.matmul_shape(shapes[0], shapes[1])
        if isinstance(node, ast.Attribute):
            return shape_rules.transpose_shape(shapes[0])
        if isinstance(node, ast.Subscript):
            return self.cut_shape(node, shapes[0])
        assert isinstance(node, ast.Call)
        options = {kw.arg: kw.value for kw in node.keywords}
        if isinstance(node.func, ast.Name) and node.func.id in ("cat", "stack"):
            dim = ast.literal_eval(options["dim"]) if "dim" in options else 0
            joined = concat.stack_shape if node.func.id == "stack" else concat.cat_cuts
            return joined(shapes, dim)[0]
        if isinstance(node.func, ast.Name) and node.func.id in diagonal.DIAGONALS:
            return diagonal.call_shape(node.func.id, shapes[0])
        if isinstance(node.func, ast.Name) and node.func.id in scan.SCANS:
            return shapes[0]  # the reader checked its dim
        if isinstance(node.func, ast.Name) and node.func.id == "unsqueeze":
            place = ast.literal_eval(options["dim"])
            return tensor.unsqueeze_shape(shapes[0], tensor.unsqueeze_dim(shapes[0], place))
        dims = reduction_dims(options.get("dim"))
        keepdim = "keepdim" in options and ast.unparse(options["keepdim"]) in ("true", "True")
        return tensor.reduce_shape(shapes[0], tensor.reduce_dims(shapes[0], dims, keepdim, "reduction"), keepdim)  # type: ignore[arg-type]

    def cut_shape(self, node: ast.Subscript, shape: Shape) -> Shape:
        dims = frozenset(n for n, s in self.names.items() if tensor.is_dim_size(s))
        picked = index.pick_dim(node, shape) if _chunked(node.value) is None else None
        if picked is not None and shape is not None:  # `b[..., 0]`: the dimension goes
            return shape[: picked[0]] + shape[len(shape) + picked[0] + 1 :]
        try:
            chunk = _chunked(node.value)
            if chunk is not None:
                cut = slicing.chunk_cut(node.value, node.slice, shape)  # type: ignore[arg-type]
            else:
                cut = slicing.index_cut(node, shape, dims)
        except slicing.CutError as error:  # the reader refused it already
            raise ShapeError(str(error)) from None
        return slicing.make(slicing.Slice, sympy.Dummy(), cut).static_shape(shape)


def _chunked(node: ast.expr) -> ast.expr | None:
    """The tensor of `chunk(x, ...)`, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "chunk" and node.args:
        return node.args[0]
    return None


def broadcast_all(pieces: Pieces) -> Shape:
    """The static shape of the broadcast of `pieces` (None when one is a plain Tensor)."""
    shape: Shape = ()
    for piece in sorted(pieces, key=sort_key):
        shape = shape_rules.broadcast(shape, piece.dims)
    return shape


def uncovered(
    expr: sympy.Basic, pieces: Pieces, shapes: dict[sympy.Symbol, Shape], tensors: frozenset[sympy.Symbol]
) -> tuple[Piece, ...]:
    """The pieces whose shape `expr`, the simplified formula, may no longer have (Note [shapes as written]).
    A number (`false * x` of a `Tensor[]` x) misses every piece: a tensor of none of their shapes, `()`."""
    dummies = {op: sympy.Dummy() for op in expr.atoms(TensorOp)}
    elementwise = expr.xreplace(dummies).free_symbols
    if not dummies and not elementwise & tensors:
        return tuple(sorted(pieces, key=sort_key))
    try:
        own = tensor.shape_of(expr, shapes)
    except ShapeError:
        own = None
    missing = []
    for piece in sorted(pieces, key=sort_key):
        if piece.tensor is not None and piece.tensor in elementwise:
            continue
        if own is not None and piece.dims is not None and set(piece.batch) <= expr.free_symbols:
            try:
                if shape_rules.broadcast(own, piece.dims) == own:
                    continue
            except ShapeError:
                pass
        missing.append(piece)
    return tuple(missing)


def widened(shape: Shape, as_written: Callable[[ast.expr], Pieces] | None, node: ast.expr) -> Shape:
    """`shape`, SymPy's of `node`, broadcast with the shape `node` has as written (`as_written`: its pieces)."""
    try:
        return shape if as_written is None else shape_rules.broadcast(shape, broadcast_all(as_written(node)))
    except ShapeError:  # SymPy's shape decides (as for the pieces of dropped terms)
        return shape


# Note [reductions of constant dimensions]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# `sum(where(x > 9, 1, 1) * mean(x, dim=-1, keepdim=true), dim=-1)` sums D equal terms: SymPy
# simplifies the operand to `mean(x, dim=-1, keepdim=true)`, of shape [N, 1], and a sum over its
# last dimension would be the mean itself. The reader reduces over the dims of the operand's shape
# as written (Note [shapes as written]); along a dim the simplified operand has as 1, or lacks, it
# is constant, so the reduction is the one over the operand's own dims with that constant's
# count: `n * sum`, `mean` and `amax` as they are, `logsumexp + log(n)`, `sqrt(n) * norm`, and the
# variance of the own dims' entries taken n times, `var(.., correction=0) * m / (m - correction)`
# with m all the entries (0 when no own dim is left: every entry the same). With `keepdim` a
# dim the operand lacks comes back as a leading 1. The count's sizes are the dims as written,
# taken at call time as every named dimension's; a reduction over every dimension of a term that
# lacks the batch dimensions `...` (`sum(where(x > 9, 1, 1) * w)`, `w` a Tensor[D]) counts the batch
# of the inputs the term has as written too, as torch does (`size:%x`, Note [counts of unknown
# shapes]); one of a term that keeps the batch but is narrower elsewhere (`[..., 1, M]` of `[..., N, M]`)
# is read from the mean over every dimension of the term, which counts its own entries at call time
# (`_whole_with_batch`). The norm of a number is its absolute value.


def batch_names(as_written: Callable[[ast.expr], Pieces] | None, node: ast.expr) -> tuple[str, ...]:
    """The inputs whose batch dimensions `...` `node` has as written (`as_written`: its pieces)."""
    pieces = as_written(node) if as_written is not None else frozenset()
    return tuple(sorted({s.name for piece in pieces for s in piece.batch}))


def constant_reduction(
    kind: str,
    operand: sympy.Expr,
    shapes: tuple[Shape, Shape],
    how: tuple[tuple[int, ...], bool, int],
    batch: tuple[str, ...],
) -> sympy.Expr:
    """The reduction `kind` over `found` of `operand`, of shape `shape`, as if it had the shape `full`
    it has as written, with the batch dimensions `...` of the inputs `batch` (Note [reductions of
    constant dimensions])."""
    (shape, full), (found, keepdim, correction) = shapes, how
    assert full is not None
    rank = 0 if not shape else len(split(shape)[1]) + (BATCH in shape)
    if not found and BATCH in full and (BATCH in (shape or ()) or not batch):
        return _whole_with_batch(kind, operand, (shape, full), correction, batch)
    dims = found or tuple(range(-len(full), 0))
    own = tuple(d for d in dims if -d <= rank and shape[d] == full[d])  # type: ignore[index]
    kept = tuple(d for d in dims if -d <= rank)  # the operand's dims: own, and those it has as 1
    sizes = {d: batch_count_size(batch) if full[d] == BATCH else dim_size(str(full[d])) for d in dims}
    count: sympy.Expr = sympy.Mul(*(sizes[d] for d in dims if d not in own and full[d] != 1))
    base = tensor.reduction(kind, operand, kept, keepdim, 0 if kind == "var" else correction) if kept else operand
    if kind == "norm" and not kept:  # the norm of one entry is its size
        base = sympy.Abs(operand)
    if kind == "sum":
        result = count * base
    elif kind == "logsumexp":
        result = base + sympy.log(count)
    elif kind == "norm":
        result = sympy.sqrt(count) * base
    elif kind == "var":
        entries = count * sympy.Mul(*(sizes[d] for d in own if full[d] != 1))
        result = base * entries / (entries - correction) if own else sympy.S.Zero
    else:  # mean, amax
        result = base
    lacking = [d for d in dims if -d > rank]  # leading dims the operand lacks
    if keepdim and lacking and base.free_symbols and len(lacking) == len(full) - rank:
        for _ in lacking:  # they come back as leading ones, as the reduction as written has them
            result = tensor.Unsqueeze(result, sympy.Integer(-rank - 1))
            rank += 1
    return result


def _whole_with_batch(
    kind: str, operand: sympy.Expr, shapes: tuple[Shape, Shape], correction: int, batch: tuple[str, ...]
) -> sympy.Expr:
    """A reduction over every dimension of an operand of shape `shape` with the batch dimensions `...`,
    narrower than the shape `full` it has as written (`sum(l * y)` of a [..., 1, M] that is [..., N, M]
    as written): each of its entries stands for equally many entries of the term as written, so the
    term's mean, maximum and population variance are the operand's, and its sum is its entries'
    count (`batch`'s batch count times its named dims, at call time) times the mean."""
    shape, full = shapes
    assert full is not None
    if kind == "norm" or not batch:
        raise ShapeError(
            f"{kind}() over every dimension of a term of {show(shape)}, {show(full)} as written: reduce"
            f" its named dimensions first ({kind}({kind}(..., dim=-1)))"
        )
    entries = batch_count_size(batch) * sympy.Mul(*(dim_size(str(d)) for d in full if d not in (BATCH, 1)))
    if kind in ("mean", "amax"):
        return tensor.reduction(kind, operand, (), False)
    if kind == "sum":
        return entries * tensor.reduction("mean", operand, (), False)
    return tensor.reduction("var", operand, (), False, 0) * entries / (entries - correction)


def number_or_operand(operand: sympy.Expr, shape: Shape, full: Shape, scope: Any) -> tuple[sympy.Expr, Shape]:
    """A reduction's operand of static shape `full` as written that is narrower once the lets are read in:
    a number (`where(l != l, x @ x.T, 100)` with `l = y - y`), or a tensor of fewer dims (`where(s < t,
    x @ x.T, -s)` with `s` and `t` both `sum(x)`). Gradients read the lets in, so the operand read in, of
    its own shape, constant along the other dims of `full` (Note [reductions of constant dimensions]);
    else the operand as it is."""
    value = operand.xreplace(scope.values or {})
    if not full or value == operand:
        return operand, shape
    if not value.free_symbols & scope.tensors:
        return value, ()
    try:
        own = tensor.shape_of(value, scope.shapes)
    except ShapeError:
        return operand, shape
    return (value, own) if own != shape else (operand, shape)


def reduce_or_number(kind: str, operand: sympy.Expr, how: tuple[tuple[int, ...], bool, int], scope: Any) -> sympy.Expr:
    """Note [reductions of a number]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    A reduction over plain Tensors whose operand SymPy simplified to a number (`std(a * l)` with
    `l: atanh(xlogy(sin(x), 1))`, which is 0) reduces entries of a shape known only at call time, and
    a tensor method on the number (`(a * l).var()`) fails. The mean and the maximum of equal entries
    are the entry and their population variance is 0, whatever their count, as are the sum and the
    norm of zeros (`norm(0 * x)`); any other sum, norm, a logsumexp or a corrected variance needs the
    count, and is refused. A let counts by its value (`l`
    above holds the number 0), not by its text (Note [tensor-valued lets])."""
    found, keepdim, correction = how
    # The first reading, without shapes, only orders the formulas: the shapes as written decide later.
    if scope.shapes is None or operand.xreplace(scope.values or {}).free_symbols & scope.tensors:
        return tensor.reduction(kind, operand, found, keepdim, correction)
    if kind in ("mean", "amax"):
        return operand
    if (kind == "var" and correction == 0) or (kind in ("sum", "norm") and operand.xreplace(scope.values or {}) == 0):
        return sympy.S.Zero
    raise ShapeError(
        f"the number {operand} once simplified, over entries counted only at call time; write the number "
        "times the count, or declare the dimensions of the inputs (Tensor[N, D])"
    )


# Note [products along a constant inner dimension]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# `where(l < l, x, l) @ x.T` with `l = sum(x)`: SymPy simplifies the left operand to `l`, a number,
# but torch multiplies the operand as written, `l` broadcast to the shape [N, D] of `x`. An operand
# that lacks the contracted dimension K as written (a number, or a size-1 last dimension of the left
# one, first of the right one's two) is constant along it, so the product is the sum over K of the
# other operand times it: `a @ b` = `a * sum(b, dim=-2, keepdim=true)` (a vector `a`: without
# keepdim), `sum(a, dim=-1, keepdim=true) * b`, and `K * a * b` when both lack K. Dimensions the
# simplified product lacks besides come back from the shape as written (Note [shapes as written]).
# `.T` of a number is the number; of a row [K] as written [N, K], the column `unsqueeze(a, dim=-1)`.


def constant_matmul(a: sympy.Expr, b: sympy.Expr, shapes: tuple[Shape, ...]) -> sympy.Expr | None:
    """`a @ b` of operands of simplified shapes `sa`, `sb` and shapes as written `fa`, `fb` when one lacks
    the contracted dimension (Note [products along a constant inner dimension]); else None."""
    sa, sb, fa, fb = shapes
    if sa is None or sb is None or fa is None or fb is None:
        return None
    (_, own_a), (_, own_b), (_, full_a), (_, full_b) = (split(s) for s in shapes)  # type: ignore[arg-type]
    if not full_a or len(full_b) < 2 or full_a[-1] == 1 or full_a[-1] != full_b[-2]:
        return None
    vector = len(full_a) == 1
    a_lacks = not own_a or (own_a[-1] == 1 and len(own_a) <= len(full_a))
    b_lacks = len(own_b) < 2 or own_b[-2] == 1
    if not (a_lacks or b_lacks) or (vector and b_lacks and len(own_b) > 1):
        return None  # a vector's product with a [1, M] row would keep the 1 that torch's drops
    if a_lacks and b_lacks:
        return dim_size(str(full_a[-1])) * a * b
    if a_lacks:
        return a * tensor.reduction("sum", b, -2, not vector)
    return tensor.reduction("sum", a, -1, True) * b


def constant_transpose(a: sympy.Expr, shape: Shape, full: Shape) -> sympy.Expr | None:
    """`a.T` of an operand narrower than its shape as written `full` (Note [products along a constant
    inner dimension]); else None."""
    if shape is None or full is None or len(split(full)[1]) < 2 or len(split(shape)[1]) >= 2:
        return None
    return a if not split(shape)[1] else tensor.Unsqueeze(a, sympy.Integer(-1))
