"""Spec stage, the way back: `Spec` -> spec YAML that `opgen.spec.parse` reads as the same `Spec`.

Receives a parsed `Spec`; returns the text of a spec file. Every section the spec has is
written out in full (a default module's class name, the attributes the parser fills in
itself), so reading the text back gives a spec equal to this one but for where things are
written (`without_locations`), as torchgen's schema parser asserts of its own printer. Every
value that YAML could read as something else (a formula, a type, a doc string) is written
in double quotes with YAML's escapes (so is every name in a value: YAML reads a plain `on`
as true); keys, whole numbers and true/false are written plain.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TypeVar

from opgen.errors import Loc
from opgen.spec.model import Module, Optimize, Output, Scalar, Spec

NOWHERE = Loc("", 0, 0)
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\t": "\\t", "\n": "\\n", "\r": "\\r"}
T = TypeVar("T")


def spec_yaml(spec: Spec) -> str:
    """The spec file of `spec`: `parse_spec(load_text(spec_yaml(spec)))` equals `spec` without locations."""
    lines = [f"name: {quoted(spec.name)}"]
    if spec.doc:
        lines.append(f"doc: {quoted(spec.doc)}")
    lines += _section("inputs", [(i.name, quoted(str(i.type))) for i in spec.inputs])
    lines += _section("let", [(let.name, quoted(let.formula.text)) for let in spec.lets])
    lines += _section("outputs", [(o.name, _output(o)) for o in spec.outputs])
    lines += _section("gradients", [(g.input, quoted(g.formula.text)) for g in spec.gradients])
    if spec.module is not None:
        lines += ["module:", *_indented(_module(spec.module))]
    lines += _section("tests", _tests(spec))
    lines += _section("optimize", _optimize(spec.optimize))
    if spec.form is not None:
        lines.append(f"form: {quoted(spec.form)}")
    if spec.autocast is not None:
        lines.append(f"autocast: {quoted(spec.autocast)}")
    return "\n".join(lines) + "\n"


def quoted(text: str) -> str:
    """`text` as a YAML double-quoted scalar that reads back as exactly `text`."""
    return '"' + "".join(_ESCAPES.get(char) or _escaped(char) for char in text) + '"'


def _escaped(char: str) -> str:
    """`char` itself where YAML reads it as itself inside quotes, else its `\\x`, `\\u` or `\\U` escape."""
    code = ord(char)
    printable = 0x20 <= code <= 0x7E or 0xA0 <= code <= 0xD7FF or 0xE000 <= code <= 0xFFFD or 0x10000 <= code
    if printable and code not in (0x2028, 0x2029, 0xFEFF):  # YAML breaks lines at U+2028 and U+2029
        return char
    return f"\\x{code:02X}" if code <= 0xFF else f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}"


def number(value: Scalar) -> str:
    """A number as YAML text the parser reads back as the same value (`inf` and `1e-06` as text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return repr(value) if math.isfinite(value) and "e" not in repr(value) else quoted(repr(value))


def _section(key: str, entries: list[tuple[str, str]]) -> list[str]:
    return [f"{key}:", *(f"  {name}: {value}" for name, value in entries)] if entries else []


def _indented(lines: list[str]) -> list[str]:
    return ["  " + line for line in lines]


def _output(output: Output) -> str:
    if output.differentiable:
        return quoted(output.formula.text)
    return "{formula: " + quoted(output.formula.text) + ", differentiable: false}"


def _module(module: Module) -> list[str]:
    lines = [f"name: {quoted(module.name)}"]
    lines += _section("args", [(a.name, quoted(str(a.type))) for a in module.args])
    if module.parameters:
        lines.append("parameters:")
        for parameter in module.parameters:
            shape = ", ".join(str(size) if isinstance(size, int) else quoted(size) for size in parameter.shape)
            entries = [("shape", f"[{shape}]"), ("init", quoted(str(parameter.init)))]
            entries += [("when", quoted(parameter.when))] if parameter.when is not None else []
            lines += _indented([f"{parameter.name}:", *(f"  {k}: {v}" for k, v in entries)])
    lines += _section("attributes", [(name, quoted(arg)) for name, arg in module.attributes])
    return lines


def _domain(kind: str, low: float, high: float) -> str:
    """A `tests.domain` entry as written: an interval, a kind, or an integer range (Note [domain kinds])."""
    interval = f"[{number(low)}, {number(high)}]"
    if kind in ("integer", "real"):
        return f"{{{kind}: {interval}}}"
    return interval if kind == "interval" else kind


def _tests(spec: Spec) -> list[tuple[str, str]]:
    """The `tests:` entries, each a one-line flow mapping."""
    tests = spec.tests
    # A named dimension's size is one number, an input's shape a list (the parser reads a name
    # that is both as the dimension).
    dims = {d for i in spec.inputs if i.type.dims for d in i.type.dims}
    entries: list[tuple[str, str]] = []
    parts = {
        "domain": [(n, _domain(tests.kind_of(n), low, high)) for n, low, high in tests.domain],
        "shapes": [(n, str(s[0]) if n in dims else _list(s)) for n, s in tests.shapes],
        "values": [(n, number(v)) for n, v in tests.values],
        "points": [(n, _list(row)) for n, row in tests.points],
    }
    for key, items in parts.items():
        if items:
            entries.append((key, "{" + ", ".join(f"{n}: {v}" for n, v in items) + "}"))
    if not tests.gradgrad:
        entries.append(("gradgrad", "false"))
    if tests.native is not None:
        entries.append(("native", quoted(tests.native)))
    if not tests.extremes:
        entries.append(("extremes", "false"))
    return entries


def _list(values: tuple[Scalar, ...]) -> str:
    return "[" + ", ".join(number(v) for v in values) + "]"


def _optimize(optimize: Optimize) -> list[tuple[str, str]]:
    """The fields that differ from the defaults."""
    default = Optimize()
    entries = []
    for field in dataclasses.fields(Optimize):
        value = getattr(optimize, field.name)
        if value != getattr(default, field.name):
            entries.append((field.name, number(value) if isinstance(value, bool) else quoted(str(value))))
    return entries


def without_locations(value: T) -> T:
    """`value` with every `Loc` inside it replaced by `NOWHERE`: what two readings of one spec share."""
    if isinstance(value, Loc):
        return NOWHERE  # type: ignore[return-value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: without_locations(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    if isinstance(value, tuple):
        return tuple(without_locations(item) for item in value)  # type: ignore[return-value]
    return value
