"""Plan stage for forward mode: `Tangents` -> what `jvp` computes, gated on which tangents exist.

Receives `Derived`, the residuals, the outputs that alias (Note [outputs that alias] in
opgen.plan.backward) and the `Tangents` of `opgen.derive.jvp`; returns the `ForwardPlan` that
`opgen.plan.backward.plan` puts in the op's `Plan`: the terms of every output's tangent after
common subexpressions are shared (`sympy.cse(order='canonical')`), the temporaries grouped by
the input tangents that use them (so work is gated on `tangent is not None`, as backward gates
on `needs_input_grad`), and what `setup_context` must keep for `jvp`: inputs and outputs through `ctx.save_for_forward`,
non-tensor inputs as `ctx` attributes (Note [what backward may use] holds for `jvp` too).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import sympy

from opgen.derive.gradients import Derived, Variant
from opgen.derive.jvp import OutputTangent, Tangents, Term, VariantTangents, tangent_symbol
from opgen.formula.tensor import has_tensor_ops, is_dim_size, shape_of
from opgen.optimize.save import Residual
from opgen.plan.conditions import Temp, TempGroup, cse_as_written, inline_conditions, read_multiples
from opgen.plan.kernel_calls import kernel_factors

if TYPE_CHECKING:
    from opgen.plan.backward import Plan


@dataclass(frozen=True)
class ForwardVariant:
    absent: tuple[str, ...]
    groups: tuple[TempGroup, ...]  # temporaries, grouped by the input tangents that use them
    outputs: tuple[OutputTangent | None, ...]  # terms after CSE; None: not differentiable
    refused: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ForwardPlan:
    tangents: Tangents
    variants: tuple[ForwardVariant, ...]
    saved: tuple[str, ...]  # inputs then returned outputs, given to save_for_forward
    ctx_values: tuple[str, ...]  # non-tensor inputs jvp reads
    dim_sizes: tuple[str, ...]  # named dimensions whose size jvp reads
    varies: bool  # jvp branches on which `Tensor?` inputs are None
    temps: frozenset[sympy.Symbol]
    zeros: frozenset[str]  # outputs whose tangent may have no term at run time: zeros of the output
    widen: frozenset[str] = frozenset()  # outputs whose tangent may be smaller (broadcast): expanded to them
    views: frozenset[str] = frozenset()  # outputs that are an input as-is: their tangent is a view of its tangent
    copies: frozenset[str] = frozenset()  # outputs that are an input as-is, returned as a copy (`_copies`)


def _plan_variant(variant: VariantTangents) -> ForwardVariant:
    values = [t.value for out in variant.outputs if out is not None for t in out.terms]
    # `tangent * prime(u)` is a native backward kernel's `grad * prime(u)` (Note [native backward kernels]).
    flat: list[sympy.Basic] = [group[0] for group in kernel_factors([[v] for v in values])]
    symbols = sympy.numbered_symbols("jvp:", cls=sympy.Symbol, real=True)
    replacements, reduced = cse_as_written(flat, symbols)
    temps, reduced = inline_conditions(replacements, reduced)
    temps, reduced = read_multiples(temps, reduced)
    outputs: list[OutputTangent | None] = []
    users: dict[sympy.Symbol, set[str]] = {t.symbol: set() for t in temps}
    position = 0
    for out in variant.outputs:
        if out is None:
            outputs.append(None)
            continue
        terms = []
        for term in out.terms:
            value = reduced[position]
            position += 1
            if value == 0:  # a factor that vanished once written out (`(a < a) * x`): no term
                continue
            terms.append(Term(term.input, value))
            for symbol in value.free_symbols & users.keys():
                users[symbol].add(term.input)
        outputs.append(OutputTangent(out.output, tuple(terms)))
    for temp in reversed(temps):
        for symbol in temp.expr.free_symbols & users.keys():
            users[symbol] |= users[temp.symbol]
    groups: list[TempGroup] = []
    for temp in temps:
        key = tuple(sorted(users[temp.symbol]))
        if groups and groups[-1].users == key:
            groups[-1] = TempGroup(key, (*groups[-1].temps, temp))
        else:
            groups.append(TempGroup(key, (temp,)))
    return ForwardVariant(variant.absent, tuple(groups), tuple(outputs), variant.refused)


def _used(variant: ForwardVariant) -> set[sympy.Symbol]:
    used: set[sympy.Symbol] = set()
    for group in variant.groups:
        for temp in group.temps:
            used |= temp.expr.free_symbols
    for out in variant.outputs:
        for term in out.terms if out is not None else ():
            used |= term.value.free_symbols
    return used


def _may_be_zero(derived: Derived, out: OutputTangent) -> bool:
    """Whether no term may be computed: jvp is called when some Tensor input has a tangent."""
    tensors = {i.name for i in derived.spec.tensor_inputs}
    return {t.input for t in out.terms} != tensors or not out.terms


def _views(derived: Derived, variant: Variant) -> frozenset[str]:
    """The outputs that are a Tensor input as-is: forward returns a view of it (Note [outputs that alias])."""
    inputs = set(derived.symbols.tensor_inputs)
    return frozenset(name for name, expr in variant.inlined if expr in inputs)


def _copies(variant: VariantTangents, aliases: frozenset[str]) -> frozenset[str]:
    """The outputs that are an input as-is whose tangent is not that input's tangent (an override that
    scales it: `-alpha * grad`): forward returns a copy (Note [outputs that alias]), since torch wants
    the tangent of a view to be a view of the input's tangent."""
    return frozenset(
        out.output
        for out in variant.outputs
        if out is not None and out.output in aliases and any(t.value != tangent_symbol(t.input) for t in out.terms)
    )


def plan_forward(
    derived: Derived, residuals: tuple[Residual, ...], aliases: tuple[frozenset[str], ...], tangents: Tangents
) -> ForwardPlan:
    """What `jvp` computes; `aliases`: per variant, the outputs forward returns as a view (`Plan.aliases`)."""
    spec, symbols = derived.spec, derived.symbols
    views = [_views(derived, v) for v in derived.variants]
    copies = frozenset().union(*(_copies(v, a) for v, a in zip(tangents.variants, views, strict=True)))
    views = [v - copies for v in views]
    checked = tangents.variants
    variants = tuple(_plan_variant(v) for v in checked)
    full = variants[-1]
    varies = any(
        (v.groups, v.outputs) != (full.groups, _without(full.outputs, v.absent)) or v.refused != full.refused
        for v in variants
    )
    chosen = variants if varies else variants[-1:]
    used = set().union(*(_used(v) for v in chosen))
    zeros = frozenset(out.output for v in chosen for out in v.outputs if out is not None and _may_be_zero(derived, out))
    # A term may have fewer dimensions than its output (the tangent of `b` in `x * z + b`, or of a reduction
    # in `sum(x) - (x / x) ** 2`, whose other term SymPy made a number): torch wants the output's shape.
    # Outputs that are an input as-is (Note [outputs that alias]) keep the input tangent's view.
    # One the forward expands to its shape as written (`where(c, x, x)` over x and z) widens as any other.
    expanded = {name for v in derived.variants for name, pieces in v.expand if pieces}
    # Only an output that is an input as-is in every variant: `x + 2 * p` is `x` when p is None, and wider when not.
    aliased = frozenset.intersection(*aliases) - expanded - copies if aliases else frozenset()
    viewed = frozenset().union(*views)
    widen = frozenset(
        out.output
        for v in checked  # before CSE: the terms as derived, whose shapes the plan knows
        for out in v.outputs
        if out is not None
        and out.output not in aliased
        and (len(spec.tensor_inputs) > 1 or any(_narrower(derived, out.output, t) for t in out.terms))
    )
    saved = [i.name for i in spec.tensor_inputs if symbols.inputs[i.name] in used or (varies and i.type.optional)]
    returned = {o: symbols.outputs[o] for o in symbols.outputs} | {r.name: r.symbol for r in residuals}
    # What the Function returns (`Plan.returned`): the spec's outputs, then the residuals.
    order = [*(o.name for o in spec.outputs), *(r.name for r in residuals)]
    saved += [name for name in order if returned[name] in used or name in zeros | widen]
    ctx_values = tuple(i.name for i in spec.inputs if not i.is_tensor and symbols.inputs[i.name] in used)
    dim_sizes = tuple(sorted(s.name.split(":", 1)[1] for s in used if is_dim_size(s)))
    temps = frozenset(t.symbol for v in variants for g in v.groups for t in g.temps)
    return ForwardPlan(
        tangents, chosen, tuple(saved), ctx_values, dim_sizes, varies, temps, zeros, widen, viewed, copies
    )


def _narrower(derived: Derived, output: str, term: Term) -> bool:
    """Whether a term of one input's tangent may have fewer dimensions than its output: through a
    reduction, where another term SymPy made a number kept the output's shape as written."""
    if not has_tensor_ops(term.value):
        return False
    table = {**derived.shapes, tangent_symbol(term.input): derived.shapes[derived.symbols.inputs[term.input]]}
    try:
        return shape_of(term.value, table) != derived.shapes.get(derived.symbols.outputs[output])
    except Exception:  # noqa: BLE001 - a shape this check cannot work out: expand, which is always right
        return True


def _without(outputs: tuple[OutputTangent | None, ...], absent: tuple[str, ...]) -> tuple[OutputTangent | None, ...]:
    """The all-present tangents without the terms of the `absent` inputs."""
    return tuple(
        None if out is None else replace(out, terms=tuple(t for t in out.terms if t.input not in absent))
        for out in outputs
    )


def forward_temps(variant: ForwardVariant) -> tuple[Temp, ...]:
    return tuple(t for group in variant.groups for t in group.temps)


# Note [refused tangents]
# ~~~~~~~~~~~~~~~~~~~~~~~
# jvp raises for the tangent of an input whose gradient override is not linear in the incoming
# gradient (`clamp(grad * w, -c, c)`): it has no Jacobian. Autograd gives a custom jvp zeros for
# the inputs that have no tangent unless `ctx.set_materialize_grads(False)`, so forward mode along
# another input (`w` of `tanh(x) * w`, `torch.func.jacfwd(..., argnums=1)`) raised as well. Such an
# op turns materializing off: a missing tangent is None. The flag holds for backward too, which
# then gets None for an output whose gradient autograd does not define; it fills it with zeros (or
# returns None for every input when no output has a gradient), as autograd would have.


def filled_incoming(plan: Plan) -> tuple[str, ...]:
    """The differentiable outputs whose incoming gradient backward fills with zeros where it is None,
    because jvp refuses a tangent (Note [refused tangents]); empty where autograd fills them or
    another rule reads None (`gate_none`, `gated_residuals`)."""
    refused = {name for v in plan.forward.variants for name, _ in v.refused}
    others = {i.name for i in plan.derived.spec.tensor_inputs} - refused  # a tangent jvp takes
    if not refused or not others or plan.gate_none or plan.gated_residuals:
        return ()
    return tuple(o.name for o in plan.derived.spec.outputs if o.differentiable)


def filled_shapes(plan: Plan) -> tuple[str, ...]:
    """The outputs of `filled_incoming` whose shape setup_context keeps for backward's zeros: with one,
    backward only returns early."""
    filled = filled_incoming(plan)
    return filled if len(filled) > 1 else ()
