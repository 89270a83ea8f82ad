"""Bracketed source as `ruff format` lays it out at line length 120, without running ruff.

Two layouts cover what the generated files bracket (Note [short lines] in opgen.emit.statements
for formulas, Note [fitted statements] in opgen.formula.python_source for the tests' references):

- a collection (list, tuple, dict, `from .. import (...)`): on one line when it fits, else one
  item a line, each with a trailing comma (Black's rule for data literals);
- a call or a `def`'s parameters: on one line when they fit, else the arguments together on one
  line of their own, else one a line with a trailing comma.

`indent` is the column the text starts at; the text returned holds the indentation of its
continuation lines, so a template writes it after its own indentation.
"""

from __future__ import annotations

from opgen.spec import quote

LINE_LENGTH = 120


def collection(head: str, items: list[str], brackets: str, indent: int, tail: str = "") -> str:
    """`head` + `items` in `brackets` (`"[]"`, `"()"`, `"{}"`) + `tail`."""
    opening, closing = brackets[0], brackets[1]
    flat = f"{head}{opening}{', '.join(items)}{closing}{tail}"
    if indent + len(flat) <= LINE_LENGTH and "\n" not in flat:
        return flat
    pad = " " * (indent + 4)
    body = "".join(f"{pad}{item},\n" for item in items)
    return f"{head}{opening}\n{body}{' ' * indent}{closing}{tail}"


def call(head: str, args: list[str], indent: int, tail: str = "") -> str:
    """`head(args)tail`, for a call (`head` ends before its `(`) or a `def` (`tail` is `:`)."""
    joined = ", ".join(args)
    flat = f"{head}({joined}){tail}"
    if indent + len(flat) <= LINE_LENGTH:
        return flat
    pad = " " * (indent + 4)
    if indent + 4 + len(joined) <= LINE_LENGTH and indent + len(head) + 1 <= LINE_LENGTH:
        return f"{head}(\n{pad}{joined}\n{' ' * indent}){tail}"
    return collection(head, args, "()", indent, tail)


def body_lines(text: str, indent: int) -> list[str]:
    """Laid-out `text` (continuation lines indented from column 0) as the lines of a body that is
    indented `indent` as a whole: continuation lines relative to the first."""
    first, *rest = text.split("\n")
    return [first, *(line.removeprefix(" " * indent) for line in rest)]


def unpacked(targets: list[str], source: str, indent: int) -> list[str]:
    """`a, b = source` as body lines at `indent`; targets that do not fit bracketed, one a line."""
    flat = f"({targets[0]},) = {source}" if len(targets) == 1 else f"{', '.join(targets)} = {source}"
    if indent + len(flat) <= LINE_LENGTH:
        return [flat]
    return ["(", *(f"    {target}," for target in targets), f") = {source}"]


def returned(values: list[str], indent: int) -> list[str]:
    """`return a, b` as body lines at `indent`; values that do not fit bracketed, one a line."""
    flat = f"return {', '.join(values)}"
    if indent + len(flat) <= LINE_LENGTH or len(values) == 1:
        return [flat]
    return ["return (", *(f"    {value}," for value in values), ")"]


def assign_call(targets: str, function: str, args: list[str], indent: int) -> str:
    """`targets = function(args)`: as `call`, and where `targets = function(` leaves no room on its line,
    the call bracketed on lines of its own (ruff's right-hand side in parentheses)."""
    head = f"{targets} = {function}"
    if indent + len(targets) + len(" = (") > LINE_LENGTH:  # the targets bracketed, one a line
        bracketed = collection("", targets.split(", "), "()", indent)
        return bracketed[:-1] + call(f") = {function}", args, indent)
    if indent + len(head) + 1 <= LINE_LENGTH or indent + len(head) + len(", ".join(args)) + 2 <= LINE_LENGTH:
        return call(head, args, indent)
    inner = call(function, args, indent + 4)
    return f"{targets} = (\n{' ' * (indent + 4)}{inner}\n{' ' * indent})"


def literal(head: str, value: quote.Literal, indent: int, tail: str = "", math: str | None = None) -> str:
    """`head` + the Python literal of `value` (`quote.literal`'s text and key order) + `tail`;
    nested lists, tuples and dicts that do not fit are laid out one item a line, each in turn."""
    flat = head + quote.literal(value, math) + tail
    if indent + len(flat) <= LINE_LENGTH or not isinstance(value, (dict, list, tuple)) or not value:
        return flat
    if isinstance(value, dict):
        entries = [(f"{quote.literal(k, math)}: ", v) for k, v in sorted(value.items())]
        opening, closing = "{", "}"
    else:
        entries = [("", v) for v in value]
        opening, closing = ("[", "]") if isinstance(value, list) else ("(", ")")
    pad = " " * (indent + 4)
    body = "".join(f"{pad}{literal(key, v, indent + 4, ',', math)}\n" for key, v in entries)
    return f"{head}{opening}\n{body}{' ' * indent}{closing}{tail}"
