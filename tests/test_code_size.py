"""The generator stays readable: a module holds one concept, no function runs over 60 lines.

A module follows its concept: 600 lines is a ceiling that says a module has grown past one, not a
size to split at. A name with a leading underscore belongs to its module: no other opgen module
imports it or reads it as an attribute (a name two modules share is public, or lives where it is
used). Measured with `ast` (a function's lines run from its first decorator to its last statement),
strict, with no allow-list.
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
    assert lines <= MODULE_LINES, f"{path.relative_to(OPGEN.parent)} has {lines} lines: more than one concept?"
    long = long_functions(source)
    assert not long, f"{path.relative_to(OPGEN.parent)}: functions over {FUNCTION_LINES} lines: {long}"


def _opgen_module(name: str) -> bool:
    """Whether the dotted `name` (under `opgen`) is a module or package, not a name inside one."""
    parts = name.split(".")[1:]
    return (OPGEN.joinpath(*parts).with_suffix(".py")).is_file() or (OPGEN.joinpath(*parts) / "__init__.py").is_file()


def private_uses(source: str) -> list[str]:
    """Each private name (`_name`, not `__dunder__`) `source` takes from an opgen module: imported
    (`from opgen.x import _name`) or read as an attribute of an imported opgen module (`x._name`)."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # local name -> the opgen module it holds
    found: list[str] = []

    def private(name: str) -> bool:
        return name.startswith("_") and not name.endswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "opgen":
            for alias in node.names:
                if private(alias.name):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                elif _opgen_module(f"{node.module}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "opgen" and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in modules:
                found.append(f"line {node.lineno}: {modules[base.id]}.{node.attr}")
    return found


def test_the_check_sees_private_names_imported_and_read() -> None:
    source = (
        "from opgen.nodes.kernels import _Hidden, silu\n"
        "from opgen.nodes import kernels as k\n"
        "import opgen.derive.guard as g\n"
        "from opgen import limits\n"
        "x = k._Other, g._DOMAINS, limits._budget, k.__name__, silu._private_of_a_class\n"
    )
    assert private_uses(source) == [
        "line 1: from opgen.nodes.kernels import _Hidden",
        "line 5: opgen.nodes.kernels._Other",
        "line 5: opgen.derive.guard._DOMAINS",
        "line 5: opgen.limits._budget",
    ]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(OPGEN)))
def test_no_module_takes_a_private_name_of_another(path: Path) -> None:
    used = private_uses(path.read_text(encoding="utf-8"))
    where = path.relative_to(OPGEN.parent)
    assert not used, f"{where} uses private names of other modules (make them public, or move them): {used}"
