"""The bodies of `Function.forward` and `Function.setup_context`, and the call-time shape checks.

`forward_body` computes the lets, the residuals (opgen.optimize.save) and the outputs of each
variant, expanded to the shape their formula has as written; `setup_body` saves what backward
reads (tensors, non-tensor inputs, shapes, named dimension sizes).
"""

from __future__ import annotations

import sympy

from opgen.emit import layout
from opgen.emit.capture import recorded_forward
from opgen.emit.forward_mode import JvpSetup
from opgen.emit.kernel_lines import forward_printer
from opgen.emit.names import OpNames, make_printer
from opgen.emit.printer import TorchPrinter
from opgen.emit.statements import Lines, assign_block, size_line, text_lines, variant_branches
from opgen.formula.dims import counted, part_of
from opgen.formula.tensor import BATCH, Transpose, Unsqueeze, dim_size
from opgen.formula.written import Piece
from opgen.nodes.layer_norm import Rstd, let_statistics, saved_statistics, statistics_lines
from opgen.plan.backward import Plan
from opgen.plan.forward import filled_incoming, filled_shapes
from opgen.records import Variant
from opgen.spec.model import Spec
from opgen.spec.names import Namer


def _forward_variant(plan: Plan, variant: Variant, printer: TorchPrinter, aliases: frozenset[str]) -> Lines:
    differentiable = {o.name for o in plan.derived.spec.outputs if o.differentiable}
    lines = []
    indent = 4 * (2 + (len(plan.derived.variants) > 1))
    pending = saved_statistics(plan.residuals)  # Note [layer norm statistics]
    parts: dict[sympy.Basic, sympy.Symbol] = {}  # a layer norm a let or a statement computed: its name
    given: set[str] = set()  # the residuals those lets assign
    for name, expr in variant.lets:
        found = let_statistics(name, expr, pending, printer)
        if found is None:
            lines += assign_block([name], plan.block(expr), printer, indent, (dict(parts),))
            continue
        lines.append(found[0])
        given |= found[1]
        parts[expr] = sympy.Symbol(name, real=True)
    expand = dict(variant.expand)  # Note [shapes as written] in opgen.written
    plain = tuple((n, _read_back(e, parts)) for n, e in variant.outputs if n not in aliases and n not in expand)
    taken = {*printer.names.values(), printer.torch, printer.math, *(n for n, _ in variant.outputs)}
    statistics, done, inner = statistics_lines(pending, plain, printer, Namer(taken | {r.name for r in plan.residuals}))
    lines += statistics
    done |= given
    for symbol in inner.values():  # a layer norm inside an output: computed with its statistics
        printer = printer.with_symbols({symbol: symbol.name}, frozenset({symbol}))
    outputs = tuple((n, _read_back(_read_back(e, parts), inner)) for n, e in variant.outputs)
    raw, read = dict(variant.outputs), (dict(parts), dict(inner))
    computed = {expr: name for name, expr in variant.lets}
    for residual in plan.residuals:  # computed once, before the outputs that use them (opgen.optimize.save)
        if residual.name in done:
            continue
        if _as_let(residual.expr) in computed:  # a let forward has already computed (`r: rsqrt(...)`)
            lines.append(f"{residual.name} = {computed[_as_let(residual.expr)]}")
        else:
            lines += assign_block([residual.name], plan.block(residual.expr), printer, indent)
    tensors = frozenset(plan.derived.symbols.tensor_inputs)
    inlined = dict(variant.inlined)  # a constant may read a let or an earlier output: `(n > n) * o`
    for name, expr in outputs:
        if name in done:
            continue
        if name in expand and not inlined[name].free_symbols & tensors:  # Note [constant outputs]
            lines.append(f"{name} = {_filled(printer.doprint_expr(inlined[name]), expand[name], printer)}")
            continue
        if name in aliases and name in expand and name in differentiable:  # `expand` of an input is a view too,
            # and where it broadcasts, forward mode writes the input's zero tangent through it and fails: a copy.
            lines.append(f"{name} = {_expanded(printer.doprint_expr(expr), expand[name], printer)}.contiguous()")
            continue
        if name in aliases:  # Note [outputs that alias]
            lines.append(_alias_line(plan, name, printer.doprint_expr(expr), name in differentiable))
        else:
            lines += assign_block([name], plan.block(raw[name]), printer, indent, read)
        if name in expand:  # a fresh tensor, as PyTorch's ops return: an expanded view fails in-place ops
            # on the output and forward mode, which writes the tangent into the output's layout.
            lines.append(f"{name} = {_expanded(name, expand[name], printer)}.contiguous()")
        if name not in differentiable and name not in aliases and (name in expand or _is_view(expr)):
            # A view of an input is rebased by autograd whatever setup_context marks: detach it.
            lines.append(f"{name} = {name}.detach()")
    return lines


def _alias_line(plan: Plan, name: str, source: str, differentiable: bool) -> str:
    """An output that is the input `source` as-is: a copy where its tangent is not the input's, else a new
    view of it, detached when not differentiable (Note [outputs that alias] in opgen.plan.backward)."""
    if plan.forward is not None and name in plan.forward.copies:
        return f"{name} = {source}.clone()"
    return f"{name} = {source}.view_as({source})" if differentiable else f"{name} = {source}.detach()"


def _read_back(expr: sympy.Basic, computed: dict[sympy.Basic, sympy.Symbol]) -> sympy.Basic:
    """`expr` reading the names of the parts already computed; untouched without any (rebuilding a
    formula evaluates what the reader kept unevaluated, `(a < a) * x`)."""
    return expr.xreplace(computed) if computed and expr.has(*computed) else expr


def _as_let(expr: sympy.Basic) -> sympy.Basic:
    """A residual as a let computing it would read: a saved rstd is `base**(-1/2)` (forward records nothing)."""
    return expr.args[0] ** sympy.Rational(-1, 2) if isinstance(expr, Rstd) else expr


def _is_view(expr: sympy.Basic) -> bool:
    """Whether `expr` prints as a view of a tensor forward already has (`x.T`, `x.mT`, `x.unsqueeze(-1)`)."""
    viewed = expr
    while isinstance(viewed, (Transpose, Unsqueeze)):
        viewed = viewed.args[0]
    return viewed is not expr and isinstance(viewed, sympy.Symbol)


def _expanded(source: str, pieces: tuple[Piece, ...], printer: TorchPrinter) -> str:
    """`source` expanded to its broadcast with the shapes of `pieces`."""
    shapes = ", ".join([f"{source}.shape", *(_piece_shape(piece, printer) for piece in pieces)])
    return f"{source}.expand({printer.torch}.broadcast_shapes({shapes}))"


# Note [constant outputs]
# ~~~~~~~~~~~~~~~~~~~~~~~
# An output whose formula names a Tensor input may still be a number once SymPy has read it
# (`x - x + 1`, `0 * x + t`). PyTorch computes such a formula into a tensor of the inputs'
# broadcast shape, dtype and device, filled with the number, whose gradients are zeros; so does
# the op: `torch.full` over the shapes the formula broadcasts as written (Note [shapes as
# written] in opgen.formula.written), in the dtype and on the device of the first tensor there.
# A formula that names no Tensor input at all is refused (opgen.derive.gradients).
def _filled(value: str, pieces: tuple[Piece, ...], printer: TorchPrinter) -> str:
    """A new tensor of the broadcast of `pieces`' shapes, filled with `value`."""
    tensor = next(printer.doprint_expr(p.tensor or p.reads) for p in pieces if p.tensor or p.reads)
    shapes = ", ".join(_piece_shape(piece, printer) for piece in pieces)
    broadcast = f"{printer.torch}.broadcast_shapes({shapes})"
    return f"{printer.torch}.full({broadcast}, {value}, dtype={tensor}.dtype, device={tensor}.device)"


def _piece_shape(piece: Piece, printer: TorchPrinter) -> str:
    """The run-time shape of a piece: a tensor's own, or a tensor operation's sizes after its batch."""
    if piece.tensor is not None:
        return f"{printer.doprint_expr(piece.tensor)}.shape"
    assert piece.dims is not None
    dims = [d for d in piece.dims if d != BATCH]
    sizes = [str(d) if d == 1 else printer.doprint_expr(dim_size(str(d))) for d in dims]
    if not piece.batch:
        return f"({', '.join(sizes)},)" if len(sizes) == 1 else f"({', '.join(sizes)})"
    texts = []
    for source in piece.batch:  # its batch dimensions come from these inputs
        own = len(printer.tensor_shapes[source] or ()) - 1  # its declared dimensions after `...`
        batch = f"*{printer.doprint_expr(source)}.shape" + (f"[:-{own}]" if own else "")
        texts.append(f"({', '.join([batch, *sizes])})" if sizes else f"({batch},)")
    return ", ".join(texts)


def forward_body(plan: Plan, names: OpNames, printer: TorchPrinter) -> Lines:
    derived = plan.derived
    optional = [i.name for i in derived.spec.tensor_inputs if i.type.optional]
    is_none = {n: f"{n} is None" for n in optional}
    sizes = size_sources(derived.spec, tuple(names.size_locals))
    spec = derived.spec
    lines = [size_line(names.size_locals[d], size_text(spec, *where, names.torch)) for d, where in sizes.items()]
    printer = make_printer(plan, names, {dim_size(d): local for d, local in names.size_locals.items()})
    bodies = {}
    for kind, kind_printer in (("plain", printer), ("in_place", forward_printer(printer))):  # Note [forward in place]
        variants = zip(derived.variants, plan.aliases, strict=True)
        body = variant_branches(
            [(v.absent, _forward_variant(plan, v, kind_printer, a)) for v, a in variants], optional, is_none
        )
        bodies[kind] = [*body, f"return {', '.join(plan.returned)}"]
    return lines + recorded_forward(bodies["in_place"], bodies["plain"], names.torch, names.runtime)


def setup_body(plan: Plan, names: OpNames, forward: JvpSetup | None = None) -> Lines:
    spec = plan.derived.spec
    ctx = names.ctx
    lines = []
    sizes = size_sources(spec, plan.dim_sizes)
    needed_inputs = set(plan.saved) | set(plan.ctx_values) | set(plan.shapes)
    needed_inputs |= {name for source, _ in sizes.values() for name in size_inputs(source)}
    needed_inputs |= forward.inputs if forward else set()
    if plan.varies:
        needed_inputs |= {i.name for i in spec.tensor_inputs if i.type.optional}
    if needed_inputs & {i.name for i in spec.inputs}:
        targets = [i.name if i.name in needed_inputs else "_" for i in spec.inputs]
        lines += layout.unpacked(targets, names.inputs, 8)
    outputs = list(plan.returned)
    needed_outputs = set(plan.saved) | {o.name for o in spec.outputs if not o.differentiable}
    needed_outputs |= set(plan.gated_residuals) | set(filled_shapes(plan))
    needed_outputs |= forward.outputs if forward else set()
    if needed_outputs & set(outputs):
        if len(outputs) == 1:
            lines.append(f"{outputs[0]} = {names.output}")
        else:
            lines.append(f"{', '.join(o if o in needed_outputs else '_' for o in outputs)} = {names.output}")
    if plan.saved:
        lines += layout.body_lines(layout.call(f"{ctx}.save_for_backward", _saved_args(plan, names), 8), 8)
    for name in plan.ctx_values:
        lines.append(f"{ctx}.{names.ctx_attrs[name]} = {name}")
    optional = {i.name for i in spec.tensor_inputs if i.type.optional}
    for name in plan.shapes:
        shape = f"None if {name} is None else {name}.shape" if name in optional else f"{name}.shape"
        lines += text_lines(f"{ctx}.{names.shape_attrs[name]}", shape, 8)
    for dim, where in sizes.items():
        lines.append(size_line(f"{ctx}.{names.size_attrs[dim]}", size_text(spec, *where, names.torch)))
    for name in plan.gated_residuals:  # Note [saved tensor operations] in opgen.optimize.save_tensors
        lines.append(f"{ctx}.{names.shape_attrs[name]} = {name}.shape")
    for name in filled_shapes(plan):  # Note [refused tangents] in opgen.plan.forward
        lines.append(f"{ctx}.{names.shape_attrs[name]} = {name}.shape")
    lines += forward.lines if forward else ()
    if plan.varies:
        for inp in spec.tensor_inputs:
            if inp.type.optional and inp.name not in plan.saved:
                raise AssertionError("optional inputs are saved when backward depends on them")
    non_differentiable = [o.name for o in spec.outputs if not o.differentiable]
    non_differentiable += [r.name for r in plan.residuals if not r.differentiable]
    if non_differentiable:
        lines.append(f"{ctx}.mark_non_differentiable({', '.join(non_differentiable)})")
    if plan.unmaterialized or filled_incoming(plan):
        lines.append(f"{ctx}.set_materialize_grads(False)")
    if not lines:
        lines.append("pass")
    return lines


def _saved_args(plan: Plan, names: OpNames) -> list[str]:
    """What `setup_context` saves, each tensor only some gradients read under their `needs_input_grad`
    (Note [saved for the gradients that read it] in opgen.plan.backward)."""
    index = {i.name: k for k, i in enumerate(plan.derived.spec.inputs)}
    readers = dict(plan.saved_for)
    args = []
    for name in plan.saved:
        if name in readers:
            needs = " or ".join(f"{names.ctx}.needs_input_grad[{index[r]}]" for r in readers[name])
            args.append(f"{name} if {needs} else None")
        else:
            args.append(name)
    return args


def size_sources(spec: Spec, dims: tuple[str, ...]) -> dict[str, tuple[str, int]]:
    """For each named dimension, an input that has it (not a `Tensor?` if possible, else one without
    batch dimensions: a parameter's size is a constant in a trace with a dynamic batch, which the
    TorchScript-based ONNX exporter needs of `layer_norm`'s shape) and where, from the end; a count
    (Note [counts of unknown shapes]) is its own source."""
    sources: dict[str, tuple[str, int]] = {}
    batched = lambda i: BATCH in (i.type.dims or ())  # noqa: E731
    inputs = sorted(spec.tensor_inputs, key=lambda i: (i.type.optional, batched(i)))  # stable: spec order otherwise
    for dim in dims:
        if counted(dim):
            sources[dim] = (dim, 0)
            continue
        for inp in inputs:
            # `H` of a `2*H` too, when no input has it whole (Note [multiples of a dimension])
            found = [k for k, d in enumerate(inp.type.dims or ()) if d == dim or part_of(d)[0] == dim and "*" in d]
            if found and inp.type.dims:
                sources[dim] = (inp.name, found[0] - len(inp.type.dims))
                break
    return sources


def size_inputs(source: str) -> tuple[str, ...]:
    """The inputs a size of `size_sources` is read from."""
    return counted(source) or (source,)


def size_text(spec: Spec, source: str, index: int, torch: str) -> str:
    """`x.shape[-1]`; for a `Tensor?`, None when it is None (a variant without it never asks); for a
    count, `x.numel()` or `torch.broadcast_shapes(x.shape, t.shape).numel()` (of their batches
    `x.shape[:-1]` for a batch count), None when a `Tensor?` it counts is None. `torch` is the name
    the module imports torch under (an input may be `torch`)."""
    tensors = counted(source)
    if tensors is not None:
        shapes = [_batch_shape(spec, t) if source.startswith("%") else f"{t}.shape" for t in tensors]
        shape = shapes[0] if len(tensors) == 1 else f"{torch}.broadcast_shapes({', '.join(shapes)})"
        text = shape if source.startswith("@") else f"{shape}.numel()"
        absent = [t for t in tensors if (i := spec.input(t)) is not None and i.type.optional]
        return f"None if {' or '.join(f'{t} is None' for t in absent)} else {text}" if absent else text
    inp = spec.input(source)
    text = f"{source}.shape[{index}]{size_divisor(spec, source, index)}"
    return f"None if {source} is None else {text}" if inp is not None and inp.type.optional else text


def size_divisor(spec: Spec, source: str, index: int) -> str:
    """` // 2` where the size is read from a `2*H` dimension of the input `source` (Note [multiples of a dimension])."""
    inp = spec.input(source)
    dims = inp.type.dims if inp is not None else None
    multiple = part_of(dims[index])[1] if dims and "*" in dims[index] and "//" not in dims[index] else 1
    return f" // {multiple}" if multiple != 1 else ""


def _batch_shape(spec: Spec, tensor: str) -> str:
    """`x.shape[:-2]`: the batch dimensions `...` of the input `tensor` (Note [counts of unknown shapes])."""
    inp = spec.input(tensor)
    named = len(inp.type.dims or ()) - 1 if inp is not None else 0
    return f"{tensor}.shape[:-{named}]" if named > 0 else f"{tensor}.shape"


def shape_checks(spec: Spec) -> list[tuple[str, tuple[str, ...] | None]]:
    """The Tensor inputs the functional checks at call time, with their named dimensions.

    Inputs with named dimensions are checked against them; when an op has several Tensor
    inputs, every one is checked to be a tensor, and those without names (None) to broadcast
    together, so a mistake names the argument instead of surfacing inside forward.
    """
    tensors = spec.tensor_inputs
    if len(tensors) < 2 and all(i.type.dims is None for i in tensors):
        return []
    return [(i.name, i.type.dims) for i in tensors]
