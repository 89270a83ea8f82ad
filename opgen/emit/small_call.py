"""Small calls: an op that is exactly one PyTorch op calls that op for inputs of few elements.

Note [small calls]
~~~~~~~~~~~~~~~~~~
At a few thousand elements a kernel takes a few microseconds and the Python a custom
`torch.autograd.Function` runs per call does not: `apply`, `forward`, `setup_context` and, in
backward, the Python node with `backward` itself. Measured at 4096 float32 elements, forward
and backward (torch 2.13, one thread), even a Function whose forward and backward are one
kernel call each takes about 1.4x PyTorch's op with its C++ autograd node; a generated op
cannot get under that while it is a Function.

When the plan found that the op *is* one PyTorch op -- its one output is a primitive the
lowering recognised (`silu(x)`, `softplus_beta(x, beta)`, ...) or `sigmoid`/`tanh` of a
Tensor input, with plain numbers or non-tensor inputs for its other arguments, no let, no
residual, no expansion and no gradient override -- then PyTorch's own autograd formula for that
op is the gradient opgen derived (its backward kernel: Note [native backward kernels]), its
double backward, forward-mode AD and vmap rule are PyTorch's, and calling the op is the same
function, forward and backward. The functional then calls it directly, after its call-time
checks (which stay: every error is raised as before), for inputs of fewer than
`<Function>.native_below` elements (16384: above it the Function's in-place forms and smaller
saved tensors win, as for mish and gelu_tanh; below it the per-call cost dominates). The
Function is unchanged and is what `apply` and larger inputs use.

Under torch.compile the functional calls the Function as always (Dynamo cannot read the
Function's class attribute, and a compiled graph has no per-call cost to cut). Not for the
custom_op form (the op must stay one torch.library op), fused specs (the compiled loop is
their point), or ops under autocast casting. The generated tests run every check
through the Function (an autouse fixture sets `native_below` to 0) and check the small-call
path against the reference on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from opgen.emit.printer import TorchPrinter
from opgen.formula import functions as fn
from opgen.optimize import kernels as k
from opgen.plan.backward import Plan
from opgen.plan.capture import autocasts

NATIVE_BELOW = 16384  # elements; Note [small calls]


@dataclass(frozen=True)
class SmallCall:
    tensor: str  # the Tensor input whose element count decides
    call: str  # PyTorch's op called on the functional's arguments
    below: int = NATIVE_BELOW


def _native_node(expr: sympy.Basic) -> bool:
    """One PyTorch op whose own autograd has every derivative the Function has (not F.hardsigmoid's second)."""
    if isinstance(expr, k._Primitive):  # every primitive of k.PRIMITIVES
        return bool(expr.native_twice)
    return isinstance(expr, (fn.sigmoid, sympy.tanh))


def native_op(plan: Plan) -> tuple[str, sympy.Basic] | None:
    """The Tensor input and the one PyTorch op the whole op is, if it is one (Note [small calls])."""
    derived = plan.derived
    spec = derived.spec
    if spec.custom_op or spec.optimize.fuse or autocasts(plan) or plan.residuals or len(derived.variants) != 1:
        return None
    variant = derived.variants[0]
    if variant.lets or variant.expand or len(variant.outputs) != 1 or not spec.outputs[0].differentiable:
        return None
    if len(spec.tensor_inputs) != 1 or spec.tensor_inputs[0].type.optional:
        return None
    if any(g.overridden for bp in plan.backward for g in bp.grads):
        return None
    (_, expr), tensor = variant.outputs[0], spec.tensor_inputs[0]
    if not _native_node(expr) or expr.args[0] != derived.symbols.inputs[tensor.name]:
        return None
    others = {derived.symbols.inputs[i.name] for i in spec.inputs if not i.is_tensor and i.type.kind != "bool"}
    if any(not (a.is_number or a in others) for a in expr.args[1:]):
        return None
    return tensor.name, expr


def small_call(plan: Plan, printer: TorchPrinter) -> SmallCall | None:
    """PyTorch's op the functional calls for small inputs, where the op is exactly one (Note [small calls])."""
    found = native_op(plan)
    return None if found is None else SmallCall(found[0], printer.doprint_expr(found[1]))
