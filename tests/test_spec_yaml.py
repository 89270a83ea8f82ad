"""Spec -> YAML -> Spec: the printer of the model (opgen/spec/spec_yaml.py) writes text that parses to
an equal spec, for every spec of the library, every example of the format page, and odd values."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT, SPECS

from opgen.errors import Problems
from opgen.spec.load import load_text
from opgen.spec.model import Spec
from opgen.spec.parse import parse_spec
from opgen.spec.spec_yaml import quoted, spec_yaml, without_locations

PAGE = ROOT / "docs" / "spec-format.md"


def _parse(text: str, file: str = "op.yaml") -> Spec:
    problems = Problems()
    spec = parse_spec(load_text(text, file), "specs/op.yaml", problems)
    assert spec is not None, problems.report()
    return spec


def assert_round_trip(text: str) -> None:
    spec = _parse(text)
    printed = spec_yaml(spec)
    again = _parse(printed, "printed.yaml")
    # repr, not ==: a NaN default equals itself only as text
    assert repr(without_locations(again)) == repr(without_locations(spec)), printed
    assert spec_yaml(again) == printed  # the printer is a fixed point after one trip


@pytest.mark.parametrize("path", sorted(SPECS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_spec_of_the_library_round_trips(path):
    assert_round_trip(path.read_text(encoding="utf-8"))


def _page_examples() -> list[str]:
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)
    return [block for block in blocks if re.search(r"^name: ", block, flags=re.MULTILINE)]


def test_the_format_page_has_examples_to_round_trip():
    assert len(_page_examples()) >= 5


@pytest.mark.parametrize("text", _page_examples(), ids=lambda t: re.search(r"^name: (\S+)", t, re.M).group(1))
def test_every_example_of_the_format_page_round_trips(text):
    assert_round_trip(text)


ODD = {
    "yaml words as names": """
name: "on"
inputs:
  "yes": Tensor
  "null": float = nan
  no: "int = -3"
outputs:
  "off": "yes * null + no"
module:
  name: "Y"
  args: {"true": int, flag: bool}
  parameters:
    "yes": {shape: ["true", 2], init: "kaiming_uniform()"}
  attributes: {"null": "true"}
""",
    "escapes and unicode": """
name: op
doc: "tab\\there, a quote \\" and \\\\, a bell \\x07, a line\\nbreak, ünïcödé, \\U0001F600, \\u2028"
inputs:
  x: "Tensor[..., N]"
  b: Tensor?
  t: float = -0.0
let:
  u: '2'
outputs:
  y: "x * u"
  z: {formula: true, differentiable: false}
gradients:
  x: "grad_y * u"
tests:
  domain: {x: [-1e-06, 1.5e+300]}
  shapes: {N: 3, x: [2, 3]}
  values: {t: 1e-300}
  points: {x: [.inf, -1, 0.5]}
  gradgrad: false
optimize: {rewrite: false, policy: memory, fuse: true}
""",
}


@pytest.mark.parametrize("name", sorted(ODD))
def test_odd_names_and_values_round_trip(name):
    assert_round_trip(ODD[name])


@pytest.mark.parametrize("text", ["", "on", "a\nb", '"', "\\", "\x00\x07\x85\u2028\ufeff\U0001f600", " x ", "#", "- a"])
def test_quoted_text_reads_back_as_itself(text):
    assert load_text(f"k: {quoted(text)}\n", "t.yaml").get("k").value == text  # type: ignore[union-attr]


def test_a_formula_yaml_reads_as_a_boolean_keeps_its_words():
    """YAML 1.1 reads a plain `on`, `yes`, `off` as booleans: `t: on`, meaning the input `on`, was the
    formula `true`, the number 1, with no word. `true` and `True` stay the boolean."""
    text = "name: op\ninputs:\n  x: Tensor\n  on: float = 3.0\nlet:\n  t: on\noutputs:\n  y: t * x\n  z: True * x\n"
    problems = Problems()
    spec = parse_spec(load_text(text, "op.yaml"), "op.yaml", problems)
    assert spec is not None and not problems.errors
    assert spec.lets[0].formula.text == "on"
    assert spec.outputs[1].formula.text == "True * x"
