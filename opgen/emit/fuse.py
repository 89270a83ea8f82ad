"""Fused mode (`optimize: {fuse: true}` or `opgen generate --fuse`): compiled forward and backward math.

Receives the `Plan`, names and printer of one op and the forward lines `emit` wrote; returns
two module-level functions wrapped in `torch.compile` -- the forward formulas, and every
gradient at once -- and how `forward` and `backward` call them. Inductor fuses each into
one loop over the elements, so no temporary tensor is written to memory.

Note [fused backward]
~~~~~~~~~~~~~~~~~~~~~
A compiled function cannot be differentiated again (AOTAutograd has no double backward),
so `backward` calls the compiled gradients only when autograd is not recording
(`torch.is_grad_enabled()` is false unless `create_graph=True`); otherwise it runs the
plain differentiable code below, exactly as without fusion; so it does under vmap, which
compiled code does not take from eager (Note [in place under vmap]). The compiled gradients are
the derivative formulas themselves (primitives written out), so inductor sees one
expression per gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from opgen.emit.annotations import TypeNames, define, input_type, param, tensors
from opgen.emit.printer import TorchPrinter
from opgen.emit.statements import assign
from opgen.formula.syntax import is_elementwise
from opgen.nodes.kernels import Prime, Primitive
from opgen.plan.backward import Plan
from opgen.spec.model import Spec


@dataclass(frozen=True)
class Fused:
    helpers: list[list[str]]  # module-level functions, as lines
    forward: list[str]  # the new body of Function.forward
    backward_fast: list[str]  # lines for Function.backward, after the saved tensors are unpacked


def fusable(plan: Plan) -> bool:
    """Elementwise, one variant, derived gradients of differentiable outputs, no shapes kept on ctx."""
    derived = plan.derived
    spec = derived.spec
    return (
        is_elementwise(spec)
        and len(derived.variants) == 1
        and not plan.gate_none
        and not plan.shapes
        and all(not g.overridden and g.contributions for g in plan.backward[-1].grads)
        and all(o.differentiable for o in spec.outputs)
        and not all(_one_kernel(e) for _, e in derived.full.outputs)
        and not any(e.is_Symbol for _, e in derived.full.outputs)
    )


def _one_kernel(expr: sympy.Basic) -> bool:
    """A single call of tensors (`F.silu(x)`): PyTorch's kernel is as fused as it gets."""
    if isinstance(expr, Primitive) and not expr.fast:
        return False
    return isinstance(expr, sympy.Function) and all(a.is_Symbol or a.is_number for a in expr.args)


def _indented(lines: list[str]) -> list[str]:
    return ["    " + line for line in lines]


def _type_of(spec: Spec, name: str, types: TypeNames) -> str:
    """A compiled helper's parameter: an input's own type, else a tensor (saved or an incoming gradient)."""
    inp = spec.input(name)
    return input_type(inp.type, types) if inp is not None else types.tensor


def _fresh(base: str, taken: set[str]) -> str:
    name = base
    while name in taken:
        name = "_" + name
    taken.add(name)
    return name


def _written_out(expr: sympy.Basic) -> sympy.Basic:
    """Primitives and their derivatives as formulas, which inductor fuses with what surrounds them."""
    expr = expr.replace(lambda e: isinstance(e, Primitive), lambda e: e.fused_form())
    return expr.replace(lambda e: isinstance(e, Prime), lambda e: e.fused_form())


def fuse(
    plan: Plan,
    torch: str,
    grads_in: dict[str, str],
    grads_out: dict[str, str],
    printer: TorchPrinter,
    forward: list[str],
    taken: set[str],
    types: TypeNames,
) -> Fused:
    """The compiled helpers of `plan`'s op, typed and laid out as the rest of the module; `taken`
    holds every name the module already uses."""
    derived = plan.derived
    spec = derived.spec
    symbols = derived.symbols
    bp = plan.backward[-1]
    forward_name = _fresh(f"_{spec.name}_forward", taken)
    backward_name = _fresh(f"_{spec.name}_gradients", taken)
    params = [i.name for i in spec.inputs]
    decorator = f"@{torch}.compile"
    variant = derived.full
    body = [
        line
        for name, expr in (*variant.lets, *variant.outputs)
        for line in assign(name, _written_out(expr), printer, 4)
    ]
    body.append(forward[-1])  # forward's own `return`
    typed = [param(i.name, input_type(i.type, types)) for i in spec.inputs]
    forward_helper = [decorator, define(forward_name, typed, tensors(len(spec.outputs), types), 0), *_indented(body)]
    inputs = [*plan.saved, *plan.ctx_values, *(grads_in[o.name] for o in spec.outputs)]
    body = []
    for group in bp.groups:
        for temp in group.temps:
            body += assign(printer.names[temp.symbol], _written_out(temp.expr), printer, 4)
    for grad in bp.grads:
        # A contribution of no one output already holds its incoming gradients (a share of a negated pair).
        terms = (c.factor if c.output is None else symbols.grads[c.output] * c.factor for c in grad.contributions)
        body += assign(grads_out[grad.input], _written_out(sum(terms, sympy.S.Zero)), printer, 4)
        if grad.reduce:
            body.append(f"{grads_out[grad.input]} = {grads_out[grad.input]}.sum_to_size({grad.input}.shape)")
    returned = [grads_out[i.name] for i in spec.tensor_inputs]
    body.append(f"return ({returned[0]},)" if len(returned) == 1 else f"return {', '.join(returned)}")
    typed = [param(name, _type_of(spec, name, types)) for name in inputs]
    gradients_type = f"{types.builtin['tuple']}[{', '.join([types.tensor] * len(returned))}]"
    backward_helper = [decorator, define(backward_name, typed, gradients_type, 0), *_indented(body)]
    gradients = _fresh("gradients", taken)
    position = iter(range(len(returned)))
    results = ", ".join(f"{gradients}[{next(position)}]" if i.is_tensor else "None" for i in spec.inputs)
    first = grads_in[spec.outputs[0].name]
    fast = [
        f"if {printer.runtime.first_order_only}({first}):  # compiled code cannot be differentiated again",
        f"    {gradients} = {backward_name}({', '.join(inputs)})",
        f"    return {results}",
    ]
    return Fused([forward_helper, backward_helper], [f"return {forward_name}({', '.join(params)})"], fast)
