"""Load stage: spec files -> raw YAML trees that remember where every node came from.

Receives paths; returns `Raw` nodes (`RawMap`, `RawList`, `RawScalar`), each with its
`Loc`. Reads with PyYAML's safe composer only (no tags that construct objects), and
rejects duplicate keys, which plain YAML loaders silently drop.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from yaml.constructor import SafeConstructor

from opgen.errors import Loc, SpecError


@dataclass(frozen=True)
class RawScalar:
    value: object  # str, int, float, bool or None, as YAML's safe schema reads it
    loc: Loc
    quoted: bool  # written in quotes: formula columns start one later


@dataclass(frozen=True)
class RawList:
    items: tuple[Raw, ...]
    loc: Loc


@dataclass(frozen=True)
class RawMap:
    """An ordered mapping; each key keeps its own location."""

    entries: tuple[tuple[str, Loc, Raw], ...]
    loc: Loc

    def keys(self) -> list[str]:
        return [key for key, _, _ in self.entries]

    def get(self, key: str) -> Raw | None:
        for name, _, node in self.entries:
            if name == key:
                return node
        return None

    def key_loc(self, key: str) -> Loc:
        for name, loc, _ in self.entries:
            if name == key:
                return loc
        return self.loc


Raw = RawScalar | RawList | RawMap


def _loc(file: str, mark: yaml.Mark | None) -> Loc:
    if mark is None:
        return Loc(file, 1, 1)
    return Loc(file, mark.line + 1, mark.column + 1)


class _Scalars(SafeConstructor):
    """Turns scalar nodes into Python values with YAML's safe schema."""


def _unbalanced(text: str) -> bool:
    return text.count("(") > text.count(")")


def _rejoin_flow_entries(node: yaml.MappingNode, source: str) -> list[tuple[yaml.Node, yaml.Node]]:
    """Undo YAML's split of `{init: uniform(-0.1, 0.1)}` at the comma inside parentheses.

    In a flow mapping YAML reads that as `init: "uniform(-0.1"` and a key `0.1)` with no
    value. The spec format writes such calls in flow mappings, so a key-only entry that
    closes a parenthesis left open by the entry before it is joined back onto that entry,
    with the original text between them.
    """
    pairs: list[tuple[yaml.Node, yaml.Node]] = []
    for key_node, value_node in node.value:
        if pairs and isinstance(key_node, yaml.ScalarNode) and isinstance(value_node, yaml.ScalarNode):
            prev_key, prev_value = pairs[-1]
            keyless = value_node.value == "" and value_node.tag.endswith(":null") and key_node.style is None
            if keyless and isinstance(prev_value, yaml.ScalarNode) and prev_value.style is None:
                if _unbalanced(prev_value.value):
                    text = source[prev_value.start_mark.index : key_node.end_mark.index]
                    joined = yaml.ScalarNode("tag:yaml.org,2002:str", text, prev_value.start_mark, key_node.end_mark)
                    pairs[-1] = (prev_key, joined)
                    continue
        pairs.append((key_node, value_node))
    return pairs


def _convert(node: yaml.Node, file: str, scalars: _Scalars, source: str) -> Raw:
    loc = _loc(file, node.start_mark)
    if isinstance(node, yaml.ScalarNode):
        value = scalars.construct_object(node)
        if not isinstance(value, (str, int, float, bool, type(None))):
            raise SpecError(loc, f"unsupported YAML value of type {type(value).__name__}")
        return RawScalar(value, loc, quoted=node.style in ("'", '"'))
    if isinstance(node, yaml.SequenceNode):
        return RawList(tuple(_convert(item, file, scalars, source) for item in node.value), loc)
    if isinstance(node, yaml.MappingNode):
        entries: list[tuple[str, Loc, Raw]] = []
        seen: dict[str, Loc] = {}
        pairs = _rejoin_flow_entries(node, source) if node.flow_style else node.value
        for key_node, value_node in pairs:
            key_loc = _loc(file, key_node.start_mark)
            if not isinstance(key_node, yaml.ScalarNode):
                raise SpecError(key_loc, "mapping keys must be plain names")
            key = scalars.construct_object(key_node)
            if isinstance(key, bool):
                # `true:`/`yes:` keys: keep the text the user wrote, not YAML 1.1's bool.
                key = key_node.value
            if not isinstance(key, str):
                key = str(key_node.value)
            if key in seen:
                raise SpecError(key_loc, f"duplicate key '{key}' (first defined at {seen[key]})")
            seen[key] = key_loc
            entries.append((key, key_loc, _convert(value_node, file, scalars, source)))
        return RawMap(tuple(entries), loc)
    raise SpecError(loc, "unsupported YAML node")  # pragma: no cover - composer yields only these


def load_text(text: str, file: str) -> Raw:
    """Parse one YAML document into a located raw tree."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        problem = error.problem or error.context or "invalid YAML"
        raise SpecError(_loc(file, mark), f"invalid YAML: {problem}") from None
    except yaml.YAMLError as error:
        raise SpecError(Loc(file, 1, 1), f"invalid YAML: {error}") from None
    if node is None:
        raise SpecError(Loc(file, 1, 1), "the spec is empty; expected a mapping with name, inputs and outputs")
    return _convert(node, file, _Scalars(), text)


def load_file(path: Path, display: str) -> Raw:
    """Read and parse `path`; errors name it as `display`."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError(Loc(display, 1, 1), "the spec is not UTF-8 text") from None
    except OSError as error:
        raise SpecError(Loc(display, 1, 1), f"cannot read the spec: {error.strerror}") from None
    return load_text(text, display)
