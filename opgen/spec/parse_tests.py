"""Parse stage, `tests:` section: raw YAML -> `TestConfig` (domains, shapes, values, points, native op).

Receives the `tests:` node and the spec's inputs; returns the `TestConfig` the test emitter
follows, recording every located problem in `problems`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

from opgen.errors import Loc, Problems, SpecError
from opgen.spec.load import Raw, RawList, RawMap, RawScalar
from opgen.spec.model import DOMAIN_KINDS, Input, Scalar, TestConfig
from opgen.spec.native import NATIVE_OPS
from opgen.spec.parse_common import check_keys, int_list, need_map, number, scalar_default, suggest

TEST_KEYS = ("domain", "shapes", "values", "gradgrad", "points", "native", "extremes")


def parse_tests(node: Raw, spec_inputs: tuple[Input, ...], problems: Problems) -> TestConfig:
    mapping = need_map(node, "tests")
    check_keys(mapping, TEST_KEYS, "tests", problems)
    by_name = {i.name: i for i in spec_inputs}
    dims = {d for i in spec_inputs if i.type.dims for d in i.type.dims}
    declared = _each(mapping.get("domain"), "tests.domain", problems, lambda *entry: _domain(by_name, *entry))
    domain = tuple((name, low, high) for name, low, high, _ in declared)
    kinds = tuple((name, kind) for name, _, _, kind in declared if kind != "interval")
    shapes = _each(mapping.get("shapes"), "tests.shapes", problems, lambda *entry: _shape(by_name, dims, *entry))
    with problems.collect():
        _one_size_each(mapping.get("shapes"), dict(shapes), by_name)
    values = _each(mapping.get("values"), "tests.values", problems, lambda *entry: _value(by_name, *entry))
    gradgrad = _flag(mapping.get("gradgrad"), "tests.gradgrad", problems)
    points = _parse_points(mapping.get("points"), by_name, problems)
    native = _parse_native(mapping.get("native"), spec_inputs, problems)
    extremes = _flag(mapping.get("extremes"), "tests.extremes", problems)
    written = mapping.get("native")
    native_loc = written.loc if written is not None else None
    return TestConfig(domain, shapes, values, gradgrad, points, native, extremes, native_loc, kinds)


def _flag(node: Raw | None, what: str, problems: Problems) -> bool:
    """A true/false key, true when absent."""
    if node is None:
        return True
    if not isinstance(node, RawScalar) or not isinstance(node.value, bool):
        problems.add(SpecError(node.loc, f"{what} must be true or false"))
        return True
    return node.value


T = TypeVar("T")


def _each(node: Raw | None, what: str, problems: Problems, read: Callable[[str, Loc, Raw], T]) -> tuple[T, ...]:
    """`read(name, loc, value)` of every entry of the mapping `node` (absent: none), each problem recorded."""
    if node is None:
        return ()
    found = []
    for name, loc, value in need_map(node, what).entries:
        with problems.collect():
            found.append(read(name, loc, value))
    return tuple(found)


def _domain(by_name: dict[str, Input], name: str, loc: Loc, value: Raw) -> tuple[str, float, float, str]:
    """`[low, high]`, or a kind (Note [domain kinds] in opgen/spec/model.py): (name, low, high, kind)."""
    if name not in by_name or not by_name[name].is_tensor:
        raise SpecError(loc, f"tests.domain: '{name}' is not a Tensor input")
    if isinstance(value, RawScalar) and isinstance(value.value, str):
        return (name, *_kind(by_name[name], value.value, value.loc))
    if isinstance(value, RawMap) and [key for key, _, _ in value.entries] in (["integer"], ["real"]):
        (kind, _, bounds), *_ = value.entries
        low, high = _interval(name, bounds)
        if kind == "integer" and (low != int(low) or high != int(high)):
            raise SpecError(bounds.loc, f"tests.domain.{name}: integer bounds must be whole numbers, e.g. [0, 10]")
        return (name, low, high, kind)
    return (name, *_interval(name, value), "interval")


def _interval(name: str, value: Raw) -> tuple[float, float]:
    if not isinstance(value, RawList) or len(value.items) != 2:
        kinds = ", ".join(DOMAIN_KINDS)
        raise SpecError(
            value.loc,
            f"tests.domain.{name} must be [low, high], one of {kinds}, {{integer: [low, high]}}, or"
            " {real: [low, high]}",
        )
    low, high = (number(v, f"tests.domain.{name}", finite=True) for v in value.items)
    if not low < high:
        raise SpecError(value.loc, f"tests.domain.{name}: low ({low}) must be below high ({high})")
    return low, high


def _kind(inp: Input, kind: str, loc: Loc) -> tuple[float, float, str]:
    """The sampling interval of a named domain kind, checked against the input's declared dimensions."""
    if kind not in DOMAIN_KINDS:
        hint = suggest(kind, tuple(DOMAIN_KINDS))
        raise SpecError(loc, f"tests.domain.{inp.name}: unknown domain kind '{kind}'{hint}, or an interval [low, high]")
    dims = [d for d in inp.type.dims or () if d != "..."]
    if kind == "spd" and (len(dims) < 2 or dims[-1] != dims[-2]):
        raise SpecError(
            loc,
            f"tests.domain.{inp.name}: spd matrices are square over the last two dimensions, but '{inp.name}' is"
            f" `{inp.type}`; declare it as `Tensor[..., N, N]`",
        )
    if kind == "probability" and inp.type.dims is not None and not dims:
        raise SpecError(
            loc, f"tests.domain.{inp.name}: probability rows run along the last dimension, but '{inp.name}' has none"
        )
    return (*DOMAIN_KINDS[kind], kind)


def _shape(by_name: dict[str, Input], dims: set[str], name: str, loc: Loc, value: Raw) -> tuple[str, tuple[int, ...]]:
    if name in dims:
        if (
            not isinstance(value, RawScalar)
            or isinstance(value.value, bool)
            or not isinstance(value.value, int)
            or value.value < 1
        ):
            raise SpecError(value.loc, f"tests.shapes.{name}: a dimension size must be a positive whole number")
        return (name, (value.value,))
    if name in by_name and by_name[name].is_tensor:
        shape = int_list(value, f"tests.shapes.{name}")
        _fits_declared(by_name[name], shape, value.loc)
        return (name, shape)
    raise SpecError(loc, f"tests.shapes: '{name}' is neither a Tensor input nor a named dimension")


def _fits_declared(inp: Input, shape: tuple[int, ...], loc: Loc) -> None:
    """A sample shape for an input with named dimensions has as many sizes as it declares (any more
    in front for `...`); the generated tests would call the op with a shape it refuses."""
    dims = inp.type.dims
    if dims is None:
        return
    named = [d for d in dims if d != "..."]
    batch = len(named) != len(dims)
    if len(shape) == len(named) or (batch and len(shape) > len(named)):
        return
    count = f"{len(named)}{' or more' if batch else ''} size{'' if len(named) == 1 and not batch else 's'}"
    count = count if named or batch else "[] (a tensor of no dimensions)"
    hint = f", or size its named dimensions (`{named[0]}: 4`)" if named else ""
    raise SpecError(
        loc, f"tests.shapes.{inp.name}: {list(shape)} does not fit '{inp.name}: {inp.type}'; give {count}{hint}"
    )


def _one_size_each(node: Raw | None, shapes: dict[str, tuple[int, ...]], by_name: dict[str, Input]) -> None:
    """A named dimension gets one size from all of `tests.shapes` (its own entry, and the input
    shapes it is part of): one name is one size, and the op refuses samples that differ."""
    if node is None:
        return
    entries = [(name, value.loc) for name, _, value in need_map(node, "tests.shapes").entries if name in shapes]
    entries.sort(key=lambda entry: entry[0] in by_name)  # the dimensions' own entries first
    sizes: dict[str, tuple[int, str]] = {}
    for name, loc in entries:
        dims = by_name[name].type.dims if name in by_name else (name,)
        named = [d for d in dims or () if d != "..."]
        for dim, size in zip(reversed(named), reversed(shapes[name]), strict=False):
            first = sizes.setdefault(dim, (size, name))
            if first[0] != size:
                raise SpecError(
                    loc,
                    f"tests.shapes.{name} makes {dim} = {size}, but tests.shapes.{first[1]} made it {first[0]}; "
                    f"a named dimension has one size: make them agree",
                )


def _value(by_name: dict[str, Input], name: str, loc: Loc, value: Raw) -> tuple[str, Scalar]:
    if name not in by_name or by_name[name].is_tensor:
        raise SpecError(loc, f"tests.values: '{name}' is not a float, int or bool input")
    kind = by_name[name].type.kind
    if not isinstance(value, RawScalar):
        raise SpecError(value.loc, f"tests.values.{name} must be a {kind}")
    sample = scalar_default(kind, str(value.value), value.loc)
    if isinstance(sample, float) and math.isnan(sample):
        raise SpecError(value.loc, f"tests.values.{name} is NaN; the generated tests need a number to compare")
    return (name, sample)


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
            row = tuple(number(v, f"tests.points.{name}") for v in value.items)
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
    """`tests.native`: the name of a PyTorch op (`opgen.spec.native`) taking the spec's inputs in order."""
    if node is None:
        return None
    with problems.collect():
        if not isinstance(node, RawScalar) or not isinstance(node.value, str):
            raise SpecError(node.loc, "tests.native must be the name of a PyTorch op, e.g. hardtanh")
        op = NATIVE_OPS.get(node.value)
        if op is None:
            hint = suggest(node.value, tuple(sorted(NATIVE_OPS)))
            raise SpecError(node.loc, f"tests.native: unknown op '{node.value}'{hint}")
        if op.arity != len(inputs):
            raise SpecError(
                node.loc,
                f"tests.native: {node.value} takes {op.arity} arguments (the spec's inputs, in order),"
                f" but this spec has {len(inputs)} input{'s' if len(inputs) != 1 else ''}",
            )
        return node.value
    return None
