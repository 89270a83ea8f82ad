"""How a generated op meets graph captures, autocast and dtypes: decisions from its formulas.

Used by `opgen.emit.op`: `capture_loss` (the functional's export refusal, Note [captured
graphs keep the gradient] in `opgen.emit.capture`), `autocasts` (Note [autocast] there),
`float_inputs` (Note [float inputs] there), `promoted_inputs` (Note [mixed dtypes] there).
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


def autocasts(plan: Plan) -> bool:
    """The op multiplies matrices (`@`): under autocast it casts its inputs as `torch.matmul` does."""
    return any(e.has(MatMul) for v in plan.derived.variants for _, e in (*v.lets, *v.outputs))


def float_inputs(plan: Plan) -> list[tuple[str, bool]]:
    """The Tensor inputs a gradient flows to, each with whether it is optional: they must be
    real floating-point tensors."""
    names = {g.input for bp in plan.backward for g in bp.grads if g.contributions or g.overridden}
    return [(i.name, i.type.optional) for i in plan.derived.spec.tensor_inputs if i.name in names]


def promoted_inputs(plan: Plan) -> list[tuple[str, bool]]:
    """The floating inputs the functional casts to their promoted dtype when theirs differ, each with
    whether it is optional; none when the op's forward is a PyTorch op with its own rule for mixed
    dtypes, which forward then applies: `@` (an error, as torch.matmul) and the native layer norm
    (a low-precision input keeps its dtype beside float32 parameters; other mixes are an error)."""
    inputs = float_inputs(plan)
    exprs = [e for v in plan.derived.variants for _, e in (*v.lets, *v.outputs)]
    if len(inputs) < 2 or autocasts(plan) or any(e.has(LayerNorm) for e in exprs):
        return []
    return inputs
