"""Parse stage: raw located YAML -> `Spec` model.

Receives a `Raw` tree from `opgen.spec.load`; returns a `Spec` or records located errors in a
`Problems`. First the YAML's shape is checked (known keys, mappings where mappings belong),
then the model is built (types, names, module and test sections). Formulas are only
checked to be text here; `opgen.formula.reader` reads them. The checks of single values are in
`opgen.spec.parse_common`; the `module:` and `tests:` sections in `opgen.spec.parse_module` and
`opgen.spec.parse_tests`.
"""

from __future__ import annotations

import dataclasses
import keyword
import re

from opgen import limits
from opgen.errors import Loc, Problems, SpecError
from opgen.spec.load import Raw, RawMap, RawScalar
from opgen.spec.model import (
    AUTOCAST_POLICIES,
    FORMS,
    POLICIES,
    GradientOverride,
    Input,
    Let,
    Optimize,
    Output,
    Spec,
    TestConfig,
)
from opgen.spec.names import op_name_problem
from opgen.spec.parse_common import check_identifier, check_keys, formula, need_map, need_text, parse_type, suggest
from opgen.spec.parse_module import parse_module
from opgen.spec.parse_tests import parse_tests
from opgen.spec.quote import identifier_problem

TOP_KEYS = ("name", "doc", "inputs", "let", "outputs", "gradients", "module", "tests", "optimize", "form", "autocast")
REQUIRED_KEYS = ("name", "inputs", "outputs")
OPTIMIZE_KEYS = tuple(f.name for f in dataclasses.fields(Optimize))
OUTPUT_KEYS = ("formula", "differentiable")

_SNAKE_RE = re.compile(r"^[a-z_][a-z0-9_]*$")


def _parse_inputs(node: Raw, problems: Problems) -> tuple[Input, ...]:
    mapping = need_map(node, "inputs")
    if not mapping.entries:
        raise SpecError(mapping.loc, "inputs is empty; an op needs at least one Tensor input")
    inputs = []
    before = len(problems.errors)
    for name, loc, value in mapping.entries:
        with problems.collect():
            check_identifier(name, loc, "input name")
            type_node = need_text(value, f"the type of input '{name}'")
            inputs.append(Input(name, parse_type(type_node.value, type_node.loc), loc))
    # An input whose type was refused may be the Tensor: say so only when every input was read.
    if inputs and len(problems.errors) == before and not any(i.is_tensor for i in inputs):
        problems.add(SpecError(mapping.loc, "an op needs at least one Tensor input"))
    return tuple(inputs)


def _parse_lets(node: Raw, problems: Problems) -> tuple[Let, ...]:
    mapping = need_map(node, "let")
    lets = []
    for name, loc, value in mapping.entries:
        with problems.collect():
            check_identifier(name, loc, "let name")
            lets.append(Let(name, formula(value, f"let '{name}'"), loc))
    return tuple(lets)


def _parse_outputs(node: Raw, problems: Problems) -> tuple[Output, ...]:
    mapping = need_map(node, "outputs")
    if not mapping.entries:
        raise SpecError(mapping.loc, "outputs is empty; an op needs at least one output")
    outputs = []
    for name, loc, value in mapping.entries:
        with problems.collect():
            check_identifier(name, loc, "output name")
            if isinstance(value, RawMap):
                check_keys(value, OUTPUT_KEYS, f"output '{name}'", problems)
                formula_node = value.get("formula")
                if formula_node is None:
                    raise SpecError(value.loc, f"output '{name}' needs a `formula:`")
                differentiable = True
                flag = value.get("differentiable")
                if flag is not None:
                    if not isinstance(flag, RawScalar) or not isinstance(flag.value, bool):
                        raise SpecError(flag.loc, "`differentiable` must be true or false")
                    differentiable = flag.value
                outputs.append(Output(name, formula(formula_node, f"output '{name}'"), differentiable, loc))
            else:
                outputs.append(Output(name, formula(value, f"output '{name}'"), True, loc))
    if outputs and not any(o.differentiable for o in outputs):
        problems.add(
            SpecError(mapping.loc, "every output is `differentiable: false`; at least one must carry a gradient")
        )
    return tuple(outputs)


def _parse_gradients(node: Raw, inputs: tuple[Input, ...], problems: Problems) -> tuple[GradientOverride, ...]:
    mapping = need_map(node, "gradients")
    by_name = {i.name: i for i in inputs}
    overrides = []
    for name, loc, value in mapping.entries:
        with problems.collect():
            target = by_name.get(name)
            if target is None:
                tensors = tuple(i.name for i in inputs if i.is_tensor)
                raise SpecError(loc, f"gradient for unknown input '{name}'{suggest(name, tensors)}")
            if not target.is_tensor:
                raise SpecError(
                    loc,
                    f"input '{name}' is a {target.type.kind}; only Tensor inputs have gradients"
                    f" (declare it `{name}: Tensor[]` for a learnable scalar)",
                )
            overrides.append(GradientOverride(name, formula(value, f"gradient of '{name}'"), loc))
    return tuple(overrides)


def name_problem(name: str) -> str | None:
    """Why `name` cannot be an op's `name:`, or None (also `opgen new NAME`)."""
    if not _SNAKE_RE.match(name) or keyword.iskeyword(name) or (name.startswith("__") and name.endswith("__")):
        return "must be a snake_case Python identifier, e.g. my_op"
    if len(name) > limits.NAME_LENGTH.value:  # it names files: tests/test_NAME.py must fit 255 bytes
        limit = limits.NAME_LENGTH
        return f"is {len(name)} {limit.unit}, over the '{limit.name}' limit of {limit.value}; choose a shorter name"
    return identifier_problem(name) or op_name_problem(name)


def parse_spec(raw: Raw, source: str, problems: Problems) -> Spec | None:
    """Build the model of one spec; record every problem found and return None if any."""
    before = len(problems.errors)
    try:
        top = need_map(raw, "a spec")
    except SpecError as error:
        problems.add(error)
        return None
    check_keys(top, TOP_KEYS, "the spec", problems)
    for key in REQUIRED_KEYS:
        if top.get(key) is None:
            problems.add(SpecError(top.loc, f"missing required key '{key}'"))
    name, doc = "", ""
    with problems.collect():
        if (node := top.get("name")) is not None:
            text = need_text(node, "name")
            name = str(text.value)
            if problem := name_problem(name):
                raise SpecError(text.loc, f"name '{name}' {problem}")
    with problems.collect():
        if (node := top.get("doc")) is not None:
            doc = str(need_text(node, "doc").value)
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
            module = parse_module(node, name or "op", inputs, problems)
    with problems.collect():
        if (node := top.get("tests")) is not None:
            tests = parse_tests(node, inputs, problems)
    optimize = Optimize()
    with problems.collect():
        if (node := top.get("optimize")) is not None:
            optimize = _parse_optimize(node, problems)
    form, autocast = (
        _parse_choice(top, "form", FORMS, problems),
        _parse_choice(top, "autocast", AUTOCAST_POLICIES, problems),
    )
    _check_unique_names(inputs, lets, outputs, problems)
    _check_counts(top, problems)
    if len(problems.errors) > before:
        return None
    spec = Spec(name, doc, inputs, lets, outputs, gradients, module, tests, source, top.loc, optimize, form)
    return dataclasses.replace(spec, autocast=autocast) if autocast else spec


def _parse_choice(top: RawMap, key: str, choices: tuple[str, ...], problems: Problems) -> str | None:
    """`form:` (Note [custom_op form] in opgen/emit/custom_op.py) or `autocast:` (Note [autocast] in
    opgen/emit/capture.py); None when the spec does not say, or says something else (a problem)."""
    node = top.get(key)
    if node is None:
        return None
    if not isinstance(node, RawScalar) or node.value not in choices:
        shown = f"'{node.value}'" if isinstance(node, RawScalar) else "this value"
        problems.add(SpecError(node.loc, f"{key} {shown} is not one of: {', '.join(choices)}"))
        return None
    return str(node.value)


def _parse_optimize(node: Raw, problems: Problems) -> Optimize:
    mapping = need_map(node, "optimize")
    check_keys(mapping, OPTIMIZE_KEYS, "optimize", problems)
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
