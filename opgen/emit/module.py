"""Emit stage, `nn.Module` part: the `module:` section -> the Module class's context.

Receives the `Spec` and the op's internal names; returns what `op.py.j2` needs to write the
Module: constructor signature and body, `reset_parameters`, `forward`, `extra_repr`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from opgen.emit import annotations as typed
from opgen.formula.python_source import source
from opgen.spec import quote
from opgen.spec.model import Input, Module, Scalar, Spec
from opgen.spec.names import Namer
from opgen.spec.parse_init import INIT_CONSTANTS, INIT_FUNCTIONS

# Attributes an nn.Module already has; a spec name equal to one is kept under another name.
MODULE_ATTRIBUTES = frozenset(
    """T_destination add_module apply bfloat16 buffers call_super_init children compile cpu cuda
    double dump_patches eval extra_repr float forward get_buffer get_extra_state get_parameter
    get_submodule half ipu load_state_dict modules mtia named_buffers named_children named_modules
    named_parameters parameters register_backward_hook register_buffer register_forward_hook
    register_forward_pre_hook register_full_backward_hook register_full_backward_pre_hook
    register_load_state_dict_post_hook register_load_state_dict_pre_hook register_module
    register_parameter register_state_dict_post_hook register_state_dict_pre_hook requires_grad_
    reset_parameters set_extra_state set_submodule share_memory state_dict to to_empty train
    training type xpu zero_grad""".split()
)


@dataclass(frozen=True)
class ModuleContext:
    name: str
    init_def: str
    init_body: list[str]
    reset_def: str
    reset_body: list[str]
    forward_def: str
    repr_def: str
    forward_call: str
    repr_text: str
    doc: str


def _init_arg(arg: float | str, attrs: _Attributes, math: str) -> str:
    """An init argument as source: a number, or the checked arithmetic on the module's args with each arg
    read from the module and `sqrt`, `pi` from `math` (Note [init from constructor args])."""
    if not isinstance(arg, str):
        return quote.number(arg)  # finite: the parser refuses others

    class Module(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.expr:  # noqa: N802
            if node.id in INIT_FUNCTIONS or node.id in INIT_CONSTANTS:
                return ast.Attribute(ast.Name(math, ast.Load()), node.id, ast.Load())
            return ast.Attribute(ast.Name(attrs.self_, ast.Load()), attrs.arg_attr[node.id], ast.Load())

    return source(Module().visit(ast.parse(arg, mode="eval").body), math)


def _init_call(module_torch: str, target: str, init_kind: str, a: list[str]) -> str:
    init = f"{module_torch}.nn.init"
    if init_kind == "uniform":
        return f"{init}.uniform_({target}, {a[0]}, {a[1]})"
    if init_kind == "normal":
        return f"{init}.normal_({target}, {a[0]}, {a[1]})"
    if init_kind == "zeros":
        return f"{init}.zeros_({target})"
    if init_kind == "ones":
        return f"{init}.ones_({target})"
    if init_kind == "constant":
        return f"{init}.constant_({target}, {a[0]})"
    if init_kind == "kaiming_uniform":
        return f"{init}.kaiming_uniform_({target}" + (f", a={a[0]})" if a else ")")
    if init_kind == "xavier_uniform":
        return f"{init}.xavier_uniform_({target}" + (f", gain={a[0]})" if a else ")")
    raise ValueError(init_kind)  # pragma: no cover - the parser allows only these


def default_text(value: Scalar | None, has_default: bool, math: str) -> str:
    """A parameter's default as source: the declared value (`math.inf` when infinite), else None."""
    return quote.number(value, math) if has_default and value is not None else "None"


def _defaults(module: Module, math: str, types: typed.TypeNames) -> list[str]:
    """The constructor's parameters with every declared default; those from the first argument without
    a default after one with a default are keyword-only (`opgen.emit.annotations.keyword_only_from`)."""
    defaults = {a.name: default_text(a.type.default, True, math) for a in module.args if a.type.has_default}
    params = typed.typed_params(list(module.args), types, defaults)
    start = typed.keyword_only_from([a.type.has_default for a in module.args])
    return params[:start] + (["*"] if start < len(params) else []) + params[start:]


def module_context(
    spec: Spec, torch: str, math: str, self_: str, functional: str, types: typed.TypeNames
) -> ModuleContext:
    """The Module's parts; `torch`, `math`, `self_`, `functional` and `types` are how the op's file
    names torch, math, `self`, the functional and its annotations' types (none of them a spec name)."""
    assert spec.module is not None
    module = spec.module
    attrs = _attributes(module, self_)
    params = {p.name for p in module.parameters}
    forward_inputs = [i for i in spec.inputs if i.name not in params and module.attribute_arg(i.name) is None]
    call_args = [_call_arg(module, inp.name, attrs) for inp in spec.inputs]
    repr_text = _repr_fstring([(f"{a.name}=", attrs.arg_repr[a.name]) for a in module.args])
    doc = quote.docstring([f"`{spec.name}` as a module; see `{spec.name}` for the formulas."], indent=4)
    returns = typed.tensors(len(spec.outputs), types)
    return ModuleContext(
        module.name,
        typed.define("__init__", [self_, *_defaults(module, math, types)], "None", 4),
        _init_body(module, torch, attrs),
        typed.define("reset_parameters", [self_], "None", 4),
        _reset_body(module, torch, math, attrs),
        typed.define("forward", [self_, *_forward_params(forward_inputs, math, types)], returns, 4),
        typed.define("extra_repr", [self_], types.builtin["str"], 4),
        f"{functional}({', '.join(call_args)})",
        repr_text,
        doc,
    )


@dataclass(frozen=True)
class _Attributes:
    """How the Module refers to its parameters and stored args (`self.weight`, `self._eps`)."""

    self_: str
    param_attr: dict[str, str]  # parameter -> attribute
    arg_attr: dict[str, str]  # module arg stored as an attribute -> attribute
    arg_repr: dict[str, str]  # module arg -> the expression of its value in `extra_repr`


def parameter_attributes(module: Module) -> dict[str, str]:
    """The attribute each parameter is registered under: its name, or another where an nn.Module
    attribute has it (a parameter `forward` is `forward_`)."""
    return _attributes(module, "self").param_attr


def _attributes(module: Module, self_: str) -> _Attributes:
    params = {p.name: p for p in module.parameters}
    attrs = Namer(MODULE_ATTRIBUTES)
    param_attr = {p.name: attrs.fresh(p.name) for p in module.parameters}
    arg_attr: dict[str, str] = {}
    arg_repr: dict[str, str] = {}
    for arg in module.args:
        owner = params.get(arg.name)
        if owner is not None and owner.when == arg.name:
            # `bias: bool` beside a `bias` parameter: the parameter itself says it (as nn.Linear).
            arg_repr[arg.name] = f"{self_}.{param_attr[arg.name]} is not None"
            continue
        arg_attr[arg.name] = attrs.fresh(arg.name if arg.name not in params else "_" + arg.name)
        arg_repr[arg.name] = f"{self_}.{arg_attr[arg.name]}"
    return _Attributes(self_, param_attr, arg_attr, arg_repr)


def _init_body(module: Module, torch: str, attrs: _Attributes) -> list[str]:
    self_ = attrs.self_
    # Not `super().__init__()`: the op's own name or a module arg may be `super`.
    init: list[str] = [f"{torch}.nn.Module.__init__({self_})"]
    for arg in module.args:
        if arg.name in attrs.arg_attr:
            init.append(f"{self_}.{attrs.arg_attr[arg.name]} = {arg.name}")
    for p in module.parameters:
        shape = ", ".join(str(s) for s in p.shape)
        create = f"{torch}.nn.Parameter({torch}.empty({shape}))"
        if len(p.shape) == 0:
            create = f"{torch}.nn.Parameter({torch}.empty(()))"
        attr = attrs.param_attr[p.name]
        if p.when:
            init += [
                f"if {p.when}:",
                f"    {self_}.{attr} = {create}",
                "else:",
                f"    {self_}.register_parameter({quote.string(attr)}, None)",
            ]
        else:
            init.append(f"{self_}.{attr} = {create}")
    if module.parameters:
        init.append(f"{self_}.reset_parameters()")
    return init


def _reset_body(module: Module, torch: str, math: str, attrs: _Attributes) -> list[str]:
    reset: list[str] = []
    for p in module.parameters:
        attr = f"{attrs.self_}.{attrs.param_attr[p.name]}"
        call = _init_call(torch, attr, p.init.kind, [_init_arg(a, attrs, math) for a in p.init.args])
        if p.when:
            reset += [f"if {attr} is not None:", f"    {call}"]
        else:
            reset.append(call)
    if not reset:
        reset.append("pass  # no parameters")
    return reset


def _forward_params(forward_inputs: list[Input], math: str, types: typed.TypeNames) -> list[str]:
    """The Module's forward parameters, annotated; trailing ones with a default (or `Tensor?`) keep it."""
    start = typed.trailing_defaults([i.type.has_default or i.type.optional for i in forward_inputs])
    forward_params = []
    for k, inp in enumerate(forward_inputs):
        default = default_text(inp.type.default, inp.type.has_default, math) if k >= start else None
        forward_params.append(typed.param(inp.name, typed.input_type(inp.type, types), default))
    return forward_params


def _call_arg(module: Module, name: str, attrs: _Attributes) -> str:
    """What the Module passes the functional for input `name`: a parameter, a stored arg or its own."""
    if name in attrs.param_attr:
        return f"{attrs.self_}.{attrs.param_attr[name]}"
    source = module.attribute_arg(name)
    if source is None:
        return name
    return attrs.arg_repr[source] if source not in attrs.arg_attr else f"{attrs.self_}.{attrs.arg_attr[source]}"


def _repr_fstring(parts: list[tuple[str, str]]) -> str:
    """`f"a={self.a}, b={self.b}"`: each (text, expression) pair as text then the expression's value.

    Too long for one line of `extra_repr` (Note [short lines] in opgen.emit.statements): one f-string
    per pair, in parentheses, as ruff formats it.
    """
    if not parts:
        return '""'
    pieces = [quote.string(text)[1:-1].replace("{", "{{").replace("}", "}}") + "{" + expr + "}" for text, expr in parts]
    pieces = [p + ", " for p in pieces[:-1]] + pieces[-1:]
    if len('        return f""') + sum(len(p) for p in pieces) <= 120:
        return 'f"' + "".join(pieces) + '"'
    return "(\n" + "".join(f'            f"{p}"\n' for p in pieces) + "        )"
