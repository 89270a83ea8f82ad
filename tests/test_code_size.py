"""The generator stays readable: no module of `opgen/` over 600 lines, no function over 60.

Measured with `ast` (a function's lines run from its first decorator to its last statement),
strict, with no allow-list: a module or function that grows past a limit is split by meaning.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

OPGEN = Path(__file__).resolve().parent.parent / "opgen"
MODULE_LINES = 600
FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(OPGEN.rglob("*.py"))


def long_functions(source: str, limit: int = FUNCTION_LINES) -> list[tuple[str, int]]:
    """(qualified name, lines) of each function or method of `source` longer than `limit`."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                length = (child.end_lineno or child.lineno) - start + 1
                if length > limit:
                    found.append((prefix + child.name, length))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_the_measure_sees_long_functions_and_methods() -> None:
    body = [f"    x{k} = {k}\n" for k in range(FUNCTION_LINES)]
    method = "".join("    " + line for line in body)
    source = f"def short():\n    pass\n\nclass C:\n    @staticmethod\n    def long():\n{method}"
    assert long_functions(source) == [("C.long", FUNCTION_LINES + 2)]
    assert long_functions("def f():\n" + "".join(body[1:])) == []  # exactly the limit
    assert long_functions("def f():\n" + "".join(body)) == [("f", FUNCTION_LINES + 1)]


def test_opgen_is_found() -> None:
    assert len(_modules()) > 20


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(OPGEN)))
def test_module_size(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    lines = len(source.splitlines())
    assert lines <= MODULE_LINES, f"{path.relative_to(OPGEN.parent)} has {lines} lines; split it by meaning"
    long = long_functions(source)
    assert not long, f"{path.relative_to(OPGEN.parent)}: functions over {FUNCTION_LINES} lines: {long}"
