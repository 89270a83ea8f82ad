"""The formula language page's table "What is refused, and why" is true both ways: every formula
its first column shows is refused with a located message, and every formula its last column offers
instead generates. (It once listed `sum(x)` as refused, which works.)

A row whose first column sets a context of its own (`... with `a` a `float``) or shows no formula
(`a formula over the size or depth limits`) is left to the tests of that refusal.
"""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

from opgen.emit.render import Renderer
from opgen.pipeline import build

PAGE = ROOT / "docs" / "formula-language.md"
# The inputs every example may name: plain Tensors and one condition.
INPUTS = "  x: Tensor\n  y: Tensor\n  v: Tensor\n  a: Tensor\n  b: Tensor\n  c: bool\n"
COMPARISON = re.compile(r"[<>]|==|!=|^~")


def _rows() -> list[tuple[str, str]]:
    text = PAGE.read_text(encoding="utf-8")
    table = text.split("## What is refused, and why", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    return [(row[0].removeprefix("| "), row[2].removesuffix(" |").removesuffix("|")) for row in rows[1:]]


def _codes(cell: str) -> list[str]:
    """The formulas in `cell`'s code spans: not a word of the prose (`dim=`, `Tensor`, `.T`), a
    `gradients:` line (`x: grad * v`) nor a declaration (`x: Tensor[..., N]`)."""
    spans = re.findall(r"`([^`]+)`", cell)
    return [code for code in spans if code not in ("dim=", "Tensor") and not code.startswith(".") and ":" not in code]


def _rows_of_formulas() -> list[tuple[str, str]]:
    return [(written, instead) for written, instead in _rows() if " with " not in written]


def _refused() -> list[str]:
    return [code for written, _ in _rows_of_formulas() for code in _codes(written)] + [":="]


def _offered() -> list[str]:
    return [code for _, instead in _rows_of_formulas() for code in _codes(instead)]


def _problems(formula: str, tmp_path) -> list[str]:
    spec = tmp_path / "example.yaml"
    spec.write_text(f"name: example\ninputs:\n{INPUTS}outputs:\n  out: {formula}\n", encoding="utf-8")
    return build([str(spec)], Renderer()).problems.report()


def test_the_table_is_read():
    assert len(_refused()) >= 20 and len(_offered()) >= 8
    assert "logsumexp(x)" in _refused() and "sum(x)" in _offered()


@pytest.mark.parametrize("formula", _refused())
def test_every_listed_refusal_is_refused(formula, tmp_path):
    problems = _problems(formula, tmp_path)
    assert problems, f"`{formula}` is listed as refused but generates"
    assert re.match(r"^\S+example\.yaml:\d+:\d+: ", problems[0]), problems


@pytest.mark.parametrize("formula", _offered())
def test_every_form_offered_instead_works(formula, tmp_path):
    # a condition is a value only inside `where` (an output of conditions alone has no gradient)
    condition = COMPARISON.search(formula) and not formula.startswith("where(")
    written = f"where({formula}, x, y)" if condition else formula
    assert _problems(written, tmp_path) == []
