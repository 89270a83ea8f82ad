"""Emit stage, tests part: `Plan` -> the generated pytest file of one op.

Receives a `Plan`; returns the text of `tests/test_<name>.py`. The file holds a reference
implementation of the spec's formulas written by `opgen.formula.reference` (plain torch, straight
from the formula text, never from SymPy), samples inputs as `tests:` says, and checks the
generated op against it: forward values, gradients against autograd of the reference (or
the override formula), gradcheck, gradgradcheck, broadcasting, `None` for `Tensor?` inputs,
the saved tensors, and the Module; at `tests.points` that values and derivatives are
finite, and, with `tests.native`, that the first output matches PyTorch's own op.
"""

from __future__ import annotations

import ast
import math as math_module
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opgen.emit import annotations as typed
from opgen.emit import layout
from opgen.emit.forward import size_divisor, size_sources
from opgen.emit.module import parameter_attributes
from opgen.emit.names import public_names
from opgen.emit.render import Renderer
from opgen.emit.samples import BATCH_SHAPE, dim_sizes, parameter_sizes, sample_shapes, shape_error, with_cut_sizes
from opgen.emit.small_call import native_op
from opgen.formula.python_source import fitted
from opgen.formula.read import dimension_names
from opgen.formula.reference import reference_tree
from opgen.formula.slicing import divisors
from opgen.formula.syntax import holds_tensors, parse_ast, stopped_inputs
from opgen.formula.tensor import BATCH
from opgen.plan.backward import Plan
from opgen.plan.capture import autocast_policy
from opgen.plan.extremes import Row, applies, places
from opgen.spec import quote
from opgen.spec.model import DISCRETE_KINDS, SAMPLE_VALUES, Formula, Scalar, Spec
from opgen.spec.names import Namer
from opgen.spec.native import NATIVE_OPS

DEFAULT_ARG = {"float": 0.5, "int": 4, "bool": True}


@dataclass(frozen=True)
class ReferenceFunction:
    name: str
    signature: str  # `def name(params):`, laid out
    converts: list[str]  # non-tensor inputs made tensors
    lines: list[str]
    returns: str  # `return {...}`, laid out


def _temporaries(namer: Namer) -> Callable[[str], str]:
    """`fresh(stem)`: `stem_t0`, `stem_t1`, ..., none taken in the module (a copy of `namer`)."""
    local = Namer(namer.taken)
    counts: dict[str, int] = {}

    def fresh(stem: str) -> str:
        counts[stem] = counts.get(stem, -1) + 1
        return local.fresh(f"{stem}_t{counts[stem]}")

    return fresh


def _size_texts(spec: Spec, names: dict[str, str]) -> dict[str, str]:
    """Source text for the size of each named dimension not shadowed by a spec name."""
    sizes = size_sources(spec, tuple(dimension_names(spec)))
    return {
        d: f"{names[source]}.shape[{index}]{size_divisor(spec, source, index)}"
        for d, (source, index) in sizes.items()
        if d not in names
    }


def _dependency_order(formulas: list[tuple[str, Formula]]) -> list[tuple[str, Formula]]:
    defined = {name for name, _ in formulas}
    uses = {name: {n.id for n in ast.walk(parse_ast(f)) if isinstance(n, ast.Name)} & defined for name, f in formulas}
    order: list[tuple[str, Formula]] = []
    done: set[str] = set()
    by_name = dict(formulas)

    def visit(name: str) -> None:
        if name in done:
            return
        done.add(name)
        for used in sorted(uses[name]):
            visit(used)
        order.append((name, by_name[name]))

    for name, _ in formulas:
        visit(name)
    return order


def _reference(
    spec: Spec, names: dict[str, str], fname: str, absent: set[str], t: str, torch: str, math: str, namer: Namer
) -> ReferenceFunction:
    formulas = [(let.name, let.formula) for let in spec.lets] + [(o.name, o.formula) for o in spec.outputs]
    lines = []
    gone = set(absent)
    fresh = _temporaries(namer)
    for name, formula in _dependency_order(formulas):
        tree = reference_tree(
            formula, names, t, torch, math, gone, _size_texts(spec, names), tensors=holds_tensors(spec)
        )
        if tree is None:
            gone.add(name)
            continue
        lines += fitted(f"{names[name]} = ", tree, 4, fresh, math)
    kept = [n for n, _ in formulas if n not in gone]
    types = _types(torch)
    params = [typed.reference_param(i.type, names[i.name], absent, types) for i in spec.inputs]
    signature = typed.define(fname, params, f"dict[str, {types.tensor}]", 0)
    converts = [names[i.name] for i in spec.inputs if not i.is_tensor]
    returns = layout.collection("return ", [f"{quote.string(n)}: {names[n]}" for n in kept], "{}", 4)
    return ReferenceFunction(fname, signature, converts, lines, returns)


def _module_args(spec: Spec, math: str) -> tuple[list[str], dict[str, str]]:
    """Constructor arguments for the Module test, and the value each arg ends up with.

    An int arg named like a dimension (`in_features`) gets that dimension's sample size;
    one that sizes a parameter, the size of the parameter's input (`parameter_sizes`); an
    arg with a finite default keeps it (a NaN or infinite one is replaced, as `Spec.test_value`) and is
    left out: the constructor keeps every declared default (`opgen.emit.annotations.keyword_only_from`).
    """
    assert spec.module is not None
    values: dict[str, Scalar] = {**parameter_sizes(spec), **dim_sizes(spec), **dict(spec.tests.values)}
    args = []
    chosen: dict[str, str] = {}
    for arg in spec.module.args:
        default = arg.type.default
        if arg.name in values:
            value = values[arg.name]
        elif arg.type.has_default and default is not None and _finite(default):
            chosen[arg.name] = quote.number(default, math)
            continue
        else:
            value = DEFAULT_ARG[arg.type.kind]
        args.append(f"{arg.name}={quote.number(value, math)}")
        chosen[arg.name] = quote.number(value, math)
    return args, chosen


def _finite(value: Scalar) -> bool:
    return not isinstance(value, float) or math_module.isfinite(value)


# Every name the generated test module defines or uses besides the spec's (see test_op.py.j2):
# module globals, the locals of its test functions and the builtins it calls. The op's
# functional and classes are imported under another name when theirs is one of these.
TEST_MODULE_NAMES = frozenset(
    """pytest DTYPE SHAPES BROADCAST_SHAPES BATCHED_SHAPES SAVED RESIDUALS VALUES OTHER_VALUES POINTS EXTREMES
    PLACES OP sample_inputs point_inputs native reference shapes seed values generator count args k name module
    params forward_args full len next iter enumerate dict getattr list repr Any bool float int str tuple
    isinstance monkeypatch through_the_function""".split()
)


def _test_module_globals(spec: Spec, optional: list[str]) -> set[str]:
    """TEST_MODULE_NAMES and the names made from spec names: `reference_without_<input>`,
    `reference_grad_<input>`, `test_<input>_none_drops_its_terms`."""
    made = {f"reference_without_{n}" for n in optional} | {f"test_{n}_none_drops_its_terms" for n in optional}
    return set(TEST_MODULE_NAMES) | made | {f"reference_grad_{g.input}" for g in spec.gradients}


def _import_names(public: list[str], namer: Namer, avoid: set[str]) -> dict[str, str]:
    """The name each exported op name has in the test module: its own, unless that is one of
    `avoid` or pytest would collect it as a test (`test*`, `Test*`)."""
    return {
        name: namer.fresh("_" + name) if name in avoid or name.lower().startswith("test") else name for name in public
    }


# Note [values away from the defaults]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A non-tensor input's default is often neutral (`beta = 1.0` in swish, `alpha = 1.0` in elu):
# an op that ignored it would pass every test at the default. So the tests run again with every
# non-tensor input moved at once: a float scaled by 0.7 (sign, order between inputs and a [0, 1]
# range kept; 0.3 for 0), an int one step away from 0, a bool flipped (so both are tested).
def other_value(value: Scalar) -> Scalar:
    """A test value for a non-tensor input away from `value` (Note [values away from the defaults])."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1 if value >= 0 else value - 1
    if not math_module.isfinite(value):
        return SAMPLE_VALUES["float"]
    return float(f"{value * 0.7:.6g}") if value != 0 else 0.3


def _values(spec: Spec, math: str) -> tuple[str, str] | None:
    """VALUES and OTHER_VALUES of the test module: the non-tensor inputs' test values, and others."""
    given = {i.name: spec.test_value(i) for i in spec.inputs if not i.is_tensor}
    if not given:
        return None
    others = {n: other_value(v) for n, v in given.items()}
    return (
        _assigned("VALUES: dict[str, float]", given, math, "the non-tensor inputs in most tests"),
        _assigned("OTHER_VALUES: dict[str, float]", others, math, "away from their defaults and VALUES"),
    )


def _assigned(name: str, value: quote.Literal, math: str, comment: str = "") -> str:
    """`NAME = {...}` as ruff formats it at line length 120 (`opgen.emit.layout.literal`)."""
    return layout.literal(f"{name} = ", value, 0, f"  # {comment}" if comment else "", math)


def _numbers(spec: Spec, math: str, rows: Sequence[Row]) -> tuple[dict[str, object], list[str]]:
    """The template's number-bearing parts as source (`math.inf` where infinite; see `opgen.spec.quote`),
    and all their texts (to see whether the file needs `math`)."""
    samples = []
    for inp in spec.inputs:
        if inp.is_tensor:
            low, high = spec.tests.domain_of(inp.name)
            kind = spec.tests.kind_of(inp.name)
            # harness.py's function of that name
            sampler = "uniform" if kind in ("interval", "real", "positive") else kind
            bounds = {"low": quote.number(low), "high": quote.number(high)}
            samples.append({"name": inp.name, "tensor": True, "sampler": sampler, **bounds})
        else:
            samples.append({"name": inp.name, "tensor": False})
    extremes = []
    for name, point, values, slope, at in rows:
        shown = quote.number(values[0]) + "," if len(values) == 1 else ", ".join(quote.number(v) for v in values)
        row = [
            quote.string(name),
            quote.number(point, math),
            f"({shown})",
            "None" if slope is None else quote.number(slope),
        ]
        extremes.append(layout.collection("", [*row, quote.string(at)], "()", 4, ","))
    module_args, module_arg_values = _module_args(spec, math) if spec.module else ([], {})
    points_dict = {n: list(v) for n, v in spec.tests.points}
    points = _assigned("POINTS", points_dict, math, "kinks and edges of the formulas, read row by row")
    shown_points = points if spec.tests.points else None
    # float32 of the domain's bounds: infinite for a bound beyond float32's range
    places_text = _assigned("PLACES", places(spec) if applies(spec) else {}, math)
    value_texts = _values(spec, math)
    context: dict[str, object] = {
        "values": value_texts,
        "samples": samples,
        "points": shown_points,
        "extremes": extremes,
        "places": places_text,
        "module_args": module_args if spec.module else None,
        "module_arg_values": module_arg_values,
    }
    texts = [str(shown_points), places_text, *extremes, *module_args, *module_arg_values.values(), *(value_texts or ())]
    return context, texts


def _override_references(
    spec: Spec, names: dict[str, str], grads_in: dict[str, str], t: str, torch: str, math: str, namer: Namer
) -> list[dict[str, Any]]:
    """Each gradient override as plain torch: the input it is for, the reference's signature, its lines."""
    overrides = []
    for override in spec.gradients:
        incoming = {f"grad_{o}": g for o, g in grads_in.items()}
        if len(grads_in) == 1:
            incoming["grad"] = next(iter(grads_in.values()))
        scope = incoming | dict(names)  # a spec's name wins, as in opgen.formula.read.gradient_scope
        tensors = holds_tensors(spec) | set(scope) - set(names)  # and the incoming gradients
        tree = reference_tree(override.formula, scope, t, torch, math, sizes=_size_texts(spec, names), tensors=tensors)
        assert tree is not None
        returned = ast.Call(ast.Name(t, ast.Load()), [tree], [])
        params = [*_scope_params(spec, names, torch), *(typed.param(g, f"{torch}.Tensor") for g in grads_in.values())]
        overrides.append(
            {
                "input": override.input,
                "signature": typed.define(f"reference_grad_{override.input}", params, f"{torch}.Tensor", 0),
                "lines": fitted("return ", returned, 4, _temporaries(namer), math),
            }
        )
    return overrides


def _scope_params(spec: Spec, names: dict[str, str], torch: str) -> list[str]:
    """An override reference's first parameters: the inputs as the op takes them, then the lets and
    outputs, tensors (opgen.runtime.harness)."""
    types = _types(torch)
    kinds = {i.name: types.tensor if i.is_tensor else typed.input_type(i.type, types) for i in spec.inputs}
    return [typed.param(names[n], kinds.get(n, types.tensor)) for n in names]


def _checked(spec: Spec, index: dict[str, int]) -> dict[str, object]:
    """The positions the generated gradient tests check, and why some are left out of gradcheck."""
    stopped = stopped_inputs(spec)  # gradcheck's finite differences see through a stop-gradient
    # ... and leave the whole numbers of a discrete input (Note [domain kinds] in opgen/spec/model.py)
    tensor_inputs = [i.name for i in spec.tensor_inputs]
    checked = [n for n in tensor_inputs if spec.override(n) is None]
    discrete = {n for n in checked if spec.tests.kind_of(n) in DISCRETE_KINDS}
    return {
        "checked_index": [index[n] for n in checked],
        "gradchecked": [index[n] for n in checked if n not in stopped and n not in discrete]
        if stopped or discrete
        else None,
        "gradchecked_why": [why for why, names in (("stopped", stopped), ("discrete", discrete)) if names],
        "symmetric": [index[n] for n in tensor_inputs if spec.tests.kind_of(n) == "spd"],
    }


def emit_tests(plan: Plan, renderer: Renderer, rows: Sequence[Row] = ()) -> str:
    """The test file of `plan`'s op; `rows` are its float32 accuracy tests' exact values, from the
    spec derived as written (`opgen.plan.extremes`, Note [derived twice] in opgen/pipeline.py)."""
    derived = plan.derived
    spec = with_cut_sizes(derived.spec, divisors([e for v in derived.variants for _, e in (*v.lets, *v.outputs)]))
    user = [i.name for i in spec.inputs] + [let.name for let in spec.lets] + [o.name for o in spec.outputs]
    optional = [i.name for i in spec.tensor_inputs if i.type.optional]
    reserved = _test_module_globals(spec, optional)
    namer = Namer(set(user) | reserved | set(public_names(spec)))
    torch, math, t, check = namer.fresh("torch"), namer.fresh("math"), namer.fresh("T"), namer.fresh("harness")
    api = _import_names(public_names(spec), namer, reserved)
    names = {n: n for n in user}
    grads_in = {o.name: namer.fresh(f"grad_{o.name}") for o in spec.outputs if o.differentiable}
    references = [_reference(spec, names, "reference", set(), t, torch, math, namer)]
    for name in optional:
        references.append(_reference(spec, names, f"reference_without_{name}", {name}, t, torch, math, namer))
    overrides = _override_references(spec, names, grads_in, t, torch, math, namer)
    tensor_inputs = [i.name for i in spec.tensor_inputs]
    index = {i.name: k for k, i in enumerate(spec.inputs)}
    broadcast = len(tensor_inputs) > 1 and sum(1 for i in spec.tensor_inputs if i.type.dims is None) > 1
    has_batch = any(i.type.dims and i.type.dims[:1] == (BATCH,) for i in spec.tensor_inputs)
    numbers, number_texts = _numbers(spec, math, rows)
    texts = [line for ref in references for line in ref.lines] + [line for o in overrides for line in o["lines"]]
    texts += number_texts
    return renderer.render(
        "test_op.py.j2",
        **_laid_out(spec, plan, api, [name for name, alias in sorted(api.items())], torch, namer),
        uses_math=quote.uses_math(texts, math),
        spec=spec,
        source_comment=quote.comment(spec.source),
        torch=torch,
        math=math,
        T=t,
        check=check,
        api=api,
        references=references,
        overrides=overrides,
        scope=user,
        shapes=sample_shapes(spec, False),
        broadcast_shapes=sample_shapes(spec, True) if broadcast else None,
        batched_shapes=sample_shapes(spec, False, BATCH_SHAPE) if has_batch else None,
        shape_error=shape_error(spec),
        tensor_index=[index[n] for n in tensor_inputs],
        **_checked(spec, index),
        outputs=[o.name for o in spec.outputs],
        differentiable=[k for k, o in enumerate(spec.outputs) if o.differentiable],
        optional=[(n, index[n]) for n in optional],
        saved=list(plan.saved),
        residuals=[r.name for r in plan.residuals],
        input_names=[i.name for i in spec.inputs],
        module_params=[p.name for p in spec.module.parameters] if spec.module else [],
        param_attrs=parameter_attributes(spec.module) if spec.module else {},
        custom_op=f"{spec.namespace}.{spec.name}" if spec.custom_op else None,
        small_call=native_op(plan) is not None,
        autocast=autocast_policy(plan),
        **numbers,
    )


def _laid_out(
    spec: Spec, plan: Plan, api: dict[str, str], public: list[str], torch: str, namer: Namer
) -> dict[str, Any]:
    """The test module's lines that grow with the spec's names, laid out as ruff would (`opgen.emit.layout`)."""
    imports = [name if api[name] == name else f"{name} as {api[name]}" for name in public]
    flat = "from .. import " + ", ".join(imports)
    shapes = {
        "shapes_line": _assigned("SHAPES", _lists(sample_shapes(spec, False)), ""),
        "broadcast_line": _assigned("BROADCAST_SHAPES", _lists(sample_shapes(spec, True)), ""),
        "batched_line": _assigned(
            "BATCHED_SHAPES", _lists(sample_shapes(spec, False, BATCH_SHAPE)), "", "with batch dimensions for `...`"
        ),
    }
    inputs = [i.name for i in spec.inputs]
    user = inputs + [let.name for let in spec.lets] + [o.name for o in spec.outputs]
    native = None
    if spec.tests.native:
        call = ast.parse(NATIVE_OPS[spec.tests.native].call(inputs, torch), mode="eval").body  # opgen's own text
        native = {
            "signature": typed.define("native", _native_params(spec, torch), f"{torch}.Tensor", 0),
            "lines": fitted("return ", call, 4, _temporaries(namer)),
        }
    return {
        **shapes,
        "import_line": flat
        if len(flat) <= layout.LINE_LENGTH
        else layout.collection("from .. import ", imports, "()", 0),
        "saved_line": _assigned(
            "SAVED: list[str]",
            list(plan.saved),
            "",
            "what backward reads, as opgen's plan chose: inputs, outputs, residuals",
        ),
        "residuals_line": _assigned(
            "RESIDUALS: list[str]",
            [r.name for r in plan.residuals],
            "",
            "what Function.apply returns after the outputs, for backward alone",
        ),
        "op_lists": {
            "inputs": layout.literal("inputs=", inputs, 4, ","),
            "outputs": layout.literal("outputs=", [o.name for o in spec.outputs], 4, ","),
            "scope": layout.literal("scope=", user, 4, ","),
        },
        "native": native,
    }


def _native_params(spec: Spec, torch: str) -> list[str]:
    return typed.typed_params(list(spec.inputs), _types(torch))


def _types(torch: str) -> typed.TypeNames:
    """The annotation types of a test module: its builtins are never shadowed (TEST_MODULE_NAMES)."""
    return typed.type_names(torch, Namer(set()), set())


def _lists(shapes: dict[str, tuple[int, ...]]) -> dict[str, list[int]]:
    return {name: list(shape) for name, shape in shapes.items()}
