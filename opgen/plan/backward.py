"""Plan stage: `Derived` -> what backward computes, in which order, from what it saved.

Receives `Derived`, the residuals `opgen.optimize.save` chose and the `Tangents` of
`opgen.derive.jvp`; returns a `Plan`, built once and never changed after: common
subexpressions of the gradient factors (`sympy.cse(order='canonical')`, so output does not
depend on the machine), which temporaries each input's gradient needs (so work is gated on
`needs_input_grad`), which inputs, outputs and residuals `setup_context` must save, which
non-tensor values and shapes it keeps on `ctx`, how forward returns each output, and what `jvp`
computes (`opgen.plan.forward`). Every
decision is made here, before anything prints; the emitters only print the plan.

Note [what backward may use]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Backward is built only from saved inputs and outputs and plain numbers, with differentiable
torch ops, so autograd can differentiate it again (double backward). No tensor is ever
stored on `ctx` as an attribute; only non-tensor inputs and shapes are.

Note [gradient shapes]
~~~~~~~~~~~~~~~~~~~~~~
A gradient returned from backward has exactly its input's shape, whatever the formula:
- broadcast inputs: the gradient is summed back to the input's shape (`reduce`);
- outputs of different shapes (`y: x`, `u: x + z` with `z` larger than `x`): each output's
  contribution is summed on its own (`separate`), since adding them first would broadcast
  the smaller one and count it once per row of the larger;
- an override that may not span its input (`w: 2 * grad * x` has `x`'s shape, `x: z` may
  have fewer dimensions than `x`): broadcast to the input's shape, then summed to it
  (`expand` and `reduce`); the generated tests fit the override's value the same way;
- a zero gradient: zeros of the input's shape, which may be larger than the output's
  (`y: x + 0 * z`), or None where backward may return None (Note [what backward may use]).

Note [no zeros for outputs without a gradient]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Autograd hands a Function's backward zeros for every output that got no gradient, made at
each call (layer_norm's saved mean and rstd: two `zeros` before its one kernel), unless
`ctx.set_materialize_grads(False)`. Outputs marked non-differentiable never get one, so
where every output but one is (`Plan.lone_incoming`), the zeros buy nothing: such a
Function turns materializing off (`Plan.unmaterialized`) and backward reads only the lone
output's gradient, returning None for every input when that is None too (gradcheck calls
backward so, `check_undefined_grad`; autograd does not). Forward mode then gets None for an
input without a tangent; jvp gates every tangent on it.

Note [outputs that alias]
~~~~~~~~~~~~~~~~~~~~~~~~~
Each output of the Function is its own tensor, as each output of plain autograd of the
formula has its own `requires_grad` and gradient path. An output whose value is an input,
or the tensor an earlier output already returns (`b: a`, `o: l1` with `l1: l0`, `l0: x`),
is returned as a new view of it: `src.view_as(src)` when differentiable (autograd then
records this Function for it, and saving the input stays legal), `src.detach()` when not
(`mark_non_differentiable` of a view of an input would leave it requiring grad). One whose
tangent is not the input's tangent (a gradient override that scales it, `-alpha * grad`) is
returned as a copy, `src.clone()`: torch wants the tangent of a view to be a view of the
input's tangent, so forward mode could not give it (`opgen.plan.forward._copies`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import sympy
from sympy import Expr

from opgen.derive.gradients import Contribution, Derived, Gradient, Variant
from opgen.derive.jvp import Tangents
from opgen.formula.kinds import with_definitions
from opgen.formula.syntax import is_elementwise
from opgen.formula.tensor import has_tensor_ops, is_dim_size
from opgen.optimize.save import Residual
from opgen.plan.blocks import Block, blocks_of
from opgen.plan.conditions import Temp, TempGroup, cse_as_written, inline_conditions, read_multiples
from opgen.plan.forward import ForwardPlan, plan_forward
from opgen.plan.kernel_calls import kernel_calls, kernel_factors
from opgen.plan.kinks import kink_of_output, shared_kinks
from opgen.plan.numbers import pull_numbers
from opgen.plan.shares import may_share_negations, named_shares, shared_negations, shared_products


@dataclass(frozen=True)
class GradPlan:
    input: str
    index: int  # position in the op's inputs (needs_input_grad, return tuple)
    contributions: tuple[Contribution, ...]  # factors after CSE; empty: a zero gradient
    overridden: bool
    reduce: bool  # sum back to the input's shape (it may have been broadcast)
    expand: bool = False  # expand to the input's shape (a reduction left a dimension out)
    separate: bool = False  # sum each contribution to the input's shape on its own


@dataclass(frozen=True)
class BackwardPlan:
    absent: tuple[str, ...]
    groups: tuple[TempGroup, ...]
    grads: tuple[GradPlan, ...]


@dataclass(frozen=True)
class Plan:
    derived: Derived
    saved: tuple[str, ...]  # inputs then outputs, as given to save_for_backward
    ctx_values: tuple[str, ...]  # non-tensor inputs backward reads
    shapes: tuple[str, ...]  # inputs whose shape backward needs and that are not saved
    backward: tuple[BackwardPlan, ...]  # one per variant, same order as derived.variants
    gate_none: bool  # several differentiable outputs: a None incoming gradient adds nothing
    temps: frozenset[sympy.Symbol]  # every temporary symbol
    forward: ForwardPlan  # what `jvp` computes (opgen.plan.forward)
    dim_sizes: tuple[str, ...] = ()  # named dimensions whose size backward needs (mean), kept on ctx
    aliases: tuple[frozenset[str], ...] = ()  # per variant: outputs returned as a view (Note [outputs that alias])
    residuals: tuple[Residual, ...] = ()  # returned after the outputs, for backward only (Note [hidden outputs])
    varies: bool = False  # backward differs between variants: it branches on the saved `Tensor?` inputs
    # What forward computes with its parts shared, and the formulas of the kernels backward and jvp
    # call (opgen.plan.blocks), by the statement's value, the kernel node or the primitive's derivative.
    blocks: tuple[tuple[Expr, Block], ...] = ()
    # The statements of backward and jvp that one backward kernel computes, with its node (opgen.plan.kernel_calls).
    kernels: tuple[tuple[Expr, Expr], ...] = ()
    jvp_is_backward: bool = False  # Note [a diagonal Jacobian]
    # Saved tensors only some gradients read, with the inputs whose gradients read them (Note [saved for
    # the gradients that read it]).
    saved_for: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def block(self, key: Expr) -> Block:
        """The block of a forward statement's value, a kernel node or a primitive's derivative."""
        return self._blocks[key]

    @functools.cached_property
    def _blocks(self) -> dict[Expr, Block]:
        return dict(self.blocks)

    def kernel(self, value: Expr) -> Expr | None:
        """The backward kernel's node that computes a statement's `value`, or None (where the spec lowers)."""
        return self._kernels.get(value)

    @functools.cached_property
    def _kernels(self) -> dict[Expr, Expr]:
        return dict(self.kernels)

    @property
    def returned(self) -> tuple[str, ...]:
        """What the Function returns: the spec's outputs, then the residuals."""
        return (*(o.name for o in self.derived.spec.outputs), *(r.name for r in self.residuals))

    @property
    def incoming(self) -> dict[str, sympy.Symbol]:
        """The incoming gradient of each differentiable output and of each residual."""
        return self.derived.symbols.grads | {r.name: r.grad for r in self.residuals}

    @property
    def gates_gradients(self) -> bool:
        """Backward tests `ctx.needs_input_grad` before each gradient: autograd calls it only when some
        input needs one, so with a single Tensor input, always there, every test would pass."""
        inputs = self.derived.spec.tensor_inputs
        return len(inputs) > 1 or any(i.type.optional for i in inputs)

    @property
    def unmaterialized(self) -> bool:
        """Backward takes None, not zeros, for the incoming gradient of an output without one: where some
        rule reads None, and for a lone differentiable output (Note [no zeros for outputs without a gradient])."""
        return self.gate_none or bool(self.gated_residuals) or bool(self.lone_incoming)

    @property
    def lone_incoming(self) -> tuple[str, ...]:
        """The one differentiable output of a Function whose other outputs have no gradient (Note [no
        zeros for outputs without a gradient]); backward returns None for every input where it has none."""
        spec = self.derived.spec
        differentiable = [o.name for o in spec.outputs if o.differentiable]
        differentiable += [r.name for r in self.residuals if r.differentiable]
        if len(differentiable) != 1 or len(self.returned) == 1 or self.gate_none or self.gated_residuals:
            return ()
        return tuple(differentiable)

    @property
    def gated_residuals(self) -> tuple[str, ...]:
        """The outputs whose incoming gradient backward makes zeros where it is None: with tensor operations
        read from differentiable residuals, whose incoming gradients are left None unless used
        (Note [saved tensor operations] in opgen.optimize.save_tensors)."""
        if not self.derived.has_tensor_ops or not any(r.differentiable for r in self.residuals):
            return ()
        return tuple(o.name for o in self.derived.spec.outputs if o.differentiable)


def _temp_symbols() -> sympy.utilities.iterables.numbered_symbols:
    return sympy.numbered_symbols("tmp:", cls=sympy.Symbol, real=True)


def _plan_variant(
    derived: Derived, variant: Variant, index_of: dict[str, int], residuals: tuple[Residual, ...]
) -> BackwardPlan:
    factors: list[Expr] = []
    owners: list[str] = []
    # Derivatives that cannot be kernels written out, so their parts are shared (Note [native backward kernels]).
    negations = may_share_negations(derived, variant, residuals)
    numbers = frozenset(s for n, s in derived.symbols.inputs.items() if n not in derived.symbols.tensor_names)
    written = [[pull_numbers(c.factor, numbers) for c in g.contributions] for g in variant.gradients]
    kernel_ready = kernel_factors(written, negations)
    for gradient, ready in zip(variant.gradients, kernel_ready, strict=True):
        factors += ready
        owners += [gradient.input] * len(ready)
    outputs = [c.output for g in variant.gradients for c in g.contributions]
    shared: list[tuple[sympy.Symbol, Expr]] = []
    if negations:
        factors, outputs, shared = shared_negations(factors, outputs, derived.symbols.grads)
        conditions = kink_of_output(derived, variant)
        factors, outputs, kinks = shared_kinks(factors, outputs, derived.symbols.grads, conditions)
        shared += kinks
        if is_elementwise(derived.spec):
            factors, outputs, products = shared_products(factors, outputs, owners, derived.symbols.grads)
            shared += products
    replacements, reduced = cse_as_written([*factors, *(e for _, e in shared)], _temp_symbols())
    temps, reduced = inline_conditions(replacements, reduced, masks=True)
    temps, reduced = read_multiples(temps, reduced)
    temps, reduced = named_shares(temps, reduced, shared)
    temps, reduced = _gated_inline(temps, reduced, {r.grad for r in residuals if r.differentiable})
    # Which gradients use each temporary, directly or through a later temporary.
    users: dict[sympy.Symbol, set[str]] = {t.symbol: set() for t in temps}
    for expr, owner in zip(reduced, owners, strict=True):
        for symbol in expr.free_symbols & users.keys():
            users[symbol].add(owner)
    for temp in reversed(temps):
        for symbol in temp.expr.free_symbols & users.keys():
            users[symbol] |= users[temp.symbol]
    order = [g.input for g in variant.gradients]
    groups: list[TempGroup] = []
    for temp in temps:
        key = tuple(sorted(users[temp.symbol], key=order.index))
        if groups and groups[-1].users == key:
            groups[-1] = TempGroup(key, (*groups[-1].temps, temp))
        else:
            groups.append(TempGroup(key, (temp,)))
    present_tensors = [i for i in derived.spec.tensor_inputs if i.name not in variant.absent]
    may_broadcast = len(present_tensors) > 1
    grads = []
    position = 0
    for gradient in variant.gradients:
        contributions = []
        for _ in gradient.contributions:
            factor, output = reduced[position], outputs[position]
            position += 1
            if factor != 0 or gradient.overridden:
                contributions.append(Contribution(output, factor))
            # else a factor that vanished once written out (`(a < a) * x`): no term, and with none
            # left the gradient is a zero tensor of the input's shape (Note [gradient shapes]).
        grad = _grad_plan(derived, variant, gradient, tuple(contributions), index_of, may_broadcast, residuals)
        grads.append(grad)
    return BackwardPlan(variant.absent, tuple(groups), tuple(grads))


def _gated_inline(temps: list[Temp], reduced: list[Expr], gated: set[sympy.Symbol]) -> tuple[list[Temp], list[Expr]]:
    """Temporaries that read a residual's incoming gradient put back where they are used: that
    gradient may be None, and only the terms that read it run under `is not None` (Note [saved
    tensor operations] in opgen.optimize.save_tensors); shared, `tmp7 = grad_saved_sum * tmp4` ran
    before the guard and multiplied None."""
    inline: dict[sympy.Symbol, sympy.Basic] = {}
    kept = []
    for temp in temps:
        expr = temp.expr.xreplace(inline)
        if expr.free_symbols & gated:
            inline[temp.symbol] = expr
        else:
            kept.append(dataclasses.replace(temp, expr=expr))
    return kept, [e.xreplace(inline) for e in reduced]


def _grad_plan(
    derived: Derived,
    variant: Variant,
    gradient: Gradient,
    contributions: tuple[Contribution, ...],
    index_of: dict[str, int],
    may_broadcast: bool,
    residuals: tuple[Residual, ...],
) -> GradPlan:
    """How one input's gradient is fitted to the input's shape (Note [gradient shapes])."""
    index = index_of[gradient.input]
    if gradient.fit is not None:
        fit = gradient.fit
        return GradPlan(gradient.input, index, contributions, False, fit.sum_to_size, fit.expand)
    widen = gradient.overridden and not _covers(derived, variant, gradient.input, gradient.contributions)
    separate = may_broadcast and len(_input_sets(derived, variant, contributions, residuals)) > 1
    return GradPlan(
        input=gradient.input,
        index=index,
        contributions=contributions,
        overridden=gradient.overridden,
        reduce=may_broadcast or widen,
        expand=widen,
        separate=separate,
    )


def _input_sets(
    derived: Derived, variant: Variant, contributions: tuple[Contribution, ...], residuals: tuple[Residual, ...]
) -> set[frozenset]:
    """The distinct sets of Tensor inputs of the outputs and residuals the contributions come through."""
    inlined = dict(variant.inlined) | {r.name: r.expr for r in residuals}
    tensors = frozenset(derived.symbols.tensor_inputs)
    # An expanded output also has the shapes its simplified formula lost (Note [shapes as written]).
    lost = {name: frozenset(p.tensor or p for p in pieces) for name, pieces in variant.expand}
    return {
        frozenset(inlined[c.output].free_symbols & tensors) | lost.get(c.output, frozenset())
        for c in contributions
        if c.output is not None
    }


def _covers(derived: Derived, variant: Variant, name: str, contributions: tuple[Contribution, ...]) -> bool:
    """Whether an elementwise gradient has at least its input's shape: it uses the input, or the
    incoming gradient of an output that uses it elementwise (and so broadcasts to its shape)."""
    symbols = derived.symbols
    x = symbols.inputs[name]
    inlined = dict(variant.inlined)
    wide = {symbols.grads[o] for o in symbols.grads if x in inlined[o].free_symbols and not has_tensor_ops(inlined[o])}
    return all(
        not has_tensor_ops(c.factor) and bool(c.factor.free_symbols & ({x} | wide))
        for c in contributions
        if c.output is None
    )


def aliasing_outputs(derived: Derived, variant: Variant) -> frozenset[str]:
    """The outputs whose value is a tensor forward already has (Note [outputs that alias])."""
    symbols = derived.symbols
    bare = {symbols.lets[n]: e for n, e in variant.lets if isinstance(e, sympy.Symbol)}
    bare |= {symbols.outputs[n]: e for n, e in variant.outputs if isinstance(e, sympy.Symbol)}

    def root(symbol: sympy.Symbol) -> sympy.Symbol:
        while symbol in bare:
            symbol = bare[symbol]
        return symbol

    taken = set(symbols.tensor_inputs)
    aliases = set()
    for name, expr in variant.outputs:
        source = root(expr) if isinstance(expr, sympy.Symbol) else symbols.outputs[name]
        if source in taken:
            aliases.add(name)
        taken.add(source)
    return frozenset(aliases)


def same_gradients_in_every_variant(derived: Derived) -> bool:
    """Whether each variant's gradients are the all-present ones minus those of its None inputs."""
    full = derived.full.gradients
    return all(
        variant.gradients == tuple(g for g in full if g.input not in variant.absent) for variant in derived.variants
    )


def _varies(derived: Derived, backward: tuple[BackwardPlan, ...]) -> bool:
    """Whether backward needs a branch per variant (else the all-present body serves every one:
    a None input needs no gradient, `needs_input_grad` is False for it)."""
    if same_gradients_in_every_variant(derived):
        return False
    last = backward[-1]
    return any((bp.groups, bp.grads) != (last.groups, last.grads) for bp in backward)


def _used(backward: tuple[BackwardPlan, ...]) -> set[sympy.Symbol]:
    """The symbols backward reads: its temporaries' and its gradients' factors'."""
    used: set[sympy.Symbol] = set()
    for bp in backward:
        for group in bp.groups:
            for temp in group.temps:
                used |= temp.expr.free_symbols
        for grad in bp.grads:
            for contribution in grad.contributions:
                used |= contribution.factor.free_symbols
    return used


def plan(derived: Derived, residuals: tuple[Residual, ...], tangents: Tangents) -> Plan:
    """The whole plan of the op: backward (here) and `jvp` (`opgen.plan.forward`), decided once."""
    spec = derived.spec
    index_of = {inp.name: i for i, inp in enumerate(spec.inputs)}
    backward = tuple(_plan_variant(derived, v, index_of, residuals) for v in derived.variants)
    used = _used(backward)
    # A statistic backward recomputes where it is differentiated (Note [saved rstd] in opgen.optimize.norms).
    used |= {s for r in residuals if r.recompute and r.symbol in used for s in r.expr.free_symbols}
    symbols = derived.symbols
    varies = _varies(derived, backward)
    # A backward that branches on which `Tensor?` inputs were None saves them (None costs nothing).
    saved = [i.name for i in spec.tensor_inputs if symbols.inputs[i.name] in used or (varies and i.type.optional)]
    saved += [o.name for o in spec.outputs if symbols.outputs[o.name] in used]
    saved += [r.name for r in residuals if r.symbol in used]
    ctx_values = tuple(i.name for i in spec.inputs if not i.is_tensor and symbols.inputs[i.name] in used)
    saved_for = () if varies or spec.optimize.fuse else _saved_for(derived, backward[-1], tuple(saved), residuals)
    unsure = {name for name, _ in saved_for}  # saved or not by needs_input_grad: the shape kept on ctx
    shapes = tuple(
        sorted(
            {
                g.input
                for bp in backward
                for g in bp.grads
                if (g.reduce or g.expand) and g.input not in set(saved) - unsure
            },
            key=index_of.__getitem__,
        )
    )
    differentiable = [o for o in spec.outputs if o.differentiable] + [r for r in residuals if r.differentiable]
    # Gradients through tensor operations take every incoming gradient materialized.
    gate_none = len(differentiable) > 1 and not spec.gradients and not derived.has_tensor_ops
    temps = frozenset(t.symbol for bp in backward for g in bp.groups for t in g.temps)
    dim_sizes = tuple(sorted(s.name.split(":", 1)[1] for s in used if is_dim_size(s)))
    aliases = tuple(aliasing_outputs(derived, v) for v in derived.variants)
    forward = plan_forward(derived, residuals, aliases, tangents)
    statements = [e for v in derived.variants for _, e in (*v.lets, *v.outputs)] + [r.expr for r in residuals]
    blocks = blocks_of(statements, [*_exprs(backward), *_exprs(forward), *(r.expr for r in residuals)])
    return Plan(
        derived=derived,
        saved=tuple(saved),
        ctx_values=ctx_values,
        shapes=shapes,
        backward=backward,
        gate_none=gate_none,
        temps=temps,
        forward=forward,
        dim_sizes=dim_sizes,
        aliases=aliases,
        residuals=residuals,
        varies=varies,
        blocks=blocks,
        jvp_is_backward=_jvp_is_backward(derived, backward, residuals, forward),
        kernels=kernel_calls(_statements(derived, residuals, backward, forward)) if spec.optimize.lower else (),
        saved_for=saved_for,
    )


def _saved_for(
    derived: Derived, bp: BackwardPlan, saved: tuple[str, ...], residuals: tuple[Residual, ...]
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Note [saved for the gradients that read it]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    Each gradient runs under `ctx.needs_input_grad` (`GradPlan.index`), and so do the temporaries
    of the gradients that read them (`TempGroup.users`). A saved input or output that only some
    gradients read is saved only when one of them is needed, `ctx.needs_input_grad` being known in
    `setup_context` already: `kl_div(input, target)` with a target that needs no gradient keeps
    `target` alone, `input` being read by the target's gradient only -- half the bytes plain
    autograd of `x * w` keeps for a `w` without a gradient too. A gradient summed or expanded to its
    input's shape reads that shape from `ctx` (`Plan.shapes`), not from the input. Residuals, what a
    residual is recomputed from, and specs whose backward branches on its variants or is compiled
    (`fuse`) save unconditionally."""
    symbols = derived.symbols
    tensors = {n: s for n, s in (*symbols.inputs.items(), *symbols.outputs.items()) if n in saved}
    fixed = {r.name for r in residuals} | {str(s) for r in residuals for s in r.expr.free_symbols}
    fixed |= {n for n, s in tensors.items() if any(s in r.expr.free_symbols for r in residuals)}
    readers: dict[str, set[str]] = {n: set() for n in tensors}
    for grad in bp.grads:
        used = set().union(*(c.factor.free_symbols for c in grad.contributions))
        used |= {s for g in bp.groups if grad.input in g.users for t in g.temps for s in t.expr.free_symbols}
        for name, symbol in tensors.items():
            if symbol in used:
                readers[name].add(grad.input)
        if grad.input in readers and (grad.separate or not grad.contributions):
            readers[grad.input].add(grad.input)  # its shape fits these (Note [gradient shapes])
    every = {g.input for g in bp.grads}
    order = [g.input for g in bp.grads]
    return tuple(
        (name, tuple(sorted(readers[name], key=order.index)))
        for name in saved
        if name in readers and name not in fixed and readers[name] and readers[name] != every
    )


def _jvp_is_backward(
    derived: Derived, backward: tuple[BackwardPlan, ...], residuals: tuple[Residual, ...], forward: ForwardPlan
) -> bool:
    """Note [a diagonal Jacobian]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    An op elementwise in its one Tensor input, with one output of that input's shape, has a diagonal
    Jacobian: its own transpose. Its tangent `J t` is then its gradient `J^T t`, backward's formula with
    the tangent as the incoming gradient, and `jvp` calls backward (what setup_context saves for
    forward is what it saves for backward). A gradient override is taken so only where it is linear in
    the incoming gradient (`grad * h`: the tangent is `h * t`, Note [jvp of an override] in
    opgen.derive.override_jvp)."""
    spec = derived.spec
    inputs, (output, *more) = spec.tensor_inputs, spec.outputs
    if len(inputs) != 1 or inputs[0].type.optional or more or residuals or not output.differentiable:
        return False
    symbols, variant = derived.symbols, derived.full
    x, y = symbols.inputs[inputs[0].name], symbols.outputs[output.name]
    if derived.has_tensor_ops or variant.expand or forward.views or any(v.refused for v in forward.variants):
        return False
    if any(has_tensor_ops(e) for _, e in (*variant.lets, *variant.outputs)) or derived.shapes.get(
        x
    ) != derived.shapes.get(y):
        return False
    (grad,) = backward[-1].grads
    if not grad.contributions or grad.reduce or grad.expand or grad.separate:
        return False
    g = symbols.grads[output.name]
    overrides = [c.factor for c in grad.contributions if c.output is None]
    return all(f.subs(g, 0) == 0 and not sympy.diff(f, g).has(g) for f in overrides)


def _statements(
    derived: Derived, residuals: tuple[Residual, ...], backward: tuple[BackwardPlan, ...], forward: ForwardPlan
) -> Iterator[tuple[Expr, frozenset[sympy.Symbol]]]:
    """Every value backward and jvp assign (a temporary, a gradient or its terms, a tangent's term), with
    the symbols that hold tensors there."""
    known = derived.symbols.tensors | {r.symbol for r in residuals}
    incoming = derived.symbols.grads | {r.name: r.grad for r in residuals}
    for variant, bp in zip(derived.variants, backward, strict=True):
        temps = [(t.symbol, t.expr) for g in bp.groups for t in g.temps]
        tensors = with_definitions(known, [*variant.lets, *temps])
        yield from ((value, tensors) for _, value in temps)
        for grad in bp.grads:
            terms = [incoming[c.output] * c.factor for c in grad.contributions if c.output]
            yield sum(terms, sympy.S.Zero), tensors
            yield from ((c.factor, tensors) for c in grad.contributions)
    lets = {variant.absent: variant.lets for variant in derived.variants}
    for fv in forward.variants:
        jvp_temps = [(t.symbol, t.expr) for g in fv.groups for t in g.temps]
        tensors = with_definitions(known, [*lets.get(fv.absent, derived.full.lets), *jvp_temps])
        yield from ((value, tensors) for _, value in jvp_temps)
        for out in fv.outputs:
            yield from ((term.value, tensors) for term in (out.terms if out else ()))


def _exprs(record: object) -> Iterator[Expr]:
    """Every formula a record of the plan holds, at any depth."""
    if isinstance(record, sympy.Basic):
        yield record
    elif isinstance(record, (tuple, list)):
        for item in record:
            yield from _exprs(item)
    elif dataclasses.is_dataclass(record) and not isinstance(record, type):
        for field in dataclasses.fields(record):
            if field.name != "derived":
                yield from _exprs(getattr(record, field.name))
