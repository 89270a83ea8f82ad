"""Parse stage, `module:` section: raw YAML -> `Module` (class name, args, parameters, attributes).

Receives the `module:` node, the op's name and its inputs; returns the `Module` the module
emitter builds the `nn.Module` from, recording every located problem in `problems`.
"""

from __future__ import annotations

import keyword

from opgen.errors import Loc, Problems, SpecError
from opgen.spec.load import Raw, RawList, RawMap, RawScalar
from opgen.spec.model import Input, Module, Parameter, camel_case
from opgen.spec.names import public_name_problem
from opgen.spec.parse_common import check_identifier, check_keys, need_map, need_text, parse_type, suggest
from opgen.spec.parse_init import parse_init
from opgen.spec.quote import identifier_problem

MODULE_KEYS = ("name", "args", "parameters", "attributes")
PARAMETER_KEYS = ("shape", "init", "when")


def parse_module(node: Raw, spec_name: str, inputs: tuple[Input, ...], problems: Problems) -> Module:
    mapping = (
        need_map(node, "module") if not (isinstance(node, RawScalar) and node.value is None) else RawMap((), node.loc)
    )
    check_keys(mapping, MODULE_KEYS, "module", problems)
    name = camel_case(spec_name)
    if (name_node := mapping.get("name")) is not None:
        name = _class_name(name_node, spec_name)
    args: list[Input] = []
    if (args_node := mapping.get("args")) is not None:
        for arg_name, loc, value in need_map(args_node, "module.args").entries:
            with problems.collect():
                check_identifier(arg_name, loc, "module arg")
                text = need_text(value, f"the type of module arg '{arg_name}'")
                args.append(Input(arg_name, parse_type(text.value, text.loc, allow_tensor=False), loc))
    by_name = {i.name: i for i in inputs}
    parameters: list[Parameter] = []
    if (params_node := mapping.get("parameters")) is not None:
        for pname, loc, value in need_map(params_node, "module.parameters").entries:
            with problems.collect():
                target = by_name.get(pname)
                if target is None or not target.is_tensor:
                    raise SpecError(loc, f"parameter '{pname}' is not a Tensor input of the op")
                parameters.append(_parameter(target, value, args, loc, problems))
    attributes = _attributes(mapping.get("attributes"), inputs, args, problems)
    return Module(name, tuple(args), tuple(parameters), attributes, mapping.loc)


def _class_name(node: Raw, spec_name: str) -> str:
    """`module.name`: a class name the package can export beside the op's own names."""
    text = need_text(node, "module.name")
    if not isinstance(text.value, str) or not text.value.isidentifier() or keyword.iskeyword(text.value):
        raise SpecError(text.loc, f"module.name '{text.value}' is not a Python class name")
    if problem := identifier_problem(text.value) or public_name_problem(text.value):
        raise SpecError(text.loc, f"module.name '{text.value}' {problem}")
    for taken, what in (
        (spec_name, "the op's functional"),
        (camel_case(spec_name) + "Function", "the op's Function class"),
    ):
        if text.value == taken:
            raise SpecError(
                text.loc,
                f"module.name '{taken}' is already the name of {what}; the package exports both, so choose another",
            )
    return text.value


def _parameter(target: Input, node: Raw, args: list[Input], loc: Loc, problems: Problems) -> Parameter:
    """One entry of `module.parameters`: the Module holds input `target` as an `nn.Parameter`."""
    pname = target.name
    pmap = need_map(node, f"parameter '{pname}'")
    check_keys(pmap, PARAMETER_KEYS, f"parameter '{pname}'", problems)
    shape_node = pmap.get("shape")
    if shape_node is None or not isinstance(shape_node, RawList):
        raise SpecError(pmap.loc, f"parameter '{pname}' needs `shape: [...]` (ints or int module args)")
    shape = tuple(_shape_entry(item, args) for item in shape_node.items)
    if target.type.dims is not None and len(target.type.dims) != len(shape) and "..." not in target.type.dims:
        raise SpecError(
            shape_node.loc,
            f"parameter '{pname}' has {len(shape)} dimensions but input '{pname}' is declared {target.type}",
        )
    init_node = pmap.get("init")
    if init_node is None:
        raise SpecError(pmap.loc, f"parameter '{pname}' needs an `init:`, e.g. `uniform(-0.1, 0.1)`")
    init = parse_init(init_node, pname, args)
    when = None
    if (when_node := pmap.get("when")) is not None:
        text = need_text(when_node, f"when of parameter '{pname}'")
        arg = next((a for a in args if a.name == str(text.value)), None)
        if arg is None or arg.type.kind != "bool":
            raise SpecError(text.loc, f"`when: {text.value}` must name a bool module arg")
        if not target.type.optional:
            not_optional = f"input '{pname}' is not optional (`Tensor?`)"
            raise SpecError(text.loc, f"parameter '{pname}' has `when:` but {not_optional}")
        when = arg.name
    return Parameter(pname, shape, init, when, loc)


def _shape_entry(item: Raw, args: list[Input]) -> int | str:
    """One size of a parameter's `shape:`: a whole number, or the name of an int module arg."""
    if not isinstance(item, RawScalar) or isinstance(item.value, bool):
        raise SpecError(item.loc, "a shape entry must be a whole number or an int module arg")
    ints = tuple(a.name for a in args if a.type.kind == "int")
    if isinstance(item.value, int) and item.value < 0:  # torch.empty(-3) raised when the module was made
        raise SpecError(item.loc, f"shape entry {item.value} is negative; a size is a whole number, 0 or more")
    if isinstance(item.value, int) or (isinstance(item.value, str) and item.value in ints):
        return item.value
    hint = suggest(str(item.value), ints) if ints else "; declare it under module.args"
    raise SpecError(item.loc, f"shape entry '{item.value}' is not an int module arg{hint}")


def _attributes(
    node: Raw | None, inputs: tuple[Input, ...], args: list[Input], problems: Problems
) -> tuple[tuple[str, str], ...]:
    """Which module arg each non-tensor input takes: one of its own name, or as `module.attributes` says."""
    arg_names = {a.name for a in args}
    attributes = {i.name: i.name for i in inputs if not i.is_tensor and i.name in arg_names}
    if node is None:
        return tuple(attributes.items())
    by_name = {i.name: i for i in inputs}
    for iname, loc, value in need_map(node, "module.attributes").entries:
        with problems.collect():
            target = by_name.get(iname)
            if target is None or target.is_tensor:
                raise SpecError(loc, f"attribute '{iname}' is not a float, int or bool input of the op")
            text = need_text(value, f"attribute '{iname}'")
            if str(text.value) not in arg_names:
                raise SpecError(text.loc, f"attribute '{iname}' names '{text.value}', which is not a module arg")
            attributes[iname] = str(text.value)
    return tuple(attributes.items())
