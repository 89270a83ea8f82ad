"""Emit stage: `Plan` -> the Python source of one op module.

Receives a `Plan`; returns the text of `ops/<name>.py`: the `torch.autograd.Function`
(`forward`, `setup_context`, `backward`), the functional wrapper and, when the spec asks,
the `nn.Module`. Statement bodies are built as lines (opgen.emit.forward, opgen.emit.backward),
every expression printed by `TorchPrinter` with the names of opgen.emit.names; the docstring
comes from opgen.emit.docstring; the file's shape lives in the Jinja template `op.py.j2`.
"""

from __future__ import annotations

from opgen.emit import annotations as typed
from opgen.emit import layout
from opgen.emit.backward import backward_body
from opgen.emit.capture import capture_lines, float_checks
from opgen.emit.custom_op import custom_op_context, exported_context, with_fingerprint
from opgen.emit.docstring import formulas_doc
from opgen.emit.forward import forward_body, setup_body, shape_checks, size_inputs, size_sources, size_text
from opgen.emit.forward_mode import JvpNames, JvpSetup, backward_jvp, jvp_body, jvp_names, jvp_setup
from opgen.emit.fuse import fusable, fuse
from opgen.emit.module import ModuleContext, default_text, module_context
from opgen.emit.names import (
    OpNames,
    make_names,
    make_printer,
    public_names,
    spec_names,
    variant_temps,
    with_temp_shapes,
)
from opgen.emit.printer import TorchPrinter
from opgen.emit.render import Renderer
from opgen.emit.runtime_names import from_imports
from opgen.emit.small_call import small_call
from opgen.emit.statements import Lines
from opgen.formula import slicing
from opgen.plan.backward import Plan
from opgen.plan.capture import autocast_policy, capture_loss, float_inputs, promotes
from opgen.spec import quote
from opgen.spec.model import Spec


def _signature(spec: Spec, math: str, types: typed.TypeNames) -> list[str]:
    """Annotated Python parameters in `inputs` order; trailing `Tensor?` inputs default to None."""
    params = []
    defaults_from = typed.trailing_defaults([i.type.has_default or i.type.optional for i in spec.inputs])
    for k, inp in enumerate(spec.inputs):
        if k >= defaults_from:
            default = default_text(inp.type.default, inp.type.has_default, math)
            params.append(typed.param(inp.name, typed.input_type(inp.type, types), default))
        else:
            params.append(typed.param(inp.name, typed.input_type(inp.type, types)))
    return params


# Note [TorchScript]
# ~~~~~~~~~~~~~~~~~~
# TorchScript compiles Python source and cannot compile a `torch.autograd.Function`, nor the
# functional's checks around it. The functional is `torch.jit.ignore`d (by a call after it, not as a
# decorator: an untyped decorator would make it untyped for mypy): scripted code that calls it
# (a scripted module, the user's scripted function) runs it as a Python call, with the op's gradient,
# as `torch.jit.trace` records it; `torch.jit.save` refuses such code ("Could not export Python
# function call"). Scripting the functional itself raises TorchScript's error for a function marked
# `__script_unsupported` (as torch.autocast's decorator does), with a message that names what works:
# calling it from scripted code, torch.compile, torch.export, torch.jit.trace. It used to fail on the
# first line TorchScript cannot read ("annotated assignments without assigned value").


def emit_op(plan: Plan, renderer: Renderer) -> str:
    derived = plan.derived
    spec = derived.spec
    names = make_names(plan)
    printer = with_temp_shapes(make_printer(plan, names, temps=variant_temps(plan.backward[-1])), plan)
    backward, before_forward = backward_body(plan, names, printer), names.runtime.mark()
    forward = forward_body(plan, names, printer)
    helpers: list[list[str]] = []
    if spec.optimize.fuse and fusable(plan):
        names.runtime.rewind(before_forward)  # the compiled helper replaces forward's lines but its return
        taken = spec_names(spec) | set(public_names(spec)) | {names.torch, names.math, *names.grads_in.values()}
        fused = fuse(plan, names.torch, names.grads_in, names.grads_out, printer, forward, taken, names.types)
        helpers, forward = fused.helpers, fused.forward
        unpacked = (1 if plan.saved else 0) + len(plan.ctx_values)
        backward = backward[:unpacked] + fused.backward_fast + backward[unpacked:]
    jnames, jvp, jsetup = _forward_mode(plan, names, printer, helpers)
    setup = setup_body(plan, names, jsetup)
    formulas = formulas_doc(derived, plan, names)
    params = _signature(spec, names.math, names.types)
    doc_lines = ([spec.doc.strip(), ""] if spec.doc.strip() else []) + formulas
    module = _module(spec, names) if spec.module else None
    defs = _defs(plan, names, jnames, params)
    code = forward + backward + jvp + [h for f in helpers for h in f] + list(defs.values())
    if module is not None:
        code += [module.init_def, module.forward_def, *module.init_body, *module.reset_body]
    context = dict(
        spec=spec,
        source_comment=quote.comment(spec.source),
        module_doc=quote.docstring([f"{spec.name}: a custom autograd op generated from {spec.source}."], indent=0),
        names=names,
        forward=forward,
        setup=setup,
        backward=backward,
        jvp=jvp,
        jvp_free=jnames.compiled,
        jvp_chosen=jnames.chosen,
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
        divisible=_divisible(plan),
        helpers=helpers,
        small_call=small_call(plan, printer),
        **_capture_context(plan, names, jnames),
        **defs,
        uses_math=quote.uses_math(code, names.math),
    )
    context |= _imports(plan, names)  # last: every runtime name the lines above print is recorded
    text = renderer.render("op.py.j2", **context)
    return with_fingerprint(text) if spec.custom_op else text


def _imports(plan: Plan, names: OpNames) -> dict[str, object]:
    """The names the template writes of the package's shared modules, and their imports."""
    return {
        "rt": names.runtime,
        "runtime_import": _runtime_import(plan, names),
        "shape_checks_import": from_imports(".._shape_checks", [("check_shapes", names.check_shapes)]),
    }


def _runtime_import(plan: Plan, names: OpNames) -> str:
    """The import of what the module uses of `_runtime.py`: what its bodies printed, and what the
    template writes around them (the Function's base, the functional's capture and TorchScript mark)."""
    rt = names.runtime
    _ = rt.Function, rt.capture, rt.not_scriptable, rt.outputs_only
    if not plan.derived.spec.custom_op:
        _ = rt.without_jvp
    if autocast_policy(plan):
        _ = rt.autocast_apply
    return rt.import_line()


def _divisible(plan: Plan) -> str:
    """The dimensions the formulas cut into equal parts, as the call-time check's `divisible=` (Note [parts of
    a dimension] in opgen.formula.dims); "" when none is cut."""
    exprs = [e for v in plan.derived.variants for _, e in (*v.lets, *v.outputs)]
    found = slicing.divisors(exprs)
    return "{" + ", ".join(f"{quote.string(dim)}: {parts}" for dim, parts in found.items()) + "}" if found else ""


def _module(spec: Spec, names: OpNames) -> ModuleContext:
    return module_context(spec, names.torch, names.math, names.self, names.functional_ref, names.types)


def _defs(plan: Plan, names: OpNames, jnames: JvpNames, params: list[str]) -> dict[str, str]:
    """The annotated `def` lines of the Function's methods and the functional (Note [typed generated code])."""
    spec, types = plan.derived.spec, names.types
    returned = typed.tensors(len(plan.returned), types)
    ctx = typed.param(names.ctx, types.any)
    grads_in = [typed.param(names.grads_in[name], types.tensor) for name in plan.returned]
    tangents = [typed.param(jnames.params[i.name], typed.tangent_type(i.type, types)) for i in spec.inputs]
    setup = [ctx, typed.param(names.inputs, f"{types.builtin['tuple']}[{types.any}, ...]")]
    still = {o.name for o in spec.outputs if not o.differentiable}  # their tangent is None
    still |= {r.name for r in plan.residuals if not r.differentiable}  # a saved statistic's too
    tangents_out = ["None" if name in still else types.tensor for name in plan.returned]
    if plan.jvp_is_backward:  # backward's gradient (Note [a diagonal Jacobian] in opgen.plan.backward)
        tangents_out = [typed.gradient_type(spec.tensor_inputs[0].type, types)]
    grads_out = [typed.gradient_type(i.type, types) for i in spec.inputs]
    return {
        "apply_def": typed.define("apply", ["cls", f"*args: {types.any}"], returned, 4),
        "forward_def": typed.define("forward", typed.typed_params(list(spec.inputs), types), returned, 4),
        "setup_def": typed.define("setup_context", [*setup, typed.param(names.output, types.any)], "None", 4),
        "backward_def": typed.define("backward", [ctx, *grads_in], typed.results(grads_out, types), 4),
        "jvp_def": typed.define("jvp", [ctx, *tangents], typed.results(tangents_out, types), 4),
        "functional_def": typed.define(spec.name, params, typed.tensors(len(spec.outputs), types), 0),
    }


def _custom_op(plan: Plan, names: OpNames, jnames: JvpNames) -> dict[str, str]:
    """What the template writes for a custom_op-form op (opgen.emit.custom_op)."""
    spec = plan.derived.spec
    return custom_op_context(plan, spec.namespace, names.function_ref, jnames.chosen, _taken(plan, names, jnames))


def _exported(plan: Plan, names: OpNames, jnames: JvpNames) -> dict[str, str] | None:
    """What the template writes for a function-form op whose backward the forward formula would lose."""
    spec = plan.derived.spec
    if spec.custom_op or not capture_loss(plan):
        return None
    return exported_context(plan, jnames.chosen, _taken(plan, names, jnames) | {jnames.chosen})


def _taken(plan: Plan, names: OpNames, jnames: JvpNames) -> set[str]:
    """The names an op module already uses, which the names of what it imports from `_custom_ops` avoid."""
    spec = plan.derived.spec
    taken = spec_names(spec) | set(public_names(spec)) | {names.torch, names.math, names.check_shapes}
    return taken | {names.function_ref, names.functional_ref, names.proxy, jnames.compiled}


def _capture_context(plan: Plan, names: OpNames, jnames: JvpNames) -> dict[str, object]:
    """What the functional does under graph capture, autocast and with wrong dtypes (opgen.emit.capture),
    and the custom op it calls in the custom_op form (opgen.emit.custom_op)."""
    spec = plan.derived.spec
    loss = capture_loss(plan)
    return {
        "custom_op": _custom_op(plan, names, jnames) if spec.custom_op else None,
        "capture": capture_lines(names.functional_ref, [i.name for i in spec.inputs], names.proxy, names.runtime),
        "applied": _applied(plan, names, jnames),
        "outputs_only": _applied(plan, names, jnames, f"{names.function_ref}.forward", 8),
        "outputs_only_args": "onnx_only=True" if spec.custom_op or loss else "",
        "float_checks": float_checks(spec.name, float_inputs(plan), promotes(plan), names.runtime),
        "exported": _exported(plan, names, jnames),
    }


def _forward_mode(
    plan: Plan, names: OpNames, printer: TorchPrinter, helpers: list[list[str]]
) -> tuple[JvpNames, Lines, JvpSetup]:
    """The `jvp` staticmethod, its names and what `setup_context` keeps for it (opgen.emit.forward_mode)."""
    assert plan.forward is not None
    spec = plan.derived.spec
    taken = spec_names(spec) | set(public_names(spec)) | {names.torch, names.math, names.ctx, names.check_shapes}
    taken |= {names.function_ref, names.functional_ref, *(h[0].split("(")[0].split()[-1] for h in helpers if h)}
    attrs = {*names.ctx_attrs.values(), *names.shape_attrs.values(), *names.size_attrs.values()}
    jnames = jvp_names(plan, plan.forward, taken, (names.ctx_attrs, names.size_attrs), attrs)
    if plan.jvp_is_backward:
        jvp, setup = backward_jvp(plan, jnames, names.function_ref, names.ctx)
        return jnames, jvp, setup
    sources = size_sources(spec, plan.forward.dim_sizes).items()
    sizes = {d: (size_text(spec, *where, names.torch), size_inputs(where[0])) for d, where in sources}
    setup = jvp_setup(plan, plan.forward, jnames, names.ctx, attrs, sizes)
    return jnames, jvp_body(plan, plan.forward, jnames, printer, names.ctx), setup


def _applied(plan: Plan, names: OpNames, jnames: JvpNames, run: str = "", indent: int = 4) -> str:
    """The functional's return of `run` (default: the chosen Function's `apply`, or the custom op), under
    autocast's casts for a matrix op, laid out as ruff lays out a long call at `indent`."""
    spec = plan.derived.spec
    args = [i.name for i in spec.inputs]
    run = run or (jnames.chosen if spec.custom_op else f"{jnames.chosen}.apply")
    policy = autocast_policy(plan)
    if policy:
        cast = [] if policy == "lower" else [f"cast={quote.string(policy)}"]
        return layout.call(f"return {names.runtime.autocast_apply}", [run, *args, *cast], indent, _visible(plan))
    return layout.call(f"return {run}", args, indent, _visible(plan))


def _visible(plan: Plan) -> str:
    """What the functional keeps of the Function's outputs: all but the residuals (opgen.optimize.save)."""
    shown = len(plan.derived.spec.outputs)
    if not plan.residuals:
        return ""
    return "[0]" if shown == 1 else f"[:{shown}]"
