"""Emit forward mode: `ForwardPlan` -> the `jvp` staticmethod and what `setup_context` keeps for it.

Receives the op's `Plan` with its `ForwardPlan` (`opgen.plan.forward`), the op's internal names and
its printer; returns lines: `jvp(ctx, *tangents)` (each output's tangent, the sum of the terms
of the input tangents that are not None), the `setup_context` lines that keep what `jvp` reads,
and the name of the jvp-less class the functional uses while `torch.compile` traces it.

Note [jvp and torch.compile]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
On torch 2.13, Dynamo refuses to trace a `torch.autograd.Function` with a custom `jvp`
("Unsupported custom jvp"), so `torch.compile(fullgraph=True)` of an op with one fails. Each
op module therefore also has a subclass whose `jvp` is the base class's, and the functional
applies it while `torch.compiler.is_compiling()`: compiled code keeps working as before, and
eager code (forward mode included) uses the Function with `jvp`. Outside forward mode, `jvp`
costs one `save_for_forward` call of tensors already at hand.
"""

from __future__ import annotations

import copy
import functools
import textwrap
from dataclasses import dataclass

import sympy

from opgen.emit import layout
from opgen.emit.kernel_lines import backward_lines
from opgen.emit.names import temp_names
from opgen.emit.printer import TorchPrinter
from opgen.emit.statements import assign, size_line, text_lines
from opgen.formula.dims import size_stem
from opgen.formula.kinds import with_definitions
from opgen.formula.tensor import ShapeError, dim_size, shape_of
from opgen.plan.backward import Plan
from opgen.plan.forward import ForwardPlan, ForwardVariant, forward_temps
from opgen.records import OutputTangent
from opgen.spec import quote
from opgen.spec.names import Namer, ctx_namer

Lines = list[str]


@dataclass(frozen=True, kw_only=True)
class JvpNames:
    params: dict[str, str]  # input -> jvp parameter holding its tangent
    tangents: dict[str, str]  # returned output -> variable holding its tangent
    step: str  # a term before it is added to a tangent
    temps: dict[sympy.Symbol, str]
    ctx_attrs: dict[str, str]  # non-tensor input -> ctx attribute
    size_attrs: dict[str, str]  # named dimension -> ctx attribute
    compiled: str  # the class without jvp (Note [jvp and torch.compile])
    chosen: str  # the functional's local holding the class it applies


@dataclass(frozen=True)
class JvpSetup:
    inputs: frozenset[str]  # the inputs setup_context must unpack
    outputs: frozenset[str]  # the returned outputs setup_context must unpack
    lines: tuple[str, ...]


def jvp_names(
    plan: Plan,
    forward: ForwardPlan,
    taken: set[str],
    set_attrs: tuple[dict[str, str], dict[str, str]],
    attrs_taken: set[str],
) -> JvpNames:
    """Names for jvp's internals; `taken`: every name of the module, `ctx_attrs`: attributes setup already sets."""
    spec = plan.derived.spec
    namer = Namer(taken)
    params = {i.name: namer.fresh(f"tangent_{i.name}") for i in spec.inputs}
    tangents = {name: namer.fresh(f"tangent_{name}") for name in plan.returned}
    temps = temp_names(plan, [[t for g in v.groups for t in g.temps] for v in forward.variants], "jvp", namer)
    attrs = ctx_namer()
    attrs.taken |= attrs_taken
    ctx_attrs, size_attrs = set_attrs  # what setup_context keeps for backward already
    own = {n: ctx_attrs.get(n) or attrs.fresh(n) for n in forward.ctx_values}
    sizes = {d: size_attrs.get(d) or attrs.fresh(size_stem(d)) for d in forward.dim_sizes}
    compiled = namer.fresh(f"_{spec.function_class_name}NoJvp")
    return JvpNames(
        params=params,
        tangents=tangents,
        step=namer.fresh("step"),
        temps=temps,
        ctx_attrs=own,
        size_attrs=sizes,
        compiled=compiled,
        chosen=namer.fresh("function"),
    )


def jvp_setup(
    plan: Plan,
    forward: ForwardPlan,
    jnames: JvpNames,
    ctx: str,
    set_attrs: set[str],
    sizes: dict[str, tuple[str, tuple[str, ...]]],
) -> JvpSetup:
    """What setup_context adds for jvp; `set_attrs`: ctx attributes it sets already; `sizes`: for
    each named dimension, the source text of its size and the inputs that text reads."""
    saved = layout.call(f"{ctx}.save_for_forward", list(forward.saved), 8)
    lines = layout.body_lines(saved, 8) if forward.saved else []
    spec_inputs = {i.name for i in plan.derived.spec.inputs}
    inputs = {n for n in forward.saved if n in spec_inputs} | set(forward.ctx_values)
    for name in forward.ctx_values:
        if jnames.ctx_attrs[name] not in set_attrs:
            lines.append(f"{ctx}.{jnames.ctx_attrs[name]} = {name}")
    for dim in forward.dim_sizes:
        if jnames.size_attrs[dim] in set_attrs:
            continue
        text, read = sizes[dim]
        lines.append(size_line(f"{ctx}.{jnames.size_attrs[dim]}", text))
        inputs |= set(read)
    returned = set(forward.saved) - spec_inputs
    return JvpSetup(frozenset(inputs), frozenset(returned), tuple(lines))


def backward_jvp(plan: Plan, jnames: JvpNames, function: str, ctx: str) -> tuple[Lines, JvpSetup]:
    """`jvp` as backward's formula (Note [a diagonal Jacobian] in opgen.plan.backward), and what
    setup_context saves for it: what it saves for backward."""
    spec = plan.derived.spec
    (x,) = spec.tensor_inputs
    index = [i.name for i in spec.inputs].index(x.name)  # backward returns one gradient per input
    first = "" if len(spec.inputs) == 1 else f"[{index}]"
    body = [
        f"# elementwise in {x.name}: its Jacobian is diagonal, its own transpose, so the tangent is the gradient",
        f"return {function}.backward({ctx}, {jnames.params[x.name]}){first}",
    ]
    saved = layout.call(f"{ctx}.save_for_forward", list(plan.saved), 8)
    lines = tuple(layout.body_lines(saved, 8)) if plan.saved else ()
    inputs = {i.name for i in spec.inputs}
    return body, JvpSetup(frozenset(set(plan.saved) & inputs), frozenset(set(plan.saved) - inputs), lines)


def _printer(
    plan: Plan, forward: ForwardPlan, variant: ForwardVariant, jnames: JvpNames, printer: TorchPrinter, ctx: str
) -> TorchPrinter:
    """`printer` knowing the tangents, the temporaries of one variant of jvp (variants number theirs alike:
    `jvp5` may be a number in one and a tensor in another) and the sizes jvp reads from `ctx`."""
    jvp = copy.copy(printer)
    jvp.names = dict(printer.names)
    jvp.names |= {s: jnames.params[n] for n, s in forward.tangents.symbols.items()}
    jvp.names |= jnames.temps
    jvp.names |= {dim_size(d): f"{ctx}.{attr}" for d, attr in jnames.size_attrs.items()}
    tangents = frozenset(forward.tangents.symbols.values())
    temps = [(t.symbol, t.expr) for t in forward_temps(variant)]
    # every variant's temporaries leave the op's printer: its tensors may hold a symbol numbered alike
    jvp.tensors = with_definitions((printer.tensors - forward.temps) | tangents, temps)
    jvp.tensor_shapes = dict(printer.tensor_shapes)
    for name, symbol in forward.tangents.symbols.items():
        jvp.tensor_shapes[symbol] = printer.tensor_shapes.get(plan.derived.symbols.inputs[name])
    for symbol, expr in temps:
        try:
            jvp.tensor_shapes[symbol] = shape_of(expr, jvp.tensor_shapes)
        except ShapeError:
            jvp.tensor_shapes[symbol] = None
    return jvp


def _indent(lines: Lines, level: int = 1) -> Lines:
    return [("    " * level + line) if line else line for line in lines]


def _refusals(plan: Plan, variant: ForwardVariant, jnames: JvpNames) -> Lines:
    spec = plan.derived.spec
    lines: Lines = []
    for name, why in variant.refused:
        message = f"{spec.name} ({spec.source}): forward-mode AD along '{name}' is not available: {why}"
        chunks = textwrap.wrap(message, 96, drop_whitespace=False)
        lines += [f"if {jnames.params[name]} is not None:", "    raise NotImplementedError("]
        lines += [f"        {quote.literal(chunk)}" for chunk in chunks] + ["    )"]
    return lines


def _term_lines(
    out: OutputTangent,
    value: sympy.Basic,
    accumulate: bool,
    plan: Plan,
    view: bool,
    jnames: JvpNames,
    printer: TorchPrinter,
    indent: int,
) -> Lines:
    """`tangent_out = term`, or the term added to what `tangent_out` holds (None: nothing yet)."""
    var = jnames.tangents[out.output]
    if view:  # Note [outputs that alias]: the output is a view of an input, so its tangent is a view
        return [*assign(var, value, printer, indent), f"{var} = {var}.view_as({var})"]
    lower = plan.derived.spec.optimize.lower  # `tangent * prime(u)` is a native backward kernel
    write = functools.partial(backward_lines, plan) if lower else assign
    if not accumulate:
        return write(var, value, printer, indent)
    lines = write(jnames.step, value, printer, indent)
    return [*lines, *text_lines(var, f"{jnames.step} if {var} is None else {var} + {jnames.step}", indent)]


def _variant_lines(
    plan: Plan,
    forward: ForwardPlan,
    variant: ForwardVariant,
    jnames: JvpNames,
    printer: TorchPrinter,
    indent: int,
) -> Lines:
    """The tangents of one variant: each input's terms gated on its tangent, zeros for outputs left None."""
    spec = plan.derived.spec
    tensors = [i.name for i in spec.tensor_inputs if i.name not in variant.absent]
    gate = len(tensors) > 1
    lines = _refusals(plan, variant, jnames)
    outputs = [out for out in variant.outputs if out is not None]
    for out in outputs:
        if out.output in forward.zeros or (gate and len(out.terms) > 1):
            lines.append(f"{jnames.tangents[out.output]} = None")
    assigned: set[str] = set()
    placed: set[int] = set()
    inner = indent + 4 * gate
    for name in tensors:
        body: Lines = []
        for k, group in enumerate(variant.groups):
            if name not in group.users or k in placed:
                continue
            placed.add(k)
            temp_lines = [ln for t in group.temps for ln in assign(jnames.temps[t.symbol], t.expr, printer, inner)]
            if len(group.users) > 1 and gate:
                needs = " or ".join(f"{jnames.params[u]} is not None" for u in group.users)
                lines += [f"if {needs}:", *_indent(temp_lines)]
            else:
                body += temp_lines
        for out in outputs:
            for term in out.terms:
                if term.input != name:
                    continue
                # Note [outputs that alias] in opgen.plan.backward: the tangent of a view is a view.
                view = out.output in forward.views and len(out.terms) == 1
                body += _term_lines(out, term.value, out.output in assigned, plan, view, jnames, printer, inner)
                assigned.add(out.output)
        if body:
            lines += [f"if {jnames.params[name]} is not None:", *_indent(body)] if gate else body
    for out in outputs:
        if out.output in forward.zeros:
            var = jnames.tangents[out.output]
            lines += [f"if {var} is None:", f"    {var} = {printer.torch}.zeros_like({out.output})"]
        if out.output in forward.widen:
            var = jnames.tangents[out.output]
            lines += text_lines(var, f"{var}.expand({out.output}.shape)", indent)
    return lines


def jvp_body(plan: Plan, forward: ForwardPlan, jnames: JvpNames, printer: TorchPrinter, ctx: str) -> Lines:
    """The body of `jvp(ctx, *tangents)`."""
    spec = plan.derived.spec
    lines: Lines = []
    if forward.saved:
        targets = list(forward.saved)
        lines += layout.unpacked(targets, f"{ctx}.saved_tensors", 8)
    for name in forward.ctx_values:
        lines.append(f"{name} = {ctx}.{jnames.ctx_attrs[name]}")
    indent = 8 + 4 * forward.varies
    bodies = [
        (v.absent, _variant_lines(plan, forward, v, jnames, _printer(plan, forward, v, jnames, printer, ctx), indent))
        for v in forward.variants
    ]
    optional = [i.name for i in spec.tensor_inputs if i.type.optional]
    if len(bodies) == 1:
        lines += bodies[0][1]
    else:
        for k, (absent, body) in enumerate(bodies):
            condition = " and ".join(f"{n} is None" if n in absent else f"{n} is not None" for n in optional)
            head = "else:" if k == len(bodies) - 1 else f"{'if' if k == 0 else 'elif'} {condition}:"
            lines += [head, *_indent(body)]
    returned = [
        jnames.tangents[n] if out is not None else "None"
        for n, out in zip(plan.returned, forward.variants[-1].outputs, strict=True)
    ]
    lines += layout.returned(returned, 8)
    return lines
