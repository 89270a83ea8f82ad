"""Load stage: spec files -> raw YAML trees that remember where every node came from.

Receives paths; returns `Raw` nodes (`RawMap`, `RawList`, `RawScalar`), each with its
`Loc`. Reads with PyYAML's safe composer only (no tags that construct objects), and
rejects duplicate keys, which plain YAML loaders silently drop.

Note [yaml limits]
~~~~~~~~~~~~~~~~~~
A spec is plain YAML: text, numbers, true/false, null, mappings and lists. Every other
tag (`!!timestamp`, `!!python/...`, `!custom`) is refused where it is written, and a value
its tag cannot read (`!!bool maybe`) is a located error, not the constructor's exception.
Composing stays within `opgen.limits`: nesting (the composer recurses per level) and the
number of nodes with every alias expanded (an alias repeats a whole subtree, so a few lines
can stand for billions of nodes); an alias inside the node it names is refused, since
the tree it stands for has no end. An alias is located where it is written, not at its anchor.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from yaml.constructor import SafeConstructor

from opgen import limits
from opgen.errors import Loc, SpecError


@dataclass(frozen=True)
class RawScalar:
    value: object  # str, int, float, bool or None, as YAML's safe schema reads it
    loc: Loc
    quoted: bool  # written in quotes: formula columns start one later
    text: str = ""  # as written (YAML 1.1 reads `on`, `yes`, `no` as booleans: a formula keeps the words)


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


_YAML = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_YAML + kind for kind in ("str", "int", "float", "bool", "null")}
_COLLECTION_TAGS = {yaml.SequenceNode: _YAML + "seq", yaml.MappingNode: _YAML + "map"}


def _short_tag(tag: str) -> str:
    return "!!" + tag[len(_YAML) :] if tag.startswith(_YAML) else tag


class _Composer(yaml.SafeLoader):
    """PyYAML's safe composer within the limits of Note [yaml limits]."""

    def __init__(self, text: str, file: str) -> None:
        super().__init__(text)
        self._limits(file)

    def _limits(self, file: str) -> None:
        self.file = file
        self.depth = 0
        self.open_anchors: set[str] = set()
        self.sizes: dict[int, int] = {}  # id(node) -> how many nodes it stands for, aliases expanded

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        event = self.peek_event()
        loc = _loc(self.file, event.start_mark)
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self.open_anchors:
                raise SpecError(loc, f"the alias *{event.anchor} is inside the node &{event.anchor} it names")
            return self._at_alias(super().compose_node(parent, index), event)
        if self.depth >= limits.YAML_DEPTH.value:
            raise limits.YAML_DEPTH.refuse(loc, "this YAML value", self.depth + 1, "nest mappings and lists less")
        opens = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)) and event.anchor is not None
        if opens:
            self.open_anchors.add(event.anchor)
        self.depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
            if opens:
                self.open_anchors.discard(event.anchor)
        self._count(node, loc)
        return node

    def _at_alias(self, node: yaml.Node, event: yaml.AliasEvent) -> yaml.Node:
        """A copy of the anchored node, located at the alias (a collection shares its items)."""
        copy: yaml.Node
        if isinstance(node, yaml.ScalarNode):
            copy = yaml.ScalarNode(node.tag, node.value, event.start_mark, event.end_mark, style=node.style)
        elif isinstance(node, yaml.SequenceNode):
            copy = yaml.SequenceNode(node.tag, node.value, event.start_mark, event.end_mark, node.flow_style)
        else:
            copy = yaml.MappingNode(node.tag, node.value, event.start_mark, event.end_mark, node.flow_style)
        self._count(copy, _loc(self.file, event.start_mark))
        return copy

    def _count(self, node: yaml.Node, loc: Loc) -> None:
        if isinstance(node, yaml.ScalarNode):
            size = 1
        elif isinstance(node, yaml.SequenceNode):
            size = 1 + sum(self.sizes[id(item)] for item in node.value)
        else:
            size = 1 + sum(self.sizes[id(key)] + self.sizes[id(value)] for key, value in node.value)
        if size > limits.YAML_NODES.value:
            what = "this YAML value with its aliases (*name) expanded"
            raise limits.YAML_NODES.refuse(loc, what, size, "use fewer aliases, or split the spec")
        self.sizes[id(node)] = size


# Note [libyaml events]
# ~~~~~~~~~~~~~~~~~~~~~
# PyYAML reads YAML text in Python: 30 ms for the fifty specs of specs/, which every run reads
# before any worker starts (opgen.parallel). libyaml, where PyYAML has it, reads the same text
# into the same events with the same marks in a quarter of the time. So `_FastComposer` takes its
# events from libyaml and builds the nodes with `_Composer`'s own Python code (the limits, aliases
# located where they are used). Only text both read alike goes that way (`_DIFFERENT`); the rest,
# and text libyaml cannot read, is read by PyYAML alone, whose errors (in plain words,
# `_PLAIN_WORDS`) are the ones users see.
try:
    from yaml.cyaml import CParser as _CParser
except ImportError:  # PyYAML built without libyaml
    _CParser = None
if _CParser is not None:

    class _FastComposer(_Composer, _CParser):
        """`_Composer` over libyaml's events (Note [libyaml events])."""

        get_event = _CParser.get_event
        peek_event = _CParser.peek_event
        check_event = _CParser.check_event

        def __init__(self, text: str, file: str) -> None:
            _CParser.__init__(self, text)
            yaml.composer.Composer.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._limits(file)

        def compose_scalar_node(self, anchor: str | None) -> yaml.ScalarNode:
            node = super().compose_scalar_node(anchor)
            if node.style == "":  # libyaml's plain style; PyYAML's is None
                node.style = None
            return node


# Where libyaml and PyYAML read alike text differently (found by reading mutated specs both ways):
# tabs (libyaml takes them inside plain scalars), carriage returns and the other line breaks of
# YAML 1.1, byte order marks past the start (columns), tags, `?` inside flow collections and as
# complex keys, block scalar headers, empty flow entries, and the characters PyYAML refuses.
_DIFFERENT = re.compile(
    "[\t\r\x85\u2028\u2029\ufeff!]"  # tabs, other line breaks, marks past the start, tags
    "|[?](?![ ]*(?:#.*)?$)|(?:^|[\\s\\[{,])[?]"  # a `?` but for a word's last character (`Tensor?`)
    "|[|>][-+0-9]*[^-+0-9\\s]"  # a block scalar's header with more than its indicators
    "|[:,\\[{][ ]*[,\\]}]"  # an empty entry of a flow collection (where its mark is)
    "|" + yaml.reader.Reader.NON_PRINTABLE.pattern,
    re.MULTILINE,
)


def _compose(text: str, file: str) -> yaml.Node | None:
    """The node tree of `text` (Note [libyaml events])."""
    if _CParser is not None and not _DIFFERENT.search(text):
        with contextlib.suppress(yaml.YAMLError):
            return _FastComposer(text, file).get_single_node()
    return _Composer(text, file).get_single_node()


def _scalar(node: yaml.ScalarNode, loc: Loc, scalars: _Scalars) -> object:
    """The Python value of a scalar node, read with YAML's safe schema (Note [yaml limits])."""
    if node.tag not in _SCALAR_TAGS:
        if node.tag == _YAML + "timestamp":
            raise SpecError(loc, f"'{node.value}' reads as a YAML date; put it in quotes if it is text")
        if node.tag == _YAML + "merge":  # YAML 1.1's `<<`, which the reader does not merge
            hint = "write the keys out (`*name` may stand for a whole mapping)"
            raise SpecError(loc, f"a `<<` merge key is not supported; {hint}")
        raise SpecError(
            loc, f"the YAML tag {_short_tag(node.tag)} is not allowed; a spec holds text, numbers, true/false and null"
        )
    if node.tag in (_YAML + "int", _YAML + "float"):
        digits = sum(char.isdigit() for char in node.value)
        if digits > limits.DIGITS.value:
            raise limits.DIGITS.refuse(loc, "this number", digits, "write it shorter, e.g. 1.5e30")
    try:
        return scalars.construct_object(node)
    except Exception:  # noqa: BLE001 - each tag's reader fails its own way (KeyError, ValueError, ...)
        raise SpecError(
            loc, f"'{node.value}' is not a valid {_short_tag(node.tag)} value; drop the tag or fix the value"
        ) from None


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
        value = _scalar(node, loc, scalars)
        if not isinstance(value, (str, int, float, bool, type(None))):
            raise SpecError(loc, f"unsupported YAML value of type {type(value).__name__}")
        return RawScalar(value, loc, quoted=node.style in ("'", '"'), text=node.value)
    if _COLLECTION_TAGS.get(type(node), node.tag) != node.tag:
        raise SpecError(
            loc, f"the YAML tag {_short_tag(node.tag)} is not allowed; a spec holds plain mappings and lists"
        )
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
            key = _scalar(key_node, key_loc, scalars)
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


def _reader_error(error: yaml.reader.ReaderError, text: str, file: str) -> SpecError:
    """PyYAML's reader names a bad character by its position in the text: locate it by line and column."""
    before = text[: error.position]
    line, col = before.count("\n") + 1, error.position - (before.rfind("\n") + 1) + 1
    char = error.character if isinstance(error.character, str) else chr(error.character)
    return SpecError(
        Loc(file, line, col), f"invalid YAML: the character U+{ord(char):04X} is not allowed in YAML text; remove it"
    )


# PyYAML's words for the mistakes people make most -> what they mean, in the spec's terms, and
# whether the error is better located at PyYAML's context mark (where the open thing started).
_PLAIN_WORDS: tuple[tuple[str, str, bool], ...] = (
    (
        "found character '\\t' that cannot start any token",
        "a tab character; YAML indents and separates with spaces only: replace the tab with spaces",
        False,
    ),
    (
        "mapping values are not allowed here",
        "a `key: value` where YAML expects none: indent this line like the lines of its mapping, "
        "or put a value that contains `: ` in quotes",
        False,
    ),
    (
        "expected <block end>",
        "this line's indentation does not match the lines above it: the keys (or `- ` items) of one "
        "mapping (or list) start at the same column, with spaces",
        False,
    ),
    ("could not find expected ':'", "this line has no `:`; write `key: value`", True),
    ("found unexpected end of stream", "a value opened here is never closed: add its closing quote or bracket", True),
    ("expected ',' or '}'", "a `{...}` mapping is not closed on its line: add `}` (or quote an entry)", True),
    ("expected ',' or ']'", "a `[...]` list is not closed on its line: add `]` (or quote an item)", True),
)


def _plain_words(error: yaml.MarkedYAMLError) -> tuple[yaml.Mark | None, str]:
    """Where a YAML syntax error is and what it means, in plain words where we know them."""
    problem = error.problem or error.context or "invalid YAML"
    for words, meaning, at_context in _PLAIN_WORDS:
        if problem.startswith(words):
            mark = error.context_mark if at_context and error.context_mark is not None else error.problem_mark
            return mark, meaning
    return error.problem_mark or error.context_mark, problem


def load_text(text: str, file: str) -> Raw:
    """Parse one YAML document into a located raw tree."""
    try:
        node = _compose(text, file)
    except yaml.MarkedYAMLError as error:
        mark, problem = _plain_words(error)
        raise SpecError(_loc(file, mark), f"invalid YAML: {problem}") from None
    except yaml.reader.ReaderError as error:  # a character YAML does not allow: no mark, a position
        raise _reader_error(error, text, file) from None
    except yaml.YAMLError as error:
        message = " ".join(str(error).split())
        raise SpecError(Loc(file, 1, 1), f"invalid YAML: {message}") from None
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
