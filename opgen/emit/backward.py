"""The body of `Function.backward`: each input's gradient, gated on `ctx.needs_input_grad`.

Temporaries the plan shares between gradients go before the first gradient that reads them;
each gradient is fitted to its input's shape (Note [gradient shapes] in opgen.plan.backward).
"""

from __future__ import annotations

import functools

import sympy

from opgen.emit import layout
from opgen.emit.kernel_lines import backward_lines
from opgen.emit.names import OpNames, variant_printer
from opgen.emit.printer import TorchPrinter
from opgen.emit.statements import Lines, assign, indent_lines, text_lines, variant_branches
from opgen.nodes.base import UnderTransforms
from opgen.plan.backward import BackwardPlan, GradPlan, Plan
from opgen.plan.forward import filled_incoming


def _needs(names: OpNames, plan: Plan, inputs: tuple[str, ...]) -> str:
    spec = plan.derived.spec
    index = {i.name: k for k, i in enumerate(spec.inputs)}
    return " or ".join(f"{names.ctx}.needs_input_grad[{index[n]}]" for n in inputs)


def _grad_lines(plan: Plan, grad: GradPlan, names: OpNames, printer: TorchPrinter) -> Lines:
    """`grad_<input> = ...`, fitted to the input's shape (Note [gradient shapes])."""
    var = names.grads_out[grad.input]
    first_grad = names.grads_in[next(iter(plan.incoming))]
    lines: Lines = []
    on_ctx = (
        grad.input not in plan.saved or grad.input in names.shape_attrs
    )  # Note [saved for the gradients that read it]
    shape = f"{names.ctx}.{names.shape_attrs.get(grad.input)}" if on_ctx else f"{grad.input}.shape"
    if not grad.contributions:
        if plan.gate_none or plan.derived.has_tensor_ops:
            return [f"{var} = None  # {grad.input} has a zero gradient"]
        # As plain autograd gives it: the incoming gradient times 0, a function of it (double
        # backward and forward-over-reverse see a differentiable zero), in the input's own shape,
        # which may be larger than the output's (`x + 0 * z`).
        # Declared dimensions need not broadcast with the output's: the zero summed to a number, then
        # spread over the input's shape. Still a function of the incoming gradient: a fresh zero
        # (`new_zeros`) has no tangent, and gradgradcheck's forward-over-reverse check gave it the
        # incoming gradient's shape (`x1: Tensor[K, M]` read only for its size K).
        zero = f"({first_grad} * 0)"
        declared = plan.derived.spec.input(grad.input).type.dims is not None  # type: ignore[union-attr]
        if grad.reduce and declared:
            return [f"{var} = {zero}.sum().expand({shape})"]
        if declared:  # an output that is a number of another shape (`sum(where(l != l, x @ x.T, 1), dim=-2)`)
            return [f"{var} = None  # {grad.input} has a zero gradient"]
        if grad.reduce:
            broadcast = f"{names.torch}.broadcast_shapes({first_grad}.shape, {shape})"
            return [f"{var} = {zero}.expand({broadcast}).sum_to_size({shape})"]
        lines.append(f"{var} = {zero}")
    elif plan.gated_residuals and not grad.overridden:
        lines += _residual_terms(plan, grad, names, printer)
        if grad.contributions[0].factor.free_symbols & _residual_grads(plan):
            fit = _fit_lines(grad, var, names, shape, _indent_of(plan, 4))
            return lines + ([f"if {var} is not None:", *indent_lines(fit)] if fit else [])
    elif grad.overridden or grad.contributions[0].output is None:
        expr = grad.contributions[0].factor
        text = printer.doprint_expr(expr)
        if not printer.is_tensor(expr) and grad.overridden and grad.expand:
            lines.append(f"{var} = {first_grad}.new_tensor({text})")  # the override's value at every element
        elif not printer.is_tensor(expr):
            lines.append(f"{var} = {names.torch}.full_like({first_grad}, {text})")
        else:
            lines += _assign(plan, var, expr, printer, _indent_of(plan, 3))
    elif plan.gate_none:
        return _gated_sum(plan, grad, names, printer, shape)
    elif grad.separate:
        terms = [plan.incoming[c.output] * c.factor for c in grad.contributions if c.output]
        return [f"{var} = " + " + ".join(f"{printer._postfix(t)}.sum_to_size({shape})" for t in terms)]
    else:
        total = sum((plan.incoming[c.output] * c.factor for c in grad.contributions if c.output), sympy.S.Zero)
        if plan.derived.spec.optimize.lower:
            lines += backward_lines(plan, var, total, printer, _indent_of(plan, 3))
        else:
            lines += _assign(plan, var, total, printer, _indent_of(plan, 3))
    return lines + _fit_lines(grad, var, names, shape, _indent_of(plan, 3))


def _assign(plan: Plan, var: str, expr: sympy.Basic, printer: TorchPrinter, indent: int) -> Lines:
    """`var = expr`; a kernel torch.func transforms take as its formulas, the call and those formulas."""
    if isinstance(expr, UnderTransforms):
        return backward_lines(plan, var, expr, printer, indent)
    return assign(var, expr, printer, indent)


def _fit_lines(grad: GradPlan, var: str, names: OpNames, shape: str, indent: int) -> Lines:
    if grad.expand and grad.reduce:
        fitted = f"{var}.expand({names.torch}.broadcast_shapes({var}.shape, {shape})).sum_to_size({shape})"
    elif grad.expand:
        fitted = f"{var}.expand({shape})"
    elif grad.reduce:
        fitted = f"{var}.sum_to_size({shape})"
    else:
        return []
    return text_lines(var, fitted, indent)


def _residual_grads(plan: Plan) -> set[sympy.Symbol]:
    return {r.grad for r in plan.residuals if r.differentiable}


def _residual_terms(plan: Plan, grad: GradPlan, names: OpNames, printer: TorchPrinter) -> Lines:
    """The gradient through tensor operations, each term through a residual only where the residual's
    incoming gradient is not None (Note [saved tensor operations] in opgen.optimize.save_tensors)."""
    var = names.grads_out[grad.input]
    lines: Lines = []
    assigned = False
    write = functools.partial(backward_lines if plan.derived.spec.optimize.lower else _assign, plan)
    for contribution in grad.contributions:
        grads = sorted(contribution.factor.free_symbols & _residual_grads(plan), key=sympy.default_sort_key)
        if not grads and not assigned:
            lines += write(var, contribution.factor, printer, _indent_of(plan, 3))
            assigned = True
            continue
        term = f"{var}_{'saved' if grads else 'more'}"
        body = write(term, contribution.factor, printer, _indent_of(plan, 3) + 4 * bool(grads))
        if not grads:
            lines += [*body, f"{var} = {var} + {term}"]
            continue
        incoming = [names.grads_in[g.name.split(":", 1)[1]] for g in grads]
        lines.append(f"if {' or '.join(f'{n} is not None' for n in incoming)}:")
        lines += _zeros_for_none(plan, grads, incoming, printer, names) if len(grads) > 1 else []
        lines += indent_lines(body)
        total = f"{var} + {term}" if assigned else f"{term} if {var} is None else {var} + {term}"
        lines.append(f"    {var} = {total}")
    return lines


def _zeros_for_none(
    plan: Plan, grads: list[sympy.Symbol], incoming: list[str], printer: TorchPrinter, names: OpNames
) -> Lines:
    """A term through several residuals runs when any of their incoming gradients is not None, the
    None ones as zeros: in double backward a residual read only by a comparison (`amax`'s) gets
    None while another (`var`'s) gets a gradient, whose term must not be dropped with it."""
    residual = {r.grad: r for r in plan.residuals}
    return [
        f"    {n} = {names.torch}.zeros_like({printer.doprint_expr(residual[g].symbol)}) if {n} is None else {n}"
        for g, n in zip(grads, incoming, strict=True)
    ]


def _gated_sum(plan: Plan, grad: GradPlan, names: OpNames, printer: TorchPrinter, shape: str) -> Lines:
    """The sum of the contributions whose incoming gradient is not None (`set_materialize_grads(False)`)."""
    var = names.grads_out[grad.input]
    lines: Lines = []
    for k, contribution in enumerate(grad.contributions):
        assert contribution.output is not None
        incoming = names.grads_in[contribution.output]
        product = plan.incoming[contribution.output] * contribution.factor
        term = printer.doprint_expr(product)
        if grad.separate:
            term = f"{printer._postfix(product)}.sum_to_size({shape})"
        lines.append(f"if {incoming} is not None:")
        if k == 0:
            lines.append(f"    {var} = {term}")
        else:
            lines += _first_or_sum(var, term, _indent_of(plan, 3) + 4)
    if grad.reduce and not grad.separate:
        lines.append(f"if {var} is not None:")
        lines.append(f"    {var} = {var}.sum_to_size({shape})")
    return lines


def _first_or_sum(var: str, term: str, indent: int) -> Lines:
    """`var = term if var is None else var + term`, one line where it fits, else as `ruff format` splits it."""
    line = f"{var} = {term} if {var} is None else {var} + {term}"
    if indent + len(line) <= layout.LINE_LENGTH:
        return [f"    {line}"]
    return [f"    {var} = (", f"        {term}", f"        if {var} is None", f"        else {var} + {term}", "    )"]


def _temp_lines(plan: Plan, temps: tuple, names: OpNames, printer: TorchPrinter) -> Lines:
    lines: Lines = []
    for temp in temps:
        # A gradient two inputs share, negated (Note [gradients that negate another]): a backward kernel's call.
        write = functools.partial(backward_lines if temp.kernel and plan.derived.spec.optimize.lower else _assign, plan)
        lines += write(names.temps[temp.symbol], temp.expr, printer, _indent_of(plan, 3))
    return lines


def _indent_of(plan: Plan, level: int) -> int:
    """The indentation of a statement `level` deep in a method (a gradient's, under its `needs_input_grad`
    test where the plan gates gradients), one more inside variant branches."""
    return 4 * (level - (not plan.gates_gradients) + plan.varies)


def _backward_variant(plan: Plan, bp: BackwardPlan, names: OpNames, printer: TorchPrinter) -> Lines:
    printer = variant_printer(printer, bp, names)
    lines: Lines = []
    placed: set[int] = set()
    for grad in bp.grads:
        # Temporaries shared by several gradients go before the first of them, gated on any.
        for k, group in enumerate(bp.groups):
            if k in placed or grad.input not in group.users or len(group.users) == 1:
                continue
            placed.add(k)
            lines.append(f"if {_needs(names, plan, group.users)}:")
            lines += indent_lines(_temp_lines(plan, group.temps, names, printer))
        own = [t for g in bp.groups if g.users == (grad.input,) for t in g.temps]
        body = _temp_lines(plan, tuple(own), names, printer) + _grad_lines(plan, grad, names, printer)
        if not plan.gates_gradients:
            return lines + body
        lines.append(f"if {_needs(names, plan, (grad.input,))}:")
        lines += indent_lines(body)
    return lines


def _filled_lines(plan: Plan, names: OpNames) -> Lines:
    """None for every input when no output has a gradient, else zeros for those without one (Note
    [refused tangents] in opgen.plan.forward, Note [no zeros for outputs without a gradient] in
    opgen.plan.backward)."""
    filled = filled_incoming(plan) or plan.lone_incoming
    incoming = [names.grads_in[name] for name in filled]
    if not incoming:
        return []
    nones = ", ".join("None" for _ in plan.derived.spec.inputs)
    lines = [f"if {' and '.join(f'{g} is None' for g in incoming)}:", f"    return {nones}"]
    for name, grad in zip(filled, incoming, strict=True):
        others = [g for g in incoming if g != grad]
        if not others:
            continue
        present = others[-1]
        for other in reversed(others[:-1]):
            present = f"({other} if {other} is not None else {present})"
        lines.append(f"if {grad} is None:")
        lines += indent_lines(text_lines(grad, f"{present}.new_zeros({names.ctx}.{names.shape_attrs[name]})", 12))
    return lines


def backward_body(plan: Plan, names: OpNames, printer: TorchPrinter) -> Lines:
    spec = plan.derived.spec
    lines: Lines = _filled_lines(plan, names)
    if plan.saved:
        lines += layout.unpacked(list(plan.saved), f"{names.ctx}.saved_tensors", 8)
    for name in plan.ctx_values:
        lines.append(f"{name} = {names.ctx}.{names.ctx_attrs[name]}")
    for residual in plan.residuals:
        if residual.recompute and residual.name in plan.saved:  # Note [saved rstd] in opgen.optimize.norms
            lines.append(f"if {names.torch}.is_grad_enabled() or {names.runtime.transforms_active}():")
            lines += indent_lines(assign(residual.name, residual.expr, printer, 12))
    saved_residual = next((r.name for r in plan.residuals if r.name in plan.saved), None)
    for name in plan.gated_residuals:  # Note [saved tensor operations] in opgen.optimize.save_tensors
        incoming = names.grads_in[name]
        lines.append(f"if {incoming} is None:")
        zeros = f"{saved_residual}.new_zeros({names.ctx}.{names.shape_attrs[name]})"
        lines += indent_lines(text_lines(incoming, zeros, 12))
    grad_vars = [names.grads_out[i.name] for i in spec.tensor_inputs]
    if plan.gates_gradients or plan.gate_none or plan.gated_residuals:  # some gradient may stay None
        lines.append(" = ".join([*grad_vars, "None"]))
    optional = [i.name for i in spec.tensor_inputs if i.type.optional]
    is_none = {n: f"{n} is None" for n in optional}
    variants = plan.backward if plan.varies else plan.backward[-1:]  # Plan.varies
    bodies = [(bp.absent, _backward_variant(plan, bp, names, printer)) for bp in variants]
    lines += variant_branches(bodies, optional, is_none)
    returned = [names.grads_out[i.name] if i.is_tensor else "None" for i in spec.inputs]
    lines += layout.returned(returned, 8)
    return lines
