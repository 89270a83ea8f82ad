"""`tests: shapes` that the op would refuse are located errors at generate time (the generated
tests failed with a ValueError from the op before)."""

from __future__ import annotations

import textwrap

import pytest

from opgen.emit.render import Renderer
from opgen.pipeline import build

BAD = {
    # too few sizes for two named dimensions
    "rank": ("x: Tensor[N, D]", "{x: [3]}", "8:15", "[3] does not fit 'x: Tensor[N, D]'; give 2 sizes"),
    # a tensor of no dimensions given one
    "scalar": ("x: Tensor[]", "{x: [1]}", "8:15", "give [] (a tensor of no dimensions)"),
    # batch dimensions may be added, named ones not dropped
    "batch": ("x: Tensor[..., N, D]", "{x: [4]}", "8:15", "give 2 or more sizes"),
    # two inputs disagree on D
    "two inputs": (
        "x: Tensor[N, D]\n  w: Tensor[D]",
        "{x: [3, 4], w: [5]}",
        "9:26",
        "makes D = 5, but tests.shapes.x made it 4",
    ),
    # an input disagrees with the dimension's own entry
    "own entry": (
        "x: Tensor[..., D]\n  w: Tensor[D]",
        "{x: [2, 3, 4], D: 5}",
        "9:15",
        "makes D = 4, but tests.shapes.D made it 5",
    ),
}


def _spec(inputs: str, shapes: str) -> str:
    return (
        textwrap.dedent("""\
        name: op
        inputs:
          INPUTS
        outputs:
          y: x * 2
        tests:
          domain: {x: [-1, 1]}
          shapes: SHAPES
        """)
        .replace("INPUTS", inputs)
        .replace("SHAPES", shapes)
    )


@pytest.mark.parametrize("case", sorted(BAD))
def test_sample_shapes_the_op_refuses_are_located_errors(tmp_path, case):
    inputs, shapes, where, message = BAD[case]
    (tmp_path / "op.yaml").write_text(_spec(inputs, shapes))
    result = build([str(tmp_path / "op.yaml")], Renderer())
    report = "\n".join(result.problems.report())
    assert f"op.yaml:{where}: tests.shapes." in report, report
    assert message in report, report


@pytest.mark.parametrize(
    "inputs, shapes",
    [
        ("x: Tensor[..., D]\n  s: Tensor[]\n  z: Tensor", "{x: [2, 3, 4], s: [], z: [4]}"),
        ("x: Tensor[N, D]\n  w: Tensor[D]", "{x: [3, 4], w: [4], N: 3}"),
    ],
)
def test_sample_shapes_that_fit_are_taken(tmp_path, inputs, shapes):
    (tmp_path / "op.yaml").write_text(_spec(inputs, shapes))
    result = build([str(tmp_path / "op.yaml")], Renderer())
    assert not result.problems, result.problems.report()
