"""Parse stage: raw located YAML -> `Spec` model.

Receives a `Raw` tree from `opgen.load`; returns a `Spec` or records located errors in a
`Problems`. First the YAML's shape is checked (known keys, mappings where mappings belong),
then the model is built (types, names, module and test sections). Formulas are only
checked to be text here; `opgen.formula` reads them.
"""

from __future__ import annotations

import dataclasses
import keyword
import math
import re

from opgen import limits
from opgen.errors import Loc, Problems, SpecError
from opgen.load import Raw, RawList, RawMap, RawScalar
from opgen.model import (
    INIT_ARITY,
    POLICIES,
    TENSOR,
    Formula,
    GradientOverride,
    Init,
    Input,
    InputType,
    Let,
    Module,
    Optimize,
    Output,
    Parameter,
    Scalar,
    Spec,
    TestConfig,
    camel_case,
)
from opgen.names import op_name_problem, public_name_problem
from opgen.native import NATIVE_OPS
from opgen.quote import identifier_problem

TOP_KEYS = ("name", "doc", "inputs", "let", "outputs", "gradients", "module", "tests", "optimize")
REQUIRED_KEYS = ("name", "inputs", "outputs")
MODULE_KEYS = ("name", "args", "parameters", "attributes")
TEST_KEYS = ("domain", "shapes", "values", "gradgrad", "points", "native")
PARAMETER_KEYS = ("shape", "init", "when")
OPTIMIZE_KEYS = tuple(f.name for f in dataclasses.fields(Optimize))
OUTPUT_KEYS = ("formula", "differentiable")

_TYPE_RE = re.compile(
    r"^\s*(?P<kind>Tensor|float|int|bool)\s*"
    r"(?:\[(?P<dims>[^\]]*)\])?\s*(?P<opt>\?)?\s*"
    r"(?:=\s*(?P<default>.*?))?\s*$"
)
_SNAKE_RE = re.compile(r"^[a-z_][a-z0-9_]*$")


def _suggest(word: str, options: tuple[str, ...] | list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(word, list(options), n=1)
    if close:
        return f"; did you mean '{close[0]}'?"
    return "; expected one of: " + ", ".join(options)


def _check_keys(node: RawMap, allowed: tuple[str, ...], where: str, problems: Problems) -> None:
    for key, loc, _ in node.entries:
        if key not in allowed:
            problems.add(SpecError(loc, f"unknown key '{key}' in {where}{_suggest(key, allowed)}"))


def _need_map(node: Raw, what: str) -> RawMap:
    if not isinstance(node, RawMap):
        raise SpecError(node.loc, f"{what} must be a mapping of `name: value` lines")
    return node


def _need_text(node: Raw, what: str) -> RawScalar:
    if not isinstance(node, RawScalar) or isinstance(node.value, bool) and what.endswith("formula"):
        pass
    if not isinstance(node, RawScalar) or node.value is None:
        raise SpecError(node.loc, f"{what} must be a single line of text")
    return node


def check_identifier(name: str, loc: Loc, what: str) -> None:
    """A spec name as the generated code can use it (`opgen.quote.identifier_problem`)."""
    if problem := identifier_problem(name):
        raise SpecError(loc, f"{what} '{name}' {problem}")


def _scalar_default(kind: str, text: str, loc: Loc) -> Scalar:
    lowered = text.strip()
    digits = sum(char.isdigit() for char in lowered)
    if digits > limits.DIGITS.value:
        raise limits.DIGITS.refuse(loc, "this number", digits, "write it shorter, e.g. 1.5e30")
    if kind == "bool":
        if lowered in ("true", "True"):
            return True
        if lowered in ("false", "False"):
            return False
        raise SpecError(loc, f"default '{text}' of a bool input must be true or false")
    try:
        if kind == "int":
            return int(lowered)
        value = float(lowered)
    except ValueError:
        raise SpecError(loc, f"default '{text}' is not a valid {kind}") from None
    return value


def parse_type(text: object, loc: Loc, allow_tensor: bool = True) -> InputType:
    if not isinstance(text, str):
        raise SpecError(loc, f"type must be text such as `Tensor` or `float = 1.0`, not {text!r}")
    match = _TYPE_RE.match(text)
    if not match:
        raise SpecError(
            loc, f"unknown type '{text}'; expected Tensor, Tensor?, Tensor[N, K], float, int or bool (with `= default`)"
        )
    kind, dims_text, opt, default = match["kind"], match["dims"], match["opt"], match["default"]
    if kind != TENSOR:
        if not allow_tensor and kind == TENSOR:
            raise SpecError(loc, "module args cannot be tensors")
        if dims_text is not None or opt:
            raise SpecError(loc, f"'{text}': only Tensor inputs take dimensions or `?`")
        if default is None:
            return InputType(kind)
        return InputType(kind, default=_scalar_default(kind, default, loc), has_default=True)
    if not allow_tensor:
        raise SpecError(loc, f"'{text}': module args are int, float or bool")
    if default is not None:
        raise SpecError(loc, "a Tensor input cannot have a default; use `Tensor?` for an optional tensor")
    dims: tuple[str, ...] | None = None
    if dims_text is not None:
        names = [d.strip() for d in dims_text.split(",")]
        if not names or any(not n for n in names):
            raise SpecError(loc, f"'{text}': dimension names must be non-empty, separated by commas")
        for n in names:
            if n != "..." and not n.isidentifier():
                raise SpecError(loc, f"'{text}': dimension '{n}' is not a name")
            if n != "..." and (problem := identifier_problem(n)) and "NFKC" in problem:
                raise SpecError(loc, f"'{text}': dimension '{n}' {problem}")
        dims = tuple(names)
    return InputType(TENSOR, optional=bool(opt), dims=dims)


def _formula(node: Raw, what: str) -> Formula:
    if not isinstance(node, RawScalar) or node.value is None or isinstance(node.value, bool):
        if isinstance(node, RawScalar) and isinstance(node.value, bool):
            return Formula("true" if node.value else "false", node.loc)
        raise SpecError(node.loc, f"{what} must be a formula (one line of text)")
    value = node.value
    text = value if isinstance(value, str) else repr(value)
    if not text.strip():
        raise SpecError(node.loc, f"{what} is empty")
    loc = node.loc if not node.quoted else Loc(node.loc.file, node.loc.line, node.loc.col + 1)
    return Formula(text, loc)


def _parse_inputs(node: Raw, problems: Problems) -> tuple[Input, ...]:
    mapping = _need_map(node, "inputs")
    if not mapping.entries:
        raise SpecError(mapping.loc, "inputs is empty; an op needs at least one Tensor input")
    inputs = []
    for name, loc, value in mapping.entries:
        with problems.collect():
            check_identifier(name, loc, "input name")
            type_node = _need_text(value, f"the type of input '{name}'")
            inputs.append(Input(name, parse_type(type_node.value, type_node.loc), loc))
    if inputs and not any(i.is_tensor for i in inputs):
        problems.add(SpecError(mapping.loc, "an op needs at least one Tensor input"))
    return tuple(inputs)


def _parse_lets(node: Raw, problems: Problems) -> tuple[Let, ...]:
    mapping = _need_map(node, "let")
    lets = []
    for name, loc, value in mapping.entries:
        with problems.collect():
            check_identifier(name, loc, "let name")
            lets.append(Let(name, _formula(value, f"let '{name}'"), loc))
    return tuple(lets)


def _parse_outputs(node: Raw, problems: Problems) -> tuple[Output, ...]:
    mapping = _need_map(node, "outputs")
    if not mapping.entries:
        raise SpecError(mapping.loc, "outputs is empty; an op needs at least one output")
    outputs = []
    for name, loc, value in mapping.entries:
        with problems.collect():
            check_identifier(name, loc, "output name")
            if isinstance(value, RawMap):
                _check_keys(value, OUTPUT_KEYS, f"output '{name}'", problems)
                formula_node = value.get("formula")
                if formula_node is None:
                    raise SpecError(value.loc, f"output '{name}' needs a `formula:`")
                differentiable = True
                flag = value.get("differentiable")
                if flag is not None:
                    if not isinstance(flag, RawScalar) or not isinstance(flag.value, bool):
                        raise SpecError(flag.loc, "`differentiable` must be true or false")
                    differentiable = flag.value
                outputs.append(Output(name, _formula(formula_node, f"output '{name}'"), differentiable, loc))
            else:
                outputs.append(Output(name, _formula(value, f"output '{name}'"), True, loc))
    if outputs and not any(o.differentiable for o in outputs):
        problems.add(
            SpecError(mapping.loc, "every output is `differentiable: false`; at least one must carry a gradient")
        )
    return tuple(outputs)


def _parse_gradients(node: Raw, inputs: tuple[Input, ...], problems: Problems) -> tuple[GradientOverride, ...]:
    mapping = _need_map(node, "gradients")
    by_name = {i.name: i for i in inputs}
    overrides = []
    for name, loc, value in mapping.entries:
        with problems.collect():
            target = by_name.get(name)
            if target is None:
                tensors = tuple(i.name for i in inputs if i.is_tensor)
                raise SpecError(loc, f"gradient for unknown input '{name}'{_suggest(name, tensors)}")
            if not target.is_tensor:
                raise SpecError(loc, f"input '{name}' is a {target.type.kind}; only Tensor inputs have gradients")
            overrides.append(GradientOverride(name, _formula(value, f"gradient of '{name}'"), loc))
    return tuple(overrides)


def _number(node: Raw, what: str, finite: bool = False) -> float:
    """A number of `tests:`; NaN is refused (no check can pass at or with NaN), and so is
    infinity when `finite` (Note [non-finite numbers] in opgen.quote)."""
    if not isinstance(node, RawScalar) or isinstance(node.value, bool):
        raise SpecError(node.loc, f"{what} must be a number")
    value = node.value
    if isinstance(value, str):
        try:
            number = float(value)  # `inf`, `-inf`, `1e-3` written as text
        except ValueError:
            raise SpecError(node.loc, f"{what} must be a number, not '{value}'") from None
    elif isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf if value > 0 else -math.inf
    else:
        raise SpecError(node.loc, f"{what} must be a number")
    if math.isnan(number):
        raise SpecError(node.loc, f"{what} is NaN; the generated tests need a number to compare")
    if finite and math.isinf(number):
        raise SpecError(node.loc, f"{what} must be finite: tests draw inputs uniformly between the bounds")
    return number


def _int_list(node: Raw, what: str) -> tuple[int, ...]:
    if not isinstance(node, RawList):
        raise SpecError(node.loc, f"{what} must be a list of sizes, e.g. [3, 4]")
    sizes = []
    for item in node.items:
        if not isinstance(item, RawScalar) or isinstance(item.value, bool) or not isinstance(item.value, int):
            raise SpecError(item.loc, f"{what}: sizes must be whole numbers")
        if item.value < 0:
            raise SpecError(item.loc, f"{what}: sizes cannot be negative")
        sizes.append(item.value)
    return tuple(sizes)


def _parse_tests(node: Raw, spec_inputs: tuple[Input, ...], problems: Problems) -> TestConfig:
    mapping = _need_map(node, "tests")
    _check_keys(mapping, TEST_KEYS, "tests", problems)
    by_name = {i.name: i for i in spec_inputs}
    dims = {d for i in spec_inputs if i.type.dims for d in i.type.dims}
    domain: list[tuple[str, float, float]] = []
    shapes: list[tuple[str, tuple[int, ...]]] = []
    values: list[tuple[str, Scalar]] = []
    gradgrad = True
    if (node_ := mapping.get("domain")) is not None:
        for name, loc, value in _need_map(node_, "tests.domain").entries:
            with problems.collect():
                if name not in by_name or not by_name[name].is_tensor:
                    raise SpecError(loc, f"tests.domain: '{name}' is not a Tensor input")
                if not isinstance(value, RawList) or len(value.items) != 2:
                    raise SpecError(value.loc, f"tests.domain.{name} must be [low, high]")
                low, high = (_number(v, f"tests.domain.{name}", finite=True) for v in value.items)
                if not low < high:
                    raise SpecError(value.loc, f"tests.domain.{name}: low ({low}) must be below high ({high})")
                domain.append((name, low, high))
    if (node_ := mapping.get("shapes")) is not None:
        for name, loc, value in _need_map(node_, "tests.shapes").entries:
            with problems.collect():
                if name in dims:
                    if (
                        not isinstance(value, RawScalar)
                        or isinstance(value.value, bool)
                        or not isinstance(value.value, int)
                        or value.value < 1
                    ):
                        raise SpecError(
                            value.loc, f"tests.shapes.{name}: a dimension size must be a positive whole number"
                        )
                    shapes.append((name, (value.value,)))
                elif name in by_name and by_name[name].is_tensor:
                    shapes.append((name, _int_list(value, f"tests.shapes.{name}")))
                else:
                    raise SpecError(loc, f"tests.shapes: '{name}' is neither a Tensor input nor a named dimension")
    if (node_ := mapping.get("values")) is not None:
        for name, loc, value in _need_map(node_, "tests.values").entries:
            with problems.collect():
                if name not in by_name or by_name[name].is_tensor:
                    raise SpecError(loc, f"tests.values: '{name}' is not a float, int or bool input")
                kind = by_name[name].type.kind
                if not isinstance(value, RawScalar):
                    raise SpecError(value.loc, f"tests.values.{name} must be a {kind}")
                sample = _scalar_default(kind, str(value.value), value.loc)
                if isinstance(sample, float) and math.isnan(sample):
                    raise SpecError(
                        value.loc, f"tests.values.{name} is NaN; the generated tests need a number to compare"
                    )
                values.append((name, sample))
    if (node_ := mapping.get("gradgrad")) is not None:
        if not isinstance(node_, RawScalar) or not isinstance(node_.value, bool):
            problems.add(SpecError(node_.loc, "tests.gradgrad must be true or false"))
        else:
            gradgrad = node_.value
    points = _parse_points(mapping.get("points"), by_name, problems)
    native = _parse_native(mapping.get("native"), spec_inputs, problems)
    return TestConfig(tuple(domain), tuple(shapes), tuple(values), gradgrad, points, native)


Points = tuple[tuple[str, tuple[float, ...]], ...]


def _parse_points(node: Raw | None, by_name: dict[str, Input], problems: Problems) -> Points:
    """`tests.points`: `input: [values]`, lists of one length, read row by row."""
    if node is None:
        return ()
    if not isinstance(node, RawMap):
        problems.add(SpecError(node.loc, "tests.points must be a mapping `input: [values]`"))
        return ()
    points: list[tuple[str, tuple[float, ...]]] = []
    for name, loc, value in node.entries:
        with problems.collect():
            if name not in by_name or not by_name[name].is_tensor:
                raise SpecError(loc, f"tests.points: '{name}' is not a Tensor input")
            if not isinstance(value, RawList) or not value.items:
                example = "e.g. [-1.0, 0.0, 1.0]"
                raise SpecError(value.loc, f"tests.points.{name} must be a non-empty list of numbers, {example}")
            row = tuple(_number(v, f"tests.points.{name}") for v in value.items)
            if points and len(row) != len(points[0][1]):
                first, count = points[0][0], len(points[0][1])
                raise SpecError(
                    value.loc,
                    f"tests.points.{name} has {len(row)} value(s) but tests.points.{first} has {count};"
                    " the lists are read row by row, so they must have one length",
                )
            points.append((name, row))
    return tuple(points)


def _parse_native(node: Raw | None, inputs: tuple[Input, ...], problems: Problems) -> str | None:
    """`tests.native`: the name of a PyTorch op (`opgen.native`) taking the spec's inputs in order."""
    if node is None:
        return None
    with problems.collect():
        if not isinstance(node, RawScalar) or not isinstance(node.value, str):
            raise SpecError(node.loc, "tests.native must be the name of a PyTorch op, e.g. hardtanh")
        op = NATIVE_OPS.get(node.value)
        if op is None:
            hint = _suggest(node.value, tuple(sorted(NATIVE_OPS)))
            raise SpecError(node.loc, f"tests.native: unknown op '{node.value}'{hint}")
        if op.arity != len(inputs):
            raise SpecError(
                node.loc,
                f"tests.native: {node.value} takes {op.arity} arguments (the spec's inputs, in order),"
                f" but this spec has {len(inputs)} input{'s' if len(inputs) != 1 else ''}",
            )
        return node.value
    return None


_INIT_RE = re.compile(r"^\s*(?P<kind>[a-z_]+)\s*(?:\((?P<args>[^)]*)\))?\s*$")


def _parse_init(node: Raw, name: str) -> Init:
    if not isinstance(node, RawScalar) or not isinstance(node.value, str):
        raise SpecError(node.loc, f"init of parameter '{name}' must be text such as `uniform(-0.1, 0.1)`")
    match = _INIT_RE.match(node.value)
    kinds = tuple(INIT_ARITY)
    if not match or match["kind"] not in INIT_ARITY:
        word = match["kind"] if match else node.value
        raise SpecError(node.loc, f"unknown init '{node.value}'{_suggest(word, kinds)}")
    args_text = (match["args"] or "").strip()
    try:
        args = tuple(float(a) for a in args_text.split(",")) if args_text else ()
    except ValueError:
        raise SpecError(node.loc, f"init '{node.value}': arguments must be numbers") from None
    if not all(math.isfinite(a) for a in args):
        raise SpecError(
            node.loc, f"init '{node.value}': arguments must be finite, else the parameter is NaN or infinite"
        )
    if len(args) not in INIT_ARITY[match["kind"]]:
        counts = " or ".join(str(n) for n in INIT_ARITY[match["kind"]])
        raise SpecError(node.loc, f"init '{match['kind']}' takes {counts} argument(s), got {len(args)}")
    return Init(match["kind"], args)


def _parse_module(node: Raw, spec_name: str, inputs: tuple[Input, ...], problems: Problems) -> Module:
    mapping = (
        _need_map(node, "module") if not (isinstance(node, RawScalar) and node.value is None) else RawMap((), node.loc)
    )
    _check_keys(mapping, MODULE_KEYS, "module", problems)
    by_name = {i.name: i for i in inputs}
    name = camel_case(spec_name)
    if (name_node := mapping.get("name")) is not None:
        text = _need_text(name_node, "module.name")
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
        name = text.value
    args: list[Input] = []
    if (args_node := mapping.get("args")) is not None:
        for arg_name, loc, value in _need_map(args_node, "module.args").entries:
            with problems.collect():
                check_identifier(arg_name, loc, "module arg")
                text = _need_text(value, f"the type of module arg '{arg_name}'")
                args.append(Input(arg_name, parse_type(text.value, text.loc, allow_tensor=False), loc))
    arg_by_name = {a.name: a for a in args}
    parameters: list[Parameter] = []
    if (params_node := mapping.get("parameters")) is not None:
        for pname, loc, value in _need_map(params_node, "module.parameters").entries:
            with problems.collect():
                target = by_name.get(pname)
                if target is None or not target.is_tensor:
                    raise SpecError(loc, f"parameter '{pname}' is not a Tensor input of the op")
                pmap = _need_map(value, f"parameter '{pname}'")
                _check_keys(pmap, PARAMETER_KEYS, f"parameter '{pname}'", problems)
                shape_node = pmap.get("shape")
                if shape_node is None or not isinstance(shape_node, RawList):
                    raise SpecError(pmap.loc, f"parameter '{pname}' needs `shape: [...]` (ints or int module args)")
                shape: list[int | str] = []
                for item in shape_node.items:
                    if not isinstance(item, RawScalar) or isinstance(item.value, bool):
                        raise SpecError(item.loc, "a shape entry must be a whole number or an int module arg")
                    if isinstance(item.value, int):
                        shape.append(item.value)
                    elif (
                        isinstance(item.value, str)
                        and item.value in arg_by_name
                        and arg_by_name[item.value].type.kind == "int"
                    ):
                        shape.append(item.value)
                    else:
                        ints = tuple(a.name for a in args if a.type.kind == "int")
                        hint = _suggest(str(item.value), ints) if ints else "; declare it under module.args"
                        raise SpecError(item.loc, f"shape entry '{item.value}' is not an int module arg{hint}")
                if (
                    target.type.dims is not None
                    and len(target.type.dims) != len(shape)
                    and "..." not in target.type.dims
                ):
                    raise SpecError(
                        shape_node.loc,
                        f"parameter '{pname}' has {len(shape)} dimensions"
                        f" but input '{pname}' is declared {target.type}",
                    )
                init_node = pmap.get("init")
                if init_node is None:
                    raise SpecError(pmap.loc, f"parameter '{pname}' needs an `init:`, e.g. `uniform(-0.1, 0.1)`")
                init = _parse_init(init_node, pname)
                when = None
                if (when_node := pmap.get("when")) is not None:
                    text = _need_text(when_node, f"when of parameter '{pname}'")
                    arg = arg_by_name.get(str(text.value))
                    if arg is None or arg.type.kind != "bool":
                        raise SpecError(text.loc, f"`when: {text.value}` must name a bool module arg")
                    if not target.type.optional:
                        raise SpecError(
                            text.loc, f"parameter '{pname}' has `when:` but input '{pname}' is not optional (`Tensor?`)"
                        )
                    when = arg.name
                parameters.append(Parameter(pname, tuple(shape), init, when, loc))
    attributes: dict[str, str] = {}
    param_names = {p.name for p in parameters}
    for i in inputs:
        if not i.is_tensor and i.name in arg_by_name:
            attributes[i.name] = i.name
    if (attrs_node := mapping.get("attributes")) is not None:
        for iname, loc, value in _need_map(attrs_node, "module.attributes").entries:
            with problems.collect():
                target = by_name.get(iname)
                if target is None or target.is_tensor:
                    raise SpecError(loc, f"attribute '{iname}' is not a float, int or bool input of the op")
                text = _need_text(value, f"attribute '{iname}'")
                if str(text.value) not in arg_by_name:
                    raise SpecError(text.loc, f"attribute '{iname}' names '{text.value}', which is not a module arg")
                attributes[iname] = str(text.value)
    del param_names
    return Module(name, tuple(args), tuple(parameters), tuple(attributes.items()), mapping.loc)


def parse_spec(raw: Raw, source: str, problems: Problems) -> Spec | None:
    """Build the model of one spec; record every problem found and return None if any."""
    before = len(problems.errors)
    try:
        top = _need_map(raw, "a spec")
    except SpecError as error:
        problems.add(error)
        return None
    _check_keys(top, TOP_KEYS, "the spec", problems)
    for key in REQUIRED_KEYS:
        if top.get(key) is None:
            problems.add(SpecError(top.loc, f"missing required key '{key}'"))
    name, doc = "", ""
    with problems.collect():
        if (node := top.get("name")) is not None:
            text = _need_text(node, "name")
            name = str(text.value)
            if not _SNAKE_RE.match(name) or keyword.iskeyword(name) or (name.startswith("__") and name.endswith("__")):
                raise SpecError(text.loc, f"name '{name}' must be a snake_case Python identifier, e.g. my_op")
            if problem := identifier_problem(name) or op_name_problem(name):
                raise SpecError(text.loc, f"name '{name}' {problem}")
    with problems.collect():
        if (node := top.get("doc")) is not None:
            doc = str(_need_text(node, "doc").value)
    inputs: tuple[Input, ...] = ()
    lets: tuple[Let, ...] = ()
    outputs: tuple[Output, ...] = ()
    gradients: tuple[GradientOverride, ...] = ()
    module = None
    tests = TestConfig()
    with problems.collect():
        if (node := top.get("inputs")) is not None:
            inputs = _parse_inputs(node, problems)
    with problems.collect():
        if (node := top.get("let")) is not None:
            lets = _parse_lets(node, problems)
    with problems.collect():
        if (node := top.get("outputs")) is not None:
            outputs = _parse_outputs(node, problems)
    with problems.collect():
        if (node := top.get("gradients")) is not None:
            gradients = _parse_gradients(node, inputs, problems)
    with problems.collect():
        if (node := top.get("module")) is not None:
            module = _parse_module(node, name or "op", inputs, problems)
    with problems.collect():
        if (node := top.get("tests")) is not None:
            tests = _parse_tests(node, inputs, problems)
    optimize = Optimize()
    with problems.collect():
        if (node := top.get("optimize")) is not None:
            optimize = _parse_optimize(node, problems)
    _check_unique_names(inputs, lets, outputs, problems)
    _check_counts(top, problems)
    if len(problems.errors) > before:
        return None
    return Spec(name, doc, inputs, lets, outputs, gradients, module, tests, source, top.loc, optimize)


def _parse_optimize(node: Raw, problems: Problems) -> Optimize:
    mapping = _need_map(node, "optimize")
    _check_keys(mapping, OPTIMIZE_KEYS, "optimize", problems)
    values: dict[str, bool | str] = {}
    for key, _, value in mapping.entries:
        if key == "policy":
            if not isinstance(value, RawScalar) or value.value not in POLICIES:
                shown = value.value if isinstance(value, RawScalar) else "this"
                raise SpecError(value.loc, f"optimize.policy '{shown}' is not one of: {', '.join(POLICIES)}")
            values[key] = str(value.value)
        elif key in OPTIMIZE_KEYS:
            if not isinstance(value, RawScalar) or not isinstance(value.value, bool):
                raise SpecError(value.loc, f"optimize.{key} must be true or false")
            values[key] = value.value
    return Optimize(**values)  # type: ignore[arg-type]


def _check_unique_names(
    inputs: tuple[Input, ...], lets: tuple[Let, ...], outputs: tuple[Output, ...], problems: Problems
) -> None:
    seen: dict[str, tuple[str, Loc]] = {}
    named: list[tuple[str, str, Loc]] = [(i.name, "input", i.loc) for i in inputs]
    named += [(let.name, "let", let.loc) for let in lets]
    named += [(o.name, "output", o.loc) for o in outputs]
    for name, what, loc in named:
        if name in seen:
            other, where = seen[name]
            problems.add(
                SpecError(loc, f"{what} '{name}' has the same name as the {other} at {where}; names must be unique")
            )
        else:
            seen[name] = (what, loc)


def _check_counts(top: RawMap, problems: Problems) -> None:
    """At most `opgen.limits`' number of inputs, lets and outputs."""
    for key, limit in (("inputs", limits.INPUTS), ("let", limits.LETS), ("outputs", limits.OUTPUTS)):
        node = top.get(key)
        if isinstance(node, RawMap) and len(node.entries) > limit.value:
            problems.add(
                limit.refuse(top.key_loc(key), f"the number of {limit.name}", len(node.entries), "split the op")
            )
