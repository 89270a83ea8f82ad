"""Reductions over every dimension of plain `Tensor`s or of a batch `...`: how many entries they
take and how their gradient spreads (Note [counts of unknown shapes] in opgen.formula.dims).

Receives a reduction node and the static shapes of the inputs; returns its count as a size symbol
known at call time, or its gradient spread over its operand's run-time shape; a reduction whose
operand is not elementwise in its inputs is a `ShapeError`.
"""

from __future__ import annotations

import sympy
from sympy import Expr

from opgen.formula.dims import (
    BATCH,
    Dim,
    Shape,
    ShapeError,
    batch_count_size,
    broadcast_shape,
    count_size,
    dim_size,
    show,
)
from opgen.formula.shape_rules import broadcast
from opgen.formula.tensor import BroadcastTo, ReductionBase, TensorOp, dims_count, shape_of


def elementwise_leaves(node: ReductionBase, table: dict[sympy.Symbol, Shape]) -> tuple[str, ...]:
    """The tensor inputs a reduction over every dimension of `...` or of a plain `Tensor` reaches
    without passing another tensor operation; its operand must have their broadcast shape (Note
    [counts of unknown shapes]), else a `ShapeError`."""
    shape = shape_of(node.operand, table)
    leaves = plain_leaves(node.operand, table)
    reached: Shape = ()
    for leaf in leaves:
        reached = broadcast(reached, table[leaf])
    if not leaves or reached != shape:
        raise ShapeError(
            f"{node.spec_name}() over every dimension of {show(shape)}: its operand is not elementwise in its"
            " tensor inputs, so how many entries it has is not known; name the dims (dim=(-2, -1))"
        )
    return tuple(sorted(leaf.name for leaf in leaves))


def plain_leaves(expr: sympy.Basic, table: dict[sympy.Symbol, Shape]) -> set[sympy.Symbol]:
    """The tensor inputs `expr` reaches without passing a tensor operation (numbers and scalars broadcast away)."""
    leaves: set[sympy.Symbol] = set()
    stack: list[sympy.Basic] = [expr]
    while stack:
        sub = stack.pop()
        if isinstance(sub, sympy.Symbol) and table.get(sub, ()) != ():
            leaves.add(sub)
        elif not isinstance(sub, TensorOp):
            stack.extend(sub.args)
    return leaves


def broadcast_count(expr: sympy.Basic, table: dict[sympy.Symbol, Shape]) -> Expr | None:
    """How many entries `expr` has when it is elementwise in the tensors it reaches: the count of their
    broadcast, known at call time (Note [counts of unknown shapes]); None when it is not. The gradient
    of a scalar part of `expr` (a whole reduction, `mean(x)` in `sum(x - mean(x))`) is a constant
    gradient of `expr` times this count."""
    leaves = plain_leaves(expr, table)
    reached: Shape = ()
    for leaf in leaves:
        reached = broadcast(reached, table[leaf])
    if not leaves or reached != shape_of(expr, table):
        return None
    return count_size(tuple(sorted(leaf.name for leaf in leaves)))


def reduction_count(node: ReductionBase, table: dict[sympy.Symbol, Shape]) -> Expr:
    """How many entries `node` (a `mean`, `var` or `std`) takes together: a product of named
    dimension sizes, or over every dimension of a shape with `...` or of a plain `Tensor`, the
    count of the broadcast of the inputs its operand is elementwise in (Note [counts of unknown shapes])."""
    count = _count(node, table)
    correction = getattr(node, "correction", 0)
    if count.is_Integer and 0 < count <= correction:  # torch divides by no entries, or fewer
        what = "one entry" if count == 1 else f"{count} entries"
        raise ShapeError(f"var()/std() of {what} with correction={correction} is NaN; write correction=0")
    return count


def _count(node: ReductionBase, table: dict[sympy.Symbol, Shape]) -> Expr:
    if node.dims:
        return dims_count(shape_of(node.operand, table), node.dims, f"{node.spec_name}()")
    shape = shape_of(node.operand, table)
    if shape is not None and all(d == 1 for d in shape):  # a `Tensor[]`, a number, `[1, 1]`: one entry
        return sympy.Integer(1)
    if shape and shape[0] == BATCH and broadcast_count(node.operand, table) is None:
        return _batch_count(node.operand, shape, table)
    return count_size(elementwise_leaves(node, table))


def _batch_count(operand: Expr, shape: tuple[Dim, ...], table: dict[sympy.Symbol, Shape]) -> Expr:
    """The count of an operand over a batch that is not elementwise in its inputs: the size of the
    broadcast of the batches of the inputs it reaches, times its named dimensions (Note [counts of
    unknown shapes])."""
    leaves: set[sympy.Symbol] = set()
    stack: list[sympy.Basic] = [operand]
    while stack:
        sub = stack.pop()
        if isinstance(sub, ReductionBase) and sub.every_dim:
            continue  # one number for the whole batch: the batch does not reach the operand through it
        if isinstance(sub, sympy.Symbol) and (table.get(sub) or ())[:1] == (BATCH,):
            leaves.add(sub)
        stack.extend(sub.args)
    count: Expr = batch_count_size(tuple(sorted(leaf.name for leaf in leaves)))
    for dim in shape[1:]:
        if dim != 1:
            count *= dim_size(str(dim))
    return count


def whole_reduction_of_plain(expr: sympy.Basic, table: dict[sympy.Symbol, Shape]) -> bool:
    """Whether `expr` reduces plain Tensors over every dimension (Note [counts of unknown shapes])."""
    return any(
        isinstance(n, ReductionBase) and n.every_dim and shape_of(n.operand, table) is None
        for n in sympy.preorder_traversal(expr)
    )


def spread_to_operand(grad: Expr, node: ReductionBase, table: dict[sympy.Symbol, Shape]) -> Expr:
    """The gradient `grad` of a reduction over every dimension of plain Tensors, expanded to the shape
    of its operand when that is a broadcast of several inputs (Note [counts of unknown shapes])."""
    if shape_of(node.operand, table) is not None:
        return grad
    leaves = elementwise_leaves(node, table)
    return BroadcastTo(grad, broadcast_shape(leaves)) if len(leaves) > 1 else grad
