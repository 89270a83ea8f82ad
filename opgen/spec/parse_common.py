"""The parser's checks of raw YAML values, shared by every section (`opgen.spec.parse` and its parts).

Receives `Raw` nodes from `opgen.spec.load`; returns plain values (a type, a number, a formula's
text with its location) or raises a located `SpecError` saying what is wrong and how to
write it instead.
"""

from __future__ import annotations

import io
import math
import re
import tokenize
from collections.abc import Iterable

from opgen import limits
from opgen.errors import Loc, Problems, SpecError
from opgen.spec.load import Raw, RawList, RawMap, RawScalar
from opgen.spec.model import TENSOR, Formula, InputType, Scalar
from opgen.spec.quote import identifier_problem

_TYPE_RE = re.compile(
    r"^\s*(?P<kind>Tensor|float|int|bool)\s*"
    r"(?:\[(?P<dims>[^\]]*)\])?\s*(?P<opt>\?)?\s*"
    r"(?:=\s*(?P<default>.*?))?\s*$"
)


def plausible(word: str, options: Iterable[str]) -> str | None:
    """The option `word` is most likely a typo of, or None: a "did you mean" must be believable.

    Note [plausible suggestions]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    difflib's likeness ratio suggests `sqrt` for `square` and `max` for `softmax`: words that share
    letters, not typos of each other. A suggestion is made only for a typo: the same word in
    another case, or one within a few edits (insert, delete, replace, swap two neighbours): none
    for words of one or two letters (`q` is not a typo of `x`), one for up to five, two beyond.
    """
    limit = 0 if len(word) <= 2 else 1 if len(word) <= 5 else 2
    best: tuple[int, str] | None = None
    for option in options:
        distance = 0 if option.lower() == word.lower() else _edits(word, option, limit)
        if distance <= limit and (best is None or (distance, option) < best):
            best = (distance, option)
    return None if best is None else best[1]


COMMENT_PROBLEM = "{} has no comments, and `#` here would drop the rest of the line"
COMMENT_HINT = "remove it, or put a YAML comment outside the quotes"


def comment_start(text: str) -> int | None:
    """Where a `#` outside a string starts a Python comment in `text`, or None.

    Formulas and inits are read with Python's `ast`, which drops a comment silently: the quoted
    formula `"x * 2 # + 1"` would be `x * 2`. A YAML comment outside the quotes is YAML's own."""
    wrapped = "(" + text + "\n)"  # in parentheses: any indentation and line breaks tokenize
    try:
        for token in tokenize.generate_tokens(io.StringIO(wrapped).readline):
            if token.type == tokenize.COMMENT:
                row, col = token.start
                return sum(len(line) for line in wrapped.splitlines(keepends=True)[: row - 1]) + col - 1
    except (tokenize.TokenError, SyntaxError):  # not Python: the parser says where
        pass
    return None


def _edits(a: str, b: str, limit: int) -> int:
    """The optimal string alignment distance of `a` and `b` (limit + 1 when over `limit`)."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    before: list[int] = []
    row = list(range(len(b) + 1))
    for i, char in enumerate(a, 1):
        current = [i]
        for j, other in enumerate(b, 1):
            cost = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + (char != other))
            if i > 1 and j > 1 and char == b[j - 2] and a[i - 2] == other:
                cost = min(cost, before[j - 2] + 1)
            current.append(cost)
        before, row = row, current
    return row[-1]


def suggest(word: str, options: tuple[str, ...] | list[str]) -> str:
    close = plausible(word, options)
    if close:
        return f"; did you mean '{close}'?"
    return "; expected one of: " + ", ".join(options)


def check_keys(node: RawMap, allowed: tuple[str, ...], where: str, problems: Problems) -> None:
    for key, loc, _ in node.entries:
        if key not in allowed:
            problems.add(SpecError(loc, f"unknown key '{key}' in {where}{suggest(key, allowed)}"))


def need_map(node: Raw, what: str) -> RawMap:
    if not isinstance(node, RawMap):
        raise SpecError(node.loc, f"{what} must be a mapping of `name: value` lines")
    return node


def need_text(node: Raw, what: str) -> RawScalar:
    if not isinstance(node, RawScalar) or node.value is None:
        raise SpecError(node.loc, f"{what} must be a single line of text")
    return node


def check_identifier(name: str, loc: Loc, what: str) -> None:
    """A spec name as the generated code can use it (`opgen.spec.quote.identifier_problem`)."""
    if problem := identifier_problem(name):
        raise SpecError(loc, f"{what} '{name}' {problem}")


def scalar_default(kind: str, text: str, loc: Loc) -> Scalar:
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
        value = int(lowered) if kind == "int" else float(lowered)
    except ValueError:
        raise SpecError(loc, f"default '{text}' is not a valid {kind}") from None
    if kind == "int" and not -(2**63) <= value < 2**63:  # torch takes a Python int as int64: every call raised
        raise SpecError(loc, f"default '{text}' of an int input is outside int64; write a float, e.g. 1e30")
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
        return InputType(kind, default=scalar_default(kind, default, loc), has_default=True)
    if not allow_tensor:
        raise SpecError(loc, f"'{text}': module args are int, float or bool")
    if default is not None:
        raise SpecError(loc, "a Tensor input cannot have a default; use `Tensor?` for an optional tensor")
    dims: tuple[str, ...] | None = None
    if dims_text is not None and not dims_text.strip():
        dims = ()  # `Tensor[]`: a tensor of no dimensions (a scalar, such as a learnable scale)
    elif dims_text is not None:
        names = [d.strip() for d in dims_text.split(",")]
        if not names or any(not n for n in names):
            raise SpecError(loc, f"'{text}': dimension names must be non-empty, separated by commas")
        for n in names:
            if n.isdigit():  # a literal size: `Tensor[..., 4]`, boxes (Note [literal sizes] in opgen.formula.dims)
                if int(n) < 2 or n != str(int(n)):
                    raise SpecError(loc, f"'{text}': a literal dimension size is a whole number from 2, not '{n}'")
                continue
            factor, star, base = n.partition("*")
            if (
                star and factor.strip().isdigit() and base.strip().isidentifier()
            ):  # `2*H`: Note [multiples of a dimension]
                if int(factor) < 2:
                    raise SpecError(loc, f"'{text}': a multiple of a dimension is 2 or more times it, not '{n}'")
                names[names.index(n)] = f"{int(factor)}*{base.strip()}"
                continue
            if n != "..." and not n.isidentifier():
                raise SpecError(loc, f"'{text}': dimension '{n}' is not a name{_part_hint(n)}")
            if n != "..." and (problem := identifier_problem(n)) and "NFKC" in problem:
                raise SpecError(loc, f"'{text}': dimension '{n}' {problem}")
        dims = tuple(names)
    return InputType(TENSOR, optional=bool(opt), dims=dims)


def _part_hint(dim: str) -> str:
    """Why `D//2` is no declared dimension, and what to write instead (Note [parts of a dimension])."""
    if "//" not in dim:
        return ""
    return (
        "; a part of a dimension only comes from a cut in a formula (x[..., :D // 2]): declare the whole as a"
        " multiple of the part instead, Tensor[..., 2*H], and cut it as x[..., :H]"
    )


def formula(node: Raw, what: str) -> Formula:
    if not isinstance(node, RawScalar) or node.value is None or isinstance(node.value, bool):
        if isinstance(node, RawScalar) and isinstance(node.value, bool):
            if node.text.lower() in ("true", "false"):
                return Formula("true" if node.value else "false", node.loc)
            return Formula(node.text, node.loc)  # `on`, `yes`, `no`: a name, as a formula reads it
        raise SpecError(node.loc, f"{what} must be a formula (one line of text)")
    value = node.value
    text = value if isinstance(value, str) else repr(value)
    if not text.strip():
        raise SpecError(node.loc, f"{what} is empty")
    loc = node.loc if not node.quoted else Loc(node.loc.file, node.loc.line, node.loc.col + 1)
    return Formula(text, loc)


def number(node: Raw, what: str, finite: bool = False) -> float:
    """A number of `tests:`; NaN is refused (no check can pass at or with NaN), and so is
    infinity when `finite` (Note [non-finite numbers] in opgen.spec.quote)."""
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


def int_list(node: Raw, what: str) -> tuple[int, ...]:
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
