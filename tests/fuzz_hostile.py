"""Hostile inputs: random YAML mutations of the spec library, hostile names, paths and docs.

`mutated_specs()` draws a spec of `specs/` and damages its text the ways people and
attackers do: lines deleted, duplicated, swapped or re-indented, tabs, tokens replaced
by huge, non-finite, unicode or quoting payloads, YAML tags, anchors and aliases
(recursive ones and a small alias bomb), deep nesting, NUL bytes, invalid UTF-8,
pathological formulas (power towers, huge constants, long let chains, many inputs).
`NAMES` are identifiers that shadow Python builtins, torch, opgen's own generated names
or each other after Unicode normalization; `PATHS` and `DOCS` are texts that try to end
a string, comment or docstring and run `{PAYLOAD}` (see `fuzz_sandbox.payload`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

SPECS = Path(__file__).resolve().parent.parent / "specs"
SPEC_NAMES = tuple(sorted(p.name for p in SPECS.glob("*.yaml")))

NAMES = (
    # builtins and what generated code itself uses
    "torch", "math", "F", "nn", "ctx", "grad", "grad_out", "self", "input", "sum", "len", "iter", "super",
    "print", "object", "type", "isinstance", "ValueError", "exec", "open", "globals", "staticmethod",
    "Function", "apply", "forward", "backward", "setup_context", "saved_tensors", "needs_input_grad",
    "check_shapes", "tmp0", "result", "reference", "tests", "test_op", "ops", "harness", "sys", "os",
    "pytest", "Tensor", "float", "int", "bool", "abs", "max", "exp", "where", "T", "_", "_shape_checks",
    "OpFunction", "Op", "mark_non_differentiable", "new_tensor", "dim", "keepdim",
    # Unicode: look-alikes that Python folds (NFKC) onto other names, and plain non-ASCII ones
    "ｔｏｒｃｈ", "ｘ0", "x0", "ﬁ", "fi", "λ", "ｍａｔｈ", "ℌ", "H",
    # YAML reads these keys as booleans or null; Python keywords and dunders
    "on", "yes", "null", "no", "None", "class", "lambda", "__init__", "__class__",
)  # fmt: skip

PATHS = (
    'specs"""+str({PAYLOAD})+"""',
    "specs'''+str({PAYLOAD})+'''",
    "x\n{PAYLOAD}\n#",
    "x\r{PAYLOAD}\r#",
    "x\u2028{PAYLOAD}\u2028#",
    "x\x0c{PAYLOAD}",
    "x\x85{PAYLOAD}",
    "ends in a backslash\\",
    "\\n\\x00\\u0041",
    "{{ 7 * 7 }}",
    "{% if true %}x{% endif %}{# c #}",
    "a:1:2: not a location",
    "ünï cødé ✓",
    "\u202eevil",
    "bad\udcffbytes",
    " spaces ",
    "-o",
    "$(touch x)`touch y`",
    "x\x1b[2Jy",
    "'; {PAYLOAD}; '",
    "%s%n%(x)s",
    "long" * 50,
)

DOCS = (
    '"""; {PAYLOAD}; """',
    "'''; {PAYLOAD}; '''",
    "line\n{PAYLOAD}\n",
    "ends in a backslash\\",
    "nul \x00 byte",
    "lone surrogate \ud800 here",
    "{{ x }} {% raw %}",
    "\r{PAYLOAD}",
    "tab\tand\u2028separator",
)

TOKENS = (
    "9" * 5000,
    "1e999",
    "-1e999",
    ".nan",
    ".inf",
    "nan",
    "inf",
    "1e-400",
    "0x10",
    "0o7",
    "1_000",
    "ｘ",
    "x\u0301",
    "\x00",
    '"',
    "'",
    '"""',
    "\\",
    "{{ x }}",
    "!!python/name:os.system",
    "!!python/object/apply:os.system ['true']",
    "!!bool maybe",
    "!!timestamp x",
    "!!binary Zm9v",
    "!!int 12",
    "!!float x",
    "!!str",
    "!!set {a}",
    "!!omap [a: 1]",
    "&a x",
    "*a",
    "*undefined",
    "<<: {x: 1}",
    "[",
    "]",
    "{",
    "}",
    ":",
    "- ",
    "? ",
    "|",
    ">",
    "%YAML 1.1",
    "---",
    "...",
    "#",
    "~",
    "null",
    "true",
    "x ** x ** x",
    "x * 9 ** 9 ** 9",
    "10 ** 10 ** 10",
    "(" * 200 + "x" + ")" * 200,
    "-" * 3000 + "x",
    " + ".join(["x"] * 2000),
    "exp(exp(exp(exp(exp(x)))))",
    "Tensor[" + ", ".join(f"D{i}" for i in range(200)) + "]",
    "\ud800",
    "\ufeff",
    "\u00a0",
)


INSERTS = (
    "- [" * 1000 + "]" * 1000,
    "deep: " + "{a: " * 1000 + "1" + "}" * 1000,
    "a: &a [*a]",
    'x1: &x1 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "\n".join(f"x{i}: &x{i} [" + ",".join([f"*x{i - 1}"] * 9) + "]" for i in range(2, 9)),
    "inputs:\n"
    + "\n".join(f"  t{i}: Tensor" for i in range(60))
    + "\noutputs:\n  y: "
    + " + ".join(f"t{i}" for i in range(60)),
    "\t",
    "name: second_name",
    "%TAG ! tag:example.com,2000:\n--- !foo\n",
    "--- \nname: other\n",
    "\x00",
    "\udcff\udcfe",  # invalid UTF-8 once written (surrogatepass)
    "module:\n  parameters:\n    x: {shape: [-3], init: ones}",
)


# Formulas that are legal but pathological, put in place of a formula of the spec (`{x}`: its first input).
FORMULAS = (
    "{x} ** {x} ** {x}",
    "{x} * 9 ** 9 ** 9",
    "{x} ** 10 ** 10",
    "{x} * 10 ** 400",
    "(" * 1000 + "{x}" + ")" * 1000,
    "-" * 3000 + "{x}",
    " + ".join(["sin({x} * " + str(i) + ")" for i in range(400)]),
    "exp(" * 80 + "{x}" + ")" * 80,
    "{x} * " + "9" * 5000,
    "{x} * 1e999",
    "max(" * 60 + "{x}" + ", {x})" * 60,
    "where({x} > 0, " * 60 + "{x}" + ", 1)" * 60,
    "sum({x}, dim=" + "9" * 30 + ")",
    # numbers SymPy folds or evaluates beyond float64 or int64, and Python reaching for its objects
    "{x} * 1e308 * 1e308",
    "{x} ** 2 * 1e308",
    "exp(10 ** 10) * {x}",
    "{x} ** (10 ** 100)",
    "{x}.__class__.__mro__",
    "__import__('os').system('true') * {x}",
)


def _pathological(text: str, where: int, what: int) -> str:
    """A formula of `text` (under let/outputs/gradients) replaced by one of FORMULAS, or the spec by a let chain."""
    first = re.search(r"^inputs:\s*\n\s+(\w+):", text, re.M)
    x = first.group(1) if first else "x"
    if what % 5 == 0:  # a chain of lets, each using the one before twice
        count = 8 + what % 12
        lets = [f"  l0: {x} * 1.5"] + [
            f"  l{i}: max(l{i - 1}, {x}) * sin(l{i - 1}) + l{i - 1} ** 2" for i in range(1, count)
        ]
        return f"name: chain\ninputs:\n  {x}: Tensor\nlet:\n" + "\n".join(lets) + f"\noutputs:\n  y: l{count - 1}\n"
    lines, section, spots = text.split("\n"), "", []
    for i, line in enumerate(lines):
        if re.match(r"^\w", line):
            section = line.split(":")[0]
        elif section in ("let", "outputs", "gradients") and re.match(r"^\s+\w+: [^{\[]", line):
            spots.append(i)
    if not spots:
        return text
    i = spots[where % len(spots)]
    key = lines[i].split(":")[0]
    lines[i] = f"{key}: " + FORMULAS[what % len(FORMULAS)].replace("{x}", x)
    return "\n".join(lines)


def _token_spans(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d*)?(?:e-?\d+)?|\S", text)]


@st.composite
def mutation(draw: Any) -> tuple[str, int, int]:
    kind = draw(
        st.sampled_from(
            ["delete", "duplicate", "swap", "indent", "dedent", "tab", "token", "token", "token", "insert", "crlf"]
            + ["formula", "formula"]
        )
    )
    return kind, draw(st.integers(0, 10_000)), draw(st.integers(0, 10_000))


def mutate(text: str, kind: str, where: int, what: int) -> str:
    lines = text.split("\n")
    i = where % len(lines)
    if kind == "delete":
        del lines[i]
    elif kind == "duplicate":
        lines.insert(i, lines[i])
    elif kind == "swap" and i + 1 < len(lines):
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
    elif kind == "indent":
        lines[i] = " " * (1 + what % 4) + lines[i]
    elif kind == "dedent":
        lines[i] = lines[i][1 + what % 2 :] if lines[i].startswith(" ") else lines[i]
    elif kind == "tab":
        lines[i] = "\t" + lines[i] if what % 2 else lines[i].replace(": ", ":\t", 1)
    elif kind == "token":
        spans = _token_spans(text)
        start, end = spans[where % len(spans)]
        return text[:start] + TOKENS[what % len(TOKENS)] + text[end:]
    elif kind == "insert":
        lines.insert(i, INSERTS[what % len(INSERTS)])
    elif kind == "formula":
        return _pathological(text, where, what)
    elif kind == "crlf":
        return text.replace("\n", "\r\n") if what % 2 else "\ufeff" + text
    return "\n".join(lines)


@st.composite
def mutated_specs(draw: Any) -> tuple[str, bytes]:
    """A spec of `specs/` with one to three random mutations: (its file name, the bytes to write)."""
    name = draw(st.sampled_from(SPEC_NAMES))
    text = (SPECS / name).read_text()
    for kind, where, what in draw(st.lists(mutation(), min_size=1, max_size=3)):
        text = mutate(text, kind, where, what)
    return name, text.encode("utf-8", "surrogatepass")
