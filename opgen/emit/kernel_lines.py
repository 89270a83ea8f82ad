"""Emission of the native kernels: how `forward` and `backward` call a lowered primitive.

Used by `opgen.emit.forward` and `opgen.emit.backward`: `forward_printer` lets `Function.forward`
print primitives as their in-place forms (Note [forward in place]); `backward_lines` writes a
gradient whose kernel node (opgen.nodes.kernels) PyTorch can compute in one pass, with the
formula for double backward where the kernel has no derivative (Note [native backward kernels]
in opgen.nodes.kernels), or in place where the primitive says so (its `in_place_backward`).
"""

from __future__ import annotations

from sympy import Expr

from opgen.emit.printer import TorchPrinter
from opgen.emit.statements import assign, assign_block, under_transforms
from opgen.nodes.base import UnderTransforms
from opgen.nodes.kernels import KernelBackward, Prime
from opgen.plan.backward import Plan
from opgen.plan.blocks import GRAD


def forward_printer(printer: TorchPrinter) -> TorchPrinter:
    """A printer for `Function.forward`, which autograd never records (Note [forward in place]).

    Note [forward in place]
    ~~~~~~~~~~~~~~~~~~~~~~~
    `torch.autograd.Function.forward` runs with autograd off, so a primitive may print there
    as in-place operations on the temporaries it creates itself (the printer's `no_grad`
    setting): every temporary of a 1M-element float32 formula is a fresh 4 MB buffer, and on
    CPU getting the memory costs as much as the arithmetic. Backward, which autograd records
    under `create_graph=True`, prints the plain calls, except where it tests for that.

    Note [in place under vmap]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~
    Under vmap the incoming gradient may be batched while the saved input is not (`jacrev`,
    per-example cotangents; `autograd.grad(is_grads_batched=True)`, which gradcheck's
    `check_batched_grad` uses), and `unbatched.mul_(batched)` is an error. An in-place backward
    kernel therefore takes the plain branch when the incoming gradient is a batched tensor of
    the legacy vmap (what `is_grads_batched` uses) or a functorch transform is active.
    torch.compile takes that branch too (it cannot trace the legacy test; Inductor fuses the
    plain operations anyway).
    Forward needs no test: tests/test_transforms.py batches each input of every spec alone.
    """
    return printer.with_symbols({}, frozenset(), no_grad=True)


def backward_lines(plan: Plan, var: str, total: Expr, printer: TorchPrinter, indent: int) -> list[str]:
    """`var = total`, through a native backward kernel where `total` is one (`g * prime(u)`), or where it is a
    kernel torch.func transforms take as its formulas, the kernel's call and those formulas."""
    if isinstance(total, UnderTransforms):
        return under_transforms(var, total, plan.block(total), printer, indent)
    node = plan.kernel(total)
    if node is None:
        return assign(var, total, printer, indent)
    if not isinstance(node, KernelBackward):  # an output's kernel: it has a derivative
        return assign(var, node, printer, indent)
    primitive = node.primitive
    if primitive.backward_differentiable and not primitive.backward_in_place:
        return assign(var, node, printer, indent)
    # Double backward records backward: the formula, each repeated part computed once.
    g, *args = node.args
    formula = plan.block(Prime(primitive.__name__, *args))
    recorded = assign_block([var], formula, printer, indent + 4, ({GRAD: g},))
    if primitive.backward_in_place:
        (u,) = args
        unrecorded = primitive.in_place_backward(var, printer._print(g), printer._print(u), printer)
        return [
            f"if {printer.runtime.may_work_in_place}({printer._print(g)}):  # in place on its own temporaries",
            *(f"    {line}" for line in unrecorded),
            "else:",
            *(f"    {line}" for line in recorded),
        ]
    unrecorded = assign(var, node, printer, indent + 4)
    why = f"{primitive.__name__}'s kernel has {primitive.backward_why}"
    return [
        f"if {printer.torch}.is_grad_enabled():  # double backward: {why}",
        *(f"    {line}" for line in recorded),
        "else:",
        *(f"    {line}" for line in unrecorded),
    ]
