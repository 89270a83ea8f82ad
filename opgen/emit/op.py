"""Emit stage: `Plan` -> the Python source of one op module.

Receives a `Plan`; returns the text of `ops/<name>.py`: the `torch.autograd.Function`
(`forward`, `setup_context`, `backward`), the functional wrapper and, when the spec asks,
the `nn.Module`. Statement bodies are built here as lines, every expression printed by
`TorchPrinter`; the file's shape lives in the Jinja template `op.py.j2`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import sympy

from opgen.derive.gradients import Derived, Variant, dimension_names
from opgen.emit.capture import autocast_helper, call_tuple, export_refusal, float_checks, recorded_forward
from opgen.emit.display import display_lines
from opgen.emit.fuse import fusable, fuse
from opgen.emit.kernel_lines import backward_lines, forward_printer
from opgen.emit.module import default_text, module_context
from opgen.emit.printer import TorchPrinter
from opgen.emit.render import Renderer
from opgen.emit.statements import assign
from opgen.formula.kinds import with_definitions
from opgen.formula.tensor import BATCH, ShapeError, dim_size, is_dim_size, shape_of
from opgen.formula.written import Piece
from opgen.plan.backward import BackwardPlan, GradPlan, Plan, Temp
from opgen.plan.capture import autocasts, capture_loss, float_inputs
from opgen.spec import quote
from opgen.spec.model import Spec
from opgen.spec.names import Namer, ctx_namer

Lines = list[str]
DOC_WIDTH = 120 - 4  # the functional's docstring is indented once


@dataclass(frozen=True, kw_only=True)
class OpNames:
    """Internal names of one op module, none equal to a spec name (built by keyword: 18 names)."""

    torch: str
    math: str
    function_ref: str  # how the functional refers to the Function class
    functional_ref: str  # how the Module refers to the functional
    ctx: str
    inputs: str
    output: str
    self: str
    grads_in: dict[str, str]  # output -> backward parameter
    grads_out: dict[str, str]  # input -> gradient variable
    ctx_attrs: dict[str, str]  # non-tensor input -> ctx attribute
    shape_attrs: dict[str, str]  # input -> ctx attribute holding its shape
    temps: dict[sympy.Symbol, str]
    size_attrs: dict[str, str]  # named dimension -> ctx attribute holding its size
    size_locals: dict[str, str]  # named dimension -> forward's local variable holding its size
    check_shapes: str  # the module-level helper that checks argument shapes at call time
    arg: str  # the functional's loop variable looking for an FX Proxy
    autocast: str  # the module-level helper a matrix op calls under autocast


def spec_names(spec: Spec) -> set[str]:
    names = {i.name for i in spec.inputs} | {let.name for let in spec.lets} | {o.name for o in spec.outputs}
    if spec.module:
        names |= {a.name for a in spec.module.args}
    return names


def public_names(spec: Spec) -> list[str]:
    return list(spec.public_names)


def make_names(plan: Plan) -> OpNames:
    spec = plan.derived.spec
    user = spec_names(spec)
    namer = Namer(user | set(public_names(spec)))
    torch, math = namer.fresh("torch"), namer.fresh("math")
    function_ref = (
        spec.function_class_name
        if spec.function_class_name not in user
        else namer.fresh("_" + spec.function_class_name)
    )
    functional_ref = spec.name if spec.name not in user else namer.fresh("_" + spec.name)
    ctx, inputs, output, self_ = (namer.fresh(n) for n in ("ctx", "inputs", "output", "self"))
    grads_in = {name: namer.fresh(f"grad_{name}") for name in plan.returned}
    grads_out = {i.name: namer.fresh(f"grad_{i.name}") for i in spec.tensor_inputs}
    temps = {t: namer.fresh(f"tmp{t.name.split(':')[1]}") for t in sorted(plan.temps, key=sympy.default_sort_key)}
    attrs = ctx_namer()
    ctx_attrs = {n: attrs.fresh(n) for n in plan.ctx_values}
    shape_attrs = {n: attrs.fresh(f"{n}_shape") for n in plan.shapes}
    size_attrs = {n: attrs.fresh(n) for n in plan.dim_sizes}
    size_locals = {d: namer.fresh(d) for d in forward_dims(plan.derived)}
    check_shapes = namer.fresh("check_shapes")
    return OpNames(
        torch=torch,
        math=math,
        function_ref=function_ref,
        functional_ref=functional_ref,
        ctx=ctx,
        inputs=inputs,
        output=output,
        self=self_,
        grads_in=grads_in,
        grads_out=grads_out,
        ctx_attrs=ctx_attrs,
        shape_attrs=shape_attrs,
        temps=temps,
        size_attrs=size_attrs,
        size_locals=size_locals,
        check_shapes=check_shapes,
        arg=namer.fresh("arg"),
        autocast=namer.fresh("_autocast_apply"),
    )


def forward_dims(derived: Derived) -> list[str]:
    """Named dimensions whose size a forward formula uses as a number."""
    used = {s for v in derived.variants for _, e in (*v.lets, *v.outputs) for s in e.free_symbols if is_dim_size(s)}
    names = {s.name.split(":", 1)[1] for s in used}
    for variant in derived.variants:  # the sizes of the shapes outputs are expanded to
        names |= {str(d) for _, pieces in variant.expand for p in pieces if p.tensor is None for d in p.dims or ()}
    return sorted(names - {"1", BATCH})


def make_printer(
    plan: Plan, names: OpNames, extra: dict[sympy.Symbol, str] | None = None, temps: tuple[Temp, ...] = ()
) -> TorchPrinter:
    """A printer for the op's formulas; `temps` are the temporaries of one backward variant, in order."""
    derived = plan.derived
    symbols = derived.symbols
    table: dict[sympy.Symbol, str] = {}
    for group in (symbols.inputs, symbols.lets, symbols.outputs):
        table |= {s: n for n, s in group.items()}
    table |= {r.symbol: r.name for r in plan.residuals}
    table |= {grad: names.grads_in[name] for name, grad in plan.incoming.items()}
    table |= names.temps
    table |= {dim_size(n): f"{names.ctx}.{attr}" for n, attr in names.size_attrs.items()}
    table |= extra or {}
    # A bool input is a number in formulas; torch refuses `tensor - True`, so it prints as an int.
    table |= {
        symbols.inputs[i.name]: f"int({table[symbols.inputs[i.name]]})"
        for i in derived.spec.inputs
        if i.type.kind == "bool"
    }
    # A `let` or temporary holds a tensor when its formula uses one (in any variant), else a
    # plain number (Note [numbers and tensors]); conditions are never kept in them (plan).
    lets = [(symbols.lets[name], expr) for variant in derived.variants for name, expr in variant.lets]
    residuals = frozenset(s for r in plan.residuals for s in (r.symbol, r.grad))
    tensors = with_definitions(symbols.tensors | residuals, [*lets, *((t.symbol, t.expr) for t in temps)])
    printer = TorchPrinter(
        table, tensors, torch=names.torch, math=names.math, functional=f"{names.torch}.nn.functional"
    )
    printer.tensor_shapes = dict(derived.shapes)
    return printer


def _with_temp_shapes(printer: TorchPrinter, plan: Plan) -> TorchPrinter:
    """Let the printer know the shape of every temporary (`.T` or `.mT`)."""
    for bp in plan.backward:
        for group in bp.groups:
            for temp in group.temps:
                try:
                    printer.tensor_shapes[temp.symbol] = shape_of(temp.expr, printer.tensor_shapes)
                except ShapeError:
                    printer.tensor_shapes[temp.symbol] = None
    return printer


def _temps(bp: BackwardPlan) -> tuple[Temp, ...]:
    return tuple(t for group in bp.groups for t in group.temps)


def _variant_printer(printer: TorchPrinter, bp: BackwardPlan, names: OpNames) -> TorchPrinter:
    """`printer` knowing which of this variant's temporaries hold tensors (variants number theirs alike)."""
    variant = copy.copy(printer)
    temps = [(t.symbol, t.expr) for t in _temps(bp)]
    variant.tensors = with_definitions(printer.tensors - frozenset(names.temps), temps)
    return variant


def _indent(lines: Lines, level: int = 1) -> Lines:
    return [("    " * level + line) if line else line for line in lines]


def _variant_condition(absent: tuple[str, ...], optional: list[str], is_none: dict[str, str]) -> str:
    return " and ".join(f"{is_none[n]}" if n in absent else f"not {is_none[n]}" for n in optional)


def _branches(bodies: list[tuple[tuple[str, ...], Lines]], optional: list[str], is_none: dict[str, str]) -> Lines:
    """One `if` branch per variant; no branch when every variant has the same body."""
    if all(body == bodies[-1][1] for _, body in bodies):
        return bodies[-1][1]
    lines: Lines = []
    for i, (absent, body) in enumerate(bodies):
        if i == len(bodies) - 1:
            lines.append("else:")
        else:
            keyword = "if" if i == 0 else "elif"
            lines.append(f"{keyword} {_variant_condition(absent, optional, is_none)}:")
        lines += _indent(body)
    return lines


# -- forward ---------------------------------------------------------------------------------


def _forward_variant(plan: Plan, variant: Variant, printer: TorchPrinter, aliases: frozenset[str]) -> Lines:
    differentiable = {o.name for o in plan.derived.spec.outputs if o.differentiable}
    lines = []
    indent = 4 * (2 + (len(plan.derived.variants) > 1))
    for name, expr in variant.lets:
        lines += assign(name, expr, printer, indent)
    for residual in plan.residuals:  # computed once, before the outputs that use them (opgen.optimize.save)
        lines += assign(residual.name, residual.expr, printer, indent)
    expand = dict(variant.expand)  # Note [shapes as written] in opgen.written
    for name, expr in variant.outputs:
        if name in aliases and name in expand and name in differentiable:  # `expand` of an input is a view too
            lines.append(f"{name} = {_expanded(printer.doprint_expr(expr), expand[name], printer)}")
            continue
        if name in aliases:  # Note [outputs that alias]
            text = printer.doprint_expr(expr)
            lines.append(f"{name} = {text}.view_as({text})" if name in differentiable else f"{name} = {text}.detach()")
        else:
            lines += assign(name, expr, printer, indent)
        if name in expand:
            lines.append(f"{name} = {_expanded(name, expand[name], printer)}")
    return lines


def _expanded(source: str, pieces: tuple[Piece, ...], printer: TorchPrinter) -> str:
    """`source` expanded to its broadcast with the shapes of `pieces`."""
    shapes = ", ".join([f"{source}.shape", *(_piece_shape(piece, printer) for piece in pieces)])
    return f"{source}.expand({printer.torch}.broadcast_shapes({shapes}))"


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
    lines = [f"{names.size_locals[d]} = {_size_text(derived.spec, *where)}" for d, where in sizes.items()]
    printer = make_printer(plan, names, {dim_size(d): local for d, local in names.size_locals.items()})
    bodies = {}
    for kind, kind_printer in (("plain", printer), ("in_place", forward_printer(printer))):  # Note [forward in place]
        variants = zip(derived.variants, plan.aliases, strict=True)
        body = _branches(
            [(v.absent, _forward_variant(plan, v, kind_printer, a)) for v, a in variants], optional, is_none
        )
        bodies[kind] = [*body, f"return {', '.join(plan.returned)}"]
    return lines + recorded_forward(bodies["in_place"], bodies["plain"], names.torch)


def _unpack(targets: list[str]) -> str:
    return f"({targets[0]},)" if len(targets) == 1 else ", ".join(targets)


# -- setup_context -----------------------------------------------------------------------------


def setup_body(plan: Plan, names: OpNames) -> Lines:
    spec = plan.derived.spec
    ctx = names.ctx
    lines = []
    sizes = size_sources(spec, plan.dim_sizes)
    needed_inputs = set(plan.saved) | set(plan.ctx_values) | set(plan.shapes) | {source for source, _ in sizes.values()}
    if plan.varies:
        needed_inputs |= {i.name for i in spec.tensor_inputs if i.type.optional}
    if needed_inputs & {i.name for i in spec.inputs}:
        targets = [i.name if i.name in needed_inputs else "_" for i in spec.inputs]
        lines.append(f"{_unpack(targets)} = {names.inputs}")
    outputs = list(plan.returned)
    needed_outputs = set(plan.saved) | {o.name for o in spec.outputs if not o.differentiable}
    if needed_outputs & set(outputs):
        if len(outputs) == 1:
            lines.append(f"{outputs[0]} = {names.output}")
        else:
            lines.append(f"{', '.join(o if o in needed_outputs else '_' for o in outputs)} = {names.output}")
    if plan.saved:
        lines.append(f"{ctx}.save_for_backward({', '.join(plan.saved)})")
    for name in plan.ctx_values:
        lines.append(f"{ctx}.{names.ctx_attrs[name]} = {name}")
    optional = {i.name for i in spec.tensor_inputs if i.type.optional}
    for name in plan.shapes:
        shape = f"None if {name} is None else {name}.shape" if name in optional else f"{name}.shape"
        lines.append(f"{ctx}.{names.shape_attrs[name]} = {shape}")
    for dim, where in sizes.items():
        lines.append(f"{ctx}.{names.size_attrs[dim]} = {_size_text(spec, *where)}")
    if plan.varies:
        for inp in spec.tensor_inputs:
            if inp.type.optional and inp.name not in plan.saved:
                raise AssertionError("optional inputs are saved when backward depends on them")
    non_differentiable = [o.name for o in spec.outputs if not o.differentiable]
    if non_differentiable:
        lines.append(f"{ctx}.mark_non_differentiable({', '.join(non_differentiable)})")
    if plan.gate_none:
        lines.append(f"{ctx}.set_materialize_grads(False)")
    if not lines:
        lines.append("pass")
    return lines


def size_sources(spec: Spec, dims: tuple[str, ...]) -> dict[str, tuple[str, int]]:
    """For each named dimension, an input that has it (not a `Tensor?` if possible) and where, from the end."""
    sources: dict[str, tuple[str, int]] = {}
    inputs = sorted(spec.tensor_inputs, key=lambda i: i.type.optional)  # stable: spec order otherwise
    for dim in dims:
        for inp in inputs:
            if inp.type.dims and dim in inp.type.dims:
                sources[dim] = (inp.name, inp.type.dims.index(dim) - len(inp.type.dims))
                break
    return sources


def _size_text(spec: Spec, source: str, index: int) -> str:
    """`x.shape[-1]`; for a `Tensor?`, None when it is None (a variant without it never asks)."""
    inp = spec.input(source)
    text = f"{source}.shape[{index}]"
    return f"None if {source} is None else {text}" if inp is not None and inp.type.optional else text


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


# -- backward ------------------------------------------------------------------------------------


def _needs(names: OpNames, plan: Plan, inputs: tuple[str, ...]) -> str:
    spec = plan.derived.spec
    index = {i.name: k for k, i in enumerate(spec.inputs)}
    return " or ".join(f"{names.ctx}.needs_input_grad[{index[n]}]" for n in inputs)


def _grad_lines(plan: Plan, grad: GradPlan, names: OpNames, printer: TorchPrinter) -> Lines:
    """`grad_<input> = ...`, fitted to the input's shape (Note [gradient shapes])."""
    var = names.grads_out[grad.input]
    first_grad = names.grads_in[next(iter(plan.incoming))]
    lines: Lines = []
    shape = f"{grad.input}.shape" if grad.input in plan.saved else f"{names.ctx}.{names.shape_attrs.get(grad.input)}"
    if not grad.contributions:
        if plan.gate_none or plan.derived.has_tensor_ops:
            return [f"{var} = None  # {grad.input} has a zero gradient"]
        if grad.reduce:  # the input's own shape: it may be larger than the output's (`x + 0 * z`)
            return [f"{var} = {first_grad}.new_zeros({shape})"]
        lines.append(f"{var} = {names.torch}.zeros_like({first_grad})")
    elif grad.overridden or grad.contributions[0].output is None:
        expr = grad.contributions[0].factor
        text = printer.doprint_expr(expr)
        if not printer.is_tensor(expr) and grad.overridden and grad.expand:
            lines.append(f"{var} = {first_grad}.new_tensor({text})")  # the override's value at every element
        elif not printer.is_tensor(expr):
            lines.append(f"{var} = {names.torch}.full_like({first_grad}, {text})")
        else:
            lines += assign(var, expr, printer, _indent_of(plan, 3))
    elif plan.gate_none:
        return _gated_sum(plan, grad, names, printer, shape)
    elif grad.separate:
        terms = [plan.incoming[c.output] * c.factor for c in grad.contributions if c.output]
        return [f"{var} = " + " + ".join(f"{printer._postfix(t)}.sum_to_size({shape})" for t in terms)]
    else:
        total = sum((plan.incoming[c.output] * c.factor for c in grad.contributions if c.output), sympy.S.Zero)
        if plan.derived.spec.optimize.lower:
            lines += backward_lines(var, total, printer, _indent_of(plan, 3))
        else:
            lines += assign(var, total, printer, _indent_of(plan, 3))
    if grad.expand and grad.reduce:
        lines.append(f"{var} = {var}.expand({names.torch}.broadcast_shapes({var}.shape, {shape})).sum_to_size({shape})")
    elif grad.expand:
        lines.append(f"{var} = {var}.expand({shape})")
    elif grad.reduce:
        lines.append(f"{var} = {var}.sum_to_size({shape})")
    return lines


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
            lines.append(f"    {var} = {term} if {var} is None else {var} + {term}")
    if grad.reduce and not grad.separate:
        lines.append(f"if {var} is not None:")
        lines.append(f"    {var} = {var}.sum_to_size({shape})")
    return lines


def _temp_lines(plan: Plan, temps: tuple, names: OpNames, printer: TorchPrinter) -> Lines:
    return [line for t in temps for line in assign(names.temps[t.symbol], t.expr, printer, _indent_of(plan, 3))]


def _indent_of(plan: Plan, level: int) -> int:
    """The indentation of a statement `level` deep in a method, one more inside variant branches."""
    return 4 * (level + (len(plan.derived.variants) > 1))


def _backward_variant(plan: Plan, bp: BackwardPlan, names: OpNames, printer: TorchPrinter) -> Lines:
    printer = _variant_printer(printer, bp, names)
    lines: Lines = []
    placed: set[int] = set()
    for grad in bp.grads:
        # Temporaries shared by several gradients go before the first of them, gated on any.
        for k, group in enumerate(bp.groups):
            if k in placed or grad.input not in group.users or len(group.users) == 1:
                continue
            placed.add(k)
            lines.append(f"if {_needs(names, plan, group.users)}:")
            lines += _indent(_temp_lines(plan, group.temps, names, printer))
        own = [t for g in bp.groups if g.users == (grad.input,) for t in g.temps]
        body = _temp_lines(plan, tuple(own), names, printer) + _grad_lines(plan, grad, names, printer)
        lines.append(f"if {_needs(names, plan, (grad.input,))}:")
        lines += _indent(body)
    return lines


def backward_body(plan: Plan, names: OpNames, printer: TorchPrinter) -> Lines:
    spec = plan.derived.spec
    lines: Lines = []
    if plan.saved:
        lines.append(f"{_unpack(list(plan.saved))} = {names.ctx}.saved_tensors")
    for name in plan.ctx_values:
        lines.append(f"{name} = {names.ctx}.{names.ctx_attrs[name]}")
    grad_vars = [names.grads_out[i.name] for i in spec.tensor_inputs]
    lines.append(" = ".join([*grad_vars, "None"]))
    optional = [i.name for i in spec.tensor_inputs if i.type.optional]
    is_none = {n: f"{n} is None" for n in optional}
    variants = plan.backward if plan.varies else plan.backward[-1:]  # Plan.varies
    bodies = [(bp.absent, _backward_variant(plan, bp, names, printer)) for bp in variants]
    lines += _branches(bodies, optional, is_none)
    returned = [names.grads_out[i.name] if i.is_tensor else "None" for i in spec.inputs]
    lines.append(f"return {', '.join(returned)}")
    return lines


# -- the whole module -------------------------------------------------------------------------------


def _signature(spec: Spec, math: str) -> list[str]:
    """Python parameters in `inputs` order; trailing `Tensor?` inputs default to None."""
    params = []
    defaults_from = len(spec.inputs)
    for k in range(len(spec.inputs) - 1, -1, -1):
        inp = spec.inputs[k]
        if inp.type.has_default or inp.type.optional:
            defaults_from = k
        else:
            break
    for k, inp in enumerate(spec.inputs):
        if k >= defaults_from:
            params.append(f"{inp.name}={default_text(inp.type.default, inp.type.has_default, math)}")
        else:
            params.append(inp.name)
    return params


def formulas_doc(derived: Derived, plan: Plan, names: OpNames) -> list[str]:
    """The forward formulas and the derived gradients, for docstrings."""
    spec = derived.spec
    symbols = derived.symbols
    table = {s: n for group in (symbols.inputs, symbols.lets, symbols.outputs) for n, s in group.items()}
    table |= {r.symbol: r.name for r in plan.residuals}
    single = len(plan.incoming) == 1
    table |= {s: ("grad" if single else f"grad_{o}") for o, s in plan.incoming.items()}
    table |= {dim_size(d): d for d in dimension_names(spec)}
    lines = ["Forward:"]
    full = derived.full
    residuals = [(r.name, r.expr) for r in plan.residuals]
    for name, expr in [*full.lets, *residuals, *full.outputs]:
        lines += display_lines(f"    {name}", expr, table, DOC_WIDTH)
    lines.append("")
    lines.append("Gradients:" if not spec.gradients else "Gradients (overrides marked):")
    lets = _inlined_lets(derived)  # gradients through tensor operations name the lets they reuse
    for gradient in full.gradients:
        if not gradient.contributions:
            lines.append(f"    grad_{gradient.input} = 0")
            continue
        total = sum(
            ((plan.incoming[c.output] * c.factor) if c.output else c.factor for c in gradient.contributions),
            sympy.S.Zero,
        )
        if gradient.fit is not None:
            total = total.xreplace(lets)
        mark = "  (override)" if gradient.overridden else ""
        lines += display_lines(f"    grad_{gradient.input}", total, table, DOC_WIDTH - len(mark))
        lines[-1] += mark
    return lines


def _inlined_lets(derived: Derived) -> dict[sympy.Basic, sympy.Symbol]:
    """Each `let` of the all-present variant, in terms of inputs only -> its symbol (for docstrings)."""
    inlined: dict[sympy.Basic, sympy.Basic] = {}
    for name, expr in derived.full.lets:
        inlined[derived.symbols.lets[name]] = expr.xreplace(inlined)
    return {expr: symbol for symbol, expr in inlined.items() if not expr.is_Atom}  # type: ignore[misc]


def emit_op(plan: Plan, renderer: Renderer) -> str:
    derived = plan.derived
    spec = derived.spec
    names = make_names(plan)
    printer = _with_temp_shapes(make_printer(plan, names, temps=_temps(plan.backward[-1])), plan)
    backward = backward_body(plan, names, printer)
    forward = forward_body(plan, names, printer)
    helpers: list[list[str]] = []
    if spec.optimize.fuse and fusable(plan):
        taken = spec_names(spec) | set(public_names(spec)) | {names.torch, names.math, *names.grads_in.values()}
        fused = fuse(plan, names.torch, names.grads_in, names.grads_out, printer, forward, taken)
        helpers, forward = fused.helpers, fused.forward
        unpacked = (1 if plan.saved else 0) + len(plan.ctx_values)
        backward = backward[:unpacked] + fused.backward_fast + backward[unpacked:]
    if autocasts(plan):
        helpers = [*helpers, autocast_helper(names.autocast, names.torch)]
    setup = setup_body(plan, names)
    formulas = formulas_doc(derived, plan, names)
    params = _signature(spec, names.math)
    doc_lines = ([spec.doc.strip(), ""] if spec.doc.strip() else []) + formulas
    module = module_context(spec, names.torch, names.math, names.self, names.functional_ref) if spec.module else None
    code = forward + backward + [h for f in helpers for h in f] + params
    if module is not None:
        code += [module.init_params, module.forward_params, *module.init_body, *module.reset_body]
    text = renderer.render(
        "op.py.j2",
        spec=spec,
        source_comment=quote.comment(spec.source),
        module_doc=quote.docstring([f"{spec.name}: a custom autograd op generated from {spec.source}."], indent=0),
        names=names,
        forward_params=", ".join(i.name for i in spec.inputs),
        forward=forward,
        setup=setup,
        backward_params=", ".join([names.ctx, *(names.grads_in[name] for name in plan.returned)]),
        backward=backward,
        signature=", ".join(params),
        call_args=", ".join(i.name for i in spec.inputs),
        visible=_visible(plan),
        docstring=quote.docstring(doc_lines, indent=4),
        class_doc=quote.docstring(
            [f"The autograd Function of `{spec.name}`; see `{spec.name}` for the formulas."], indent=4
        ),
        module=module,
        shape_checks=[
            (
                name,
                "None" if dims is None else quote.literal(dims),
            )
            for name, dims in shape_checks(spec)
        ],
        helpers=helpers,
        call_tuple=call_tuple([i.name for i in spec.inputs]),
        autocasts=autocasts(plan),
        float_checks=float_checks(spec.name, float_inputs(plan), names.torch),
        export_refusal=export_refusal(spec.name, loss) if (loss := capture_loss(plan)) else None,
        uses_math=quote.uses_math(code, names.math),
    )
    return text


def _visible(plan: Plan) -> str:
    """What the functional keeps of the Function's outputs: all but the residuals (opgen.optimize.save)."""
    shown = len(plan.derived.spec.outputs)
    if not plan.residuals:
        return ""
    return "[0]" if shown == 1 else f"[:{shown}]"
