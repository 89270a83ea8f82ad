"""Choosing what backward saves stays quick on deep chains of costly lets (issue 8, failure 7).

Each let of the chain holds a costly call of the previous one; the choice looks for calls an
output holds linearly on its spine of sums and products only, and offers a call as a residual
only where no `let` computes it already, so the chain costs no rebuilding of the formula per call.
"""

from __future__ import annotations

import time
from pathlib import Path

from opgen.emit.render import Renderer
from opgen.errors import Problems
from opgen.optimize.save import choose_saved
from opgen.pipeline import build, run_stages
from opgen.spec.load import load_file
from opgen.spec.parse import parse_spec

LETS = 40


def _chain(tmp_path: Path, step: str) -> Path:
    lets = ["  l0: tanh(x)"] + [f"  l{i}: {step.format(p=f'l{i - 1}')}" for i in range(1, LETS)]
    path = tmp_path / "chain.yaml"
    path.write_text("name: chain\ninputs: {x: Tensor}\nlet:\n" + "\n".join(lets) + f"\noutputs: {{y: l{LETS - 1}}}\n")
    return path


def test_a_chain_of_costly_lets_chooses_its_saves_in_well_under_a_second(tmp_path: Path) -> None:
    path = _chain(tmp_path, "x * tanh({p})")
    problems = Problems()
    spec = parse_spec(load_file(path, path.name), "specs/chain.yaml", problems)
    assert spec is not None
    stages = run_stages(spec, problems, stop_after="optimize gradients")
    assert stages is not None and stages.gradients is not None, problems.report()
    start = time.perf_counter()
    chosen, residuals = choose_saved(stages.gradients, "balanced")
    assert time.perf_counter() - start < 1.0
    assert residuals == ()  # every tanh is a let's value: forward computes it there already


def test_a_chain_of_costly_lets_generates(tmp_path: Path) -> None:
    for step in ("x * tanh({p})", "tanh({p}) + x"):
        start = time.perf_counter()
        result = build([str(_chain(tmp_path, step))], Renderer())
        assert not result.problems, result.problems.report()
        assert time.perf_counter() - start < 15.0
