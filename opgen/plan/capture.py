"""How a generated op meets graph captures, autocast and dtypes: decisions from its formulas.

Used by `opgen.emit.op`: `capture_loss` (the functional's export refusal, Note [captured
graphs keep the gradient] in `opgen.emit.capture`), `autocast_policy` (Note [autocast] there),
`float_inputs` (Note [float inputs] there), `promotes` (Note [mixed dtypes] there).
"""

from __future__ import annotations

import sympy

from opgen.derive.guard import guard_branches
from opgen.formula.tensor import MatMul
from opgen.nodes.layer_norm import LayerNorm
from opgen.plan.backward import Plan


def capture_loss(plan: Plan) -> str | None:
    """What an inlined forward would lose of this op's gradient, or None when nothing."""
    derived = plan.derived
    overridden = [g.input for g in derived.spec.gradients]
    if overridden:
        return f"the gradient override of {', '.join(overridden)}"
    tensors = derived.symbols.tensors
    exprs = [e for v in derived.variants for _, e in (*v.lets, *v.outputs)]
    if any(isinstance(e, sympy.Expr) and guard_branches(e, tensors) != e for e in exprs):
        return "its guarded `where` branches"
    return None


def multiplies_matrices(plan: Plan) -> bool:
    """The op's formulas use `@` (mixed floating dtypes are then torch.matmul's error)."""
    return any(e.has(MatMul) for v in plan.derived.variants for _, e in (*v.lets, *v.outputs))


def autocast_policy(plan: Plan) -> str | None:
    """What the functional does under autocast (Note [autocast] in opgen.emit.capture): the spec's
    `autocast:`; else, for an op with `@`, `float32` where its formulas also multiply tensors outside
    `@` (a bilinear form, a squared distance: PyTorch's `bilinear` and `cdist` run in float32 under
    CPU autocast) and `lower` (autocast's dtype, as torch.matmul) otherwise; None for an op without `@`,
    left to type promotion as PyTorch's elementwise ops are."""
    spec = plan.derived.spec
    if spec.autocast is not None:
        return spec.autocast
    if not multiplies_matrices(plan):
        return None
    tensors = plan.derived.symbols.tensors
    exprs = [e for v in plan.derived.variants for _, e in (*v.lets, *v.outputs) if isinstance(e, sympy.Basic)]
    return "float32" if any(_multiplies_tensors(e, tensors) for e in exprs) else "lower"


def _multiplies_tensors(expr: sympy.Basic, tensors: frozenset[sympy.Symbol]) -> bool:
    """A product of two tensor-valued factors, or a power of one, outside the operands of `@`."""
    if isinstance(expr, MatMul):
        return False
    if isinstance(expr, sympy.Mul) and sum(bool(a.free_symbols & tensors) for a in expr.args) >= 2:
        return True
    if isinstance(expr, sympy.Pow) and expr.base.free_symbols & tensors:
        return True
    return any(_multiplies_tensors(a, tensors) for a in expr.args)


def float_inputs(plan: Plan) -> list[tuple[str, bool]]:
    """The Tensor inputs a gradient flows to, each with whether it is optional: the functional casts
    an integer or bool one to a floating dtype and refuses a complex one."""
    names = {g.input for bp in plan.backward for g in bp.grads if g.contributions or g.overridden}
    return [(i.name, i.type.optional) for i in plan.derived.spec.tensor_inputs if i.name in names]


def promotes(plan: Plan) -> bool:
    """Whether the functional casts mixed floating inputs to their promoted dtype; not when the op's
    forward is a PyTorch op with its own rule for mixed dtypes, which forward then applies: `@` (an
    error, as torch.matmul) and the native layer norm (a low-precision input keeps its dtype beside
    float32 parameters; other mixes are an error)."""
    exprs = [e for v in plan.derived.variants for _, e in (*v.lets, *v.outputs)]
    return not (multiplies_matrices(plan) or any(e.has(LayerNorm) for e in exprs))
