"""Text from outside the generator -> generated source, one function per context.

Spec paths, names, `doc` text and numbers reach the generated files in five places: a `#`
comment, a docstring, a string literal, an identifier and a number literal. Each context has
exactly one function here, and every emitter and template goes through it; nothing else
writes outside text into source.

Note [escaping]
~~~~~~~~~~~~~~~
Python source cannot hold a NUL byte or a lone surrogate (the file must be UTF-8), a
comment ends at `\\n` or `\\r`, and `str.splitlines` (editors, the renderer's line
clean-up) also breaks at `\\x0b \\x0c \\x1c-\\x1e \\x85 \\u2028 \\u2029`. So every character
that `str.isprintable()` rejects (controls, line and paragraph separators, format
characters such as bidi overrides, surrogates, unassigned code points) is written as an
escape: `\\x00`, `\\u2028`, `\\udcff`. In string literals and docstrings the escape decodes
back to the character, so the value is exactly the text; in a comment it is only shown.
Backslashes and quotes are escaped in literals and docstrings, so nothing can end the string
early; `{{ }}` is plain text because spec text reaches Jinja as a value, never as template
source.

Note [non-finite numbers]
~~~~~~~~~~~~~~~~~~~~~~~~~
`repr(float("inf"))` is `inf`, which is no Python literal, so `number` writes `math.inf`,
`-math.inf` and `math.nan` (the file imports `math` when `uses_math` finds one). Where a
non-finite number makes sense it works: a default (`float = inf`, a clamp without a bound),
`tests.values` and `tests.points` at ±inf (values and derivatives there are checked like
any other). Where it makes none, the parser refuses it with its location: NaN anywhere in
`tests:` (no comparison can pass with it), infinite `tests.domain` bounds (inputs are drawn
uniformly between them) and non-finite `init` arguments (every parameter would be NaN or
infinite). A NaN or infinite default is not used as the tests' value (`Spec.test_value`).

Identifiers are compared as Python reads them: Python applies NFKC to every identifier in
source, so `ｔｏｒｃｈ` (full-width) *is* `torch`. A spec name whose NFKC form differs from its
spelling is refused (`identifier_problem`); every accepted name is its own NFKC form, so
plain string comparison of names is Python's comparison.
"""

from __future__ import annotations

import keyword
import math
import re
import unicodedata

Literal = str | int | float | bool | None | list | tuple | dict


def _escape_char(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _escaped(text: str, quote: str) -> str:
    """Backslash, `quote` and every non-printable character escaped (Note [escaping])."""
    out = []
    for char in text:
        if char == "\\" or char == quote:
            out.append("\\" + char)
        elif char.isprintable():
            out.append(char)
        else:
            out.append(_escape_char(char))
    return "".join(out)


def comment(text: str) -> str:
    """Text that stays inside one `#` comment line: non-printable characters shown as escapes."""
    return "".join(char if char.isprintable() else _escape_char(char) for char in text)


def string(text: str) -> str:
    """A double-quoted Python string literal whose value is exactly `text`."""
    return '"' + _escaped(text, '"') + '"'


def docstring(lines: list[str], indent: int) -> str:
    """A triple-quoted docstring whose value is `lines` joined by newlines (up to indentation
    and trailing spaces); no text can end it early or escape from it."""
    pad = " " * indent
    escaped = [_escaped(line, '"') for line in "\n".join(lines).split("\n")]
    body = [pad + line if line.strip() else "" for line in escaped]
    if len(body) == 1:
        return '"""' + body[0].strip() + '"""'
    return '"""' + body[0].strip() + "\n" + "\n".join(body[1:]) + "\n" + pad + '"""'


def number(value: float | int | bool, math_name: str | None = None) -> str:
    """A number literal; infinities and NaN as `math.inf`, `-math.inf`, `math.nan`, where
    `math_name` is how the file names the `math` module (the caller imports it; see
    `uses_math`). Without `math_name`, a non-finite value is an internal error."""
    if isinstance(value, bool) or isinstance(value, int):
        return repr(value)
    if not math.isfinite(value) and math_name is None:
        raise ValueError(f"{value!r} needs the math module here")
    if math.isnan(value):
        return f"{math_name}.nan"
    if math.isinf(value):
        return f"{'-' if value < 0 else ''}{math_name}.inf"
    return float_literal(value)


def float_literal(value: float) -> str:
    """A finite float as the shortest literal that reads back as it, written as `ruff format` writes
    number literals: `1.2e16`, not `repr`'s `1.2e+16` (the exponent's sign only when negative)."""
    if not math.isfinite(value):  # a number SymPy derived (`2e308 * x` of `1e308 * x**2`): no literal
        message = "a number of the derived formulas is outside float64 (about 1.8e308)"
        raise OverflowError(f"{message}; write the formula with smaller constants")
    return repr(float(value)).replace("e+", "e")


def literal(value: Literal, math_name: str | None = None) -> str:
    """Python source for plain data: strings, numbers, None, and lists, tuples, dicts (keys sorted) of them."""
    if isinstance(value, str):
        return string(value)
    if value is None or isinstance(value, (bool, int, float)):
        return "None" if value is None else number(value, math_name)
    if isinstance(value, dict):
        pairs = sorted(value.items())  # deterministic whatever the order it was built in
        return "{" + ", ".join(f"{literal(k, math_name)}: {literal(v, math_name)}" for k, v in pairs) + "}"
    items = [literal(item, math_name) for item in value]
    if isinstance(value, tuple):
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return "[" + ", ".join(items) + "]"


def uses_math(texts: list[str], math_name: str) -> bool:
    """Whether any code text refers to the `math` module under `math_name`."""
    pattern = re.compile(rf"(?<![\w.]){re.escape(math_name)}\.")
    return any(pattern.search(text) for text in texts)


def identifier_problem(name: str) -> str | None:
    """Why `name` cannot be a spec name as written, or None.

    Refused: what Python does not accept as a name, keywords, dunders, `_` (generated code
    uses it for values it drops), names starting with `__` (Python rewrites them inside a
    class body, so a Module argument `__n` could not be passed as `__n=`), and names that
    Python would read as another name (NFKC, Note [escaping]).
    """
    if not name.isidentifier():
        return "is not a Python identifier"
    normal = unicodedata.normalize("NFKC", name)
    if normal != name:
        return (
            f"is read by Python as '{normal}' (identifiers are NFKC-normalised), so it would be the same"
            f" name as '{normal}'; write '{normal}'"
        )
    if keyword.iskeyword(name) or name == "_":
        return "is a Python keyword; choose another name"
    if name.startswith("__") and name.endswith("__"):
        return "is a dunder name; choose another name"
    if name.startswith("__"):
        return "starts with '__', which Python rewrites inside class bodies (name mangling); choose another name"
    return None
