"""Shape errors of tensor formulas: at generation time (located) and at call time (ValueError).

Generation: a corpus of bad specs in `tests/shape_errors/`, each message read and judged when
the snapshot was written. Call time: the generated `linear`, `softmax` and `attention_scores` reject arguments
whose shapes do not fit their named dimensions, naming the argument, the expected and the
actual shape. Refresh after an intended change of wording with
`OPGEN_UPDATE_SNAPSHOTS=1 pytest tests/test_shape_errors.py` and review the diff.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from conftest import SPECS, import_package

from opgen.emit.render import Renderer
from opgen.pipeline import build

HERE = Path(__file__).resolve().parent
CORPUS = sorted((HERE / "shape_errors").glob("*.yaml"))
SNAPSHOT = HERE / "shape_errors" / "messages.txt"
CALL_SNAPSHOT = HERE / "shape_errors" / "call_messages.txt"


def messages(path: Path) -> list[str]:
    return build([str(path.relative_to(HERE.parent))], Renderer()).problems.report()


def check_snapshot(path: Path, text: str) -> None:
    if os.environ.get("OPGEN_UPDATE_SNAPSHOTS"):
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8")


def test_generation_messages_match_snapshot(monkeypatch):
    monkeypatch.chdir(HERE.parent)
    check_snapshot(SNAPSHOT, "".join(line + "\n" for path in CORPUS for line in messages(path)))


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_each_bad_shape_gets_one_located_message(path, monkeypatch):
    monkeypatch.chdir(HERE.parent)
    found = messages(path)
    assert len(found) == 1, found
    located = rf"^tests/shape_errors/{re.escape(path.name)}:\d+:\d+: \S"
    assert re.match(located, found[0]), found[0]


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    from opgen.cli import main

    out = tmp_path_factory.mktemp("shape_ops")
    specs = [str(SPECS / name) for name in ("linear.yaml", "softmax.yaml", "attention_scores.yaml", "glu.yaml")]
    assert main(["generate", *specs, "-o", str(out / "shape_ops")]) == 0
    return import_package(out, "shape_ops")


def bad_calls(ops):
    x, w, b = torch.randn(2, 4), torch.randn(3, 4), torch.randn(3)
    return [
        ("inner dimension", lambda: ops.linear(x, torch.randn(3, 5), b)),
        ("bias size", lambda: ops.linear(x, w, torch.randn(4))),
        ("input rank", lambda: ops.linear(torch.randn(4), w, b)),  # batch dimensions are allowed, not fewer
        ("weight rank", lambda: ops.linear(x, torch.randn(4), None)),
        ("0-d softmax", lambda: ops.softmax(torch.tensor(1.0))),
        ("module input", lambda: ops.Linear(4, 3)(torch.randn(2, 5))),
        ("attention keys", lambda: ops.attention_scores(torch.randn(2, 3, 4), torch.randn(5, 3))),
        ("attention batch", lambda: ops.attention_scores(torch.randn(2, 3, 4), torch.randn(5, 6, 4))),
        ("odd halves", lambda: ops.glu(torch.randn(2, 5))),
    ]


def test_call_time_messages_match_snapshot(ops):
    lines = []
    for what, call in bad_calls(ops):
        with pytest.raises(ValueError) as error:
            call()
        lines.append(f"{what}: {error.value}")
    check_snapshot(CALL_SNAPSHOT, "\n".join(lines) + "\n")


def test_call_time_message_names_argument_expected_and_actual_shape(ops):
    expected = (
        "linear(): argument 'weight' must have shape [out_features, in_features]"
        " with in_features=4 (from 'input'), got [3, 5]"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        ops.linear(torch.randn(2, 4), torch.randn(3, 5))


def test_a_dimension_cut_in_halves_must_be_even(ops):
    """`x[..., :D // 2]` of an odd D is refused at call time, naming D, its size and the argument; an even
    D is what F.glu takes."""
    with pytest.raises(ValueError, match=re.escape("dimension D of 'x' has size 5, which is not divisible by 2")):
        ops.glu(torch.randn(3, 5))
    with pytest.raises(ValueError, match="not divisible by 2"):
        ops.glu(torch.randn(7))
    x = torch.randn(3, 6, dtype=torch.float64)
    torch.testing.assert_close(ops.glu(x), torch.nn.functional.glu(x, dim=-1))


def test_a_non_tensor_argument_is_a_type_error(ops):
    with pytest.raises(TypeError, match="argument 'input' must be a Tensor, not list"):
        ops.linear([[1.0, 2.0]], torch.randn(3, 2))
