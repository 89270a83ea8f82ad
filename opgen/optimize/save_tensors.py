"""Which tensor operations (softmax, log-softmax, reductions, matmuls) backward reads from a residual.

Note [saved tensor operations]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A tensor operation costs a pass over its input (`COST`), unlike an elementwise kernel: where a
gradient reads one that forward computes anyway (cross-entropy's `log_softmax(input)`), backward
recomputing it is a second pass. `opgen.optimize.save` makes it a residual, a differentiable hidden
output (Note [hidden outputs] there), when that costs no more bytes: the inputs it reads are then
read by no gradient (saved in their place: the same bytes, as PyTorch's own op saves its
log-softmax), or it is reduced (`[N, 1]`: next to nothing). It is offered for one-variant specs
without overrides whose one output is differentiable, not in fused mode.

Double backward differentiates through it: the residual is an output of the Function, so the
gradients read it as autograd's saved output, and backward adds its own vector-Jacobian term
(`vjp_terms`) for the incoming gradient of the residual: the gradient derive gave the part
(Note [parts of the outputs] in opgen.derive.parts), summed over the residuals. That gradient is None in a first-order
backward (`set_materialize_grads(False)`, `Plan.gated_residuals`): the term costs nothing there.
Forward mode gets its tangent from the tensor jvp rules (`opgen.derive.jvp`).
"""

from __future__ import annotations

import sympy
from sympy import Expr

from opgen.derive.gradients import Derived
from opgen.derive.vjp import leaf_fit
from opgen.formula.tensor import (
    LogSoftmax,
    MatMul,
    ReduceAmax,
    ReduceLogSumExp,
    ReduceMean,
    ReduceNorm,
    ReduceSum,
    ReduceVar,
    Shape,
    ShapeError,
    Softmax,
    shape_of,
)

# Relative time of a tensor operation over a tensor (an elementwise add over it is 1): a pass
# over its input, with the exp and log of a softmax; a matmul's inner dimension is unknown here.
COST: dict[type, float] = {
    Softmax: 20,
    LogSoftmax: 20,
    ReduceLogSumExp: 20,
    ReduceSum: 2,
    ReduceMean: 2,
    ReduceAmax: 2,
    ReduceNorm: 4,
    ReduceVar: 6,
    MatMul: 50,
}


def offered(derived: Derived) -> bool:
    """Whether the spec may read tensor operations from residuals (Note [saved tensor operations])."""
    spec = derived.spec
    if len(derived.variants) != 1 or spec.gradients or spec.optimize.fuse or not derived.has_tensor_ops:
        return False
    return len(spec.outputs) == 1 and spec.outputs[0].differentiable


def candidates(derived: Derived, factors: list[Expr]) -> list[Expr]:
    """The costly tensor operations the gradients read that the output's formula computes (not whole,
    and outside every let, which forward computes already), outermost first; each one of the parts
    derive differentiated (Note [parts of the outputs] in opgen.derive.parts)."""
    symbols = derived.symbols
    parts = {p.expr for p in derived.parts if p.tensor_op}
    grads = set(symbols.grads.values())
    (_, output), *_ = derived.full.inlined
    lets = [e for _, e in derived.full.lets]
    found: set[Expr] = set()
    for factor in factors:
        for node in sympy.preorder_traversal(factor):
            if type(node) in COST and node in parts and not node.free_symbols & grads:
                found.add(node)
    found = {n for n in found if output.has(n) and n != output and not any(e.has(n) for e in lets)}
    outer = [n for n in found if not any(o is not n and o.has(n) for o in found)]
    return sorted(outer, key=sympy.default_sort_key)


def reduced(node: Expr, shapes: dict[sympy.Symbol, Shape]) -> bool:
    """Whether `node` is smaller than a tensor input it reads (a kept reduction: `[N, 1]`)."""
    try:
        own = shape_of(node, shapes)
        theirs = [shapes.get(s) for s in node.free_symbols if isinstance(s, sympy.Symbol)]
    except ShapeError:
        return False
    if own is None:
        return False
    ones = sum(d == 1 for d in own)
    return any(t is not None and len(t) == len(own) and ones > sum(d == 1 for d in t) for t in theirs)


def vjp_terms(
    derived: Derived, residuals: list[tuple[Expr, sympy.Symbol, sympy.Symbol]], swap: dict[Expr, Expr]
) -> dict[str, Expr] | None:
    """For each tensor input, the gradient through the residuals `(expr, symbol, grad)` reading them
    from their symbols, as derive gave it for each (`Derived.parts`); None when one would need fitting
    to its input unlike the op's gradient."""
    shapes = dict(derived.shapes)
    for expr, symbol, grad in residuals:
        shapes[symbol] = shapes[grad] = shape_of(expr, shapes)
    parts = {p.expr: p for p in derived.parts if p.tensor_op}
    if any(parts[e].derivatives is None for e, _, _ in residuals):
        return None  # a shape rule refused the gradient through one
    terms: dict[str, Expr] = {}
    for gradient in derived.full.gradients:
        x = derived.symbols.inputs[gradient.input]
        # The residuals' incoming gradients add up (each part's gradient is linear in its own).
        through = [parts[e].derivative(gradient.input).xreplace({parts[e].grad: g}) for e, _, g in residuals]
        try:
            total = sympy.Add(*through)
            fit = leaf_fit(total, x, shapes, 0)
        except ShapeError:
            return None
        if total == 0:
            continue
        if fit != gradient.fit:
            return None  # fitted to the input otherwise than the op's gradient, which the term joins
        terms[gradient.input] = total.xreplace(swap)
    return terms
