"""The generated tests are right about a correct op written by a user: they pass on it.

Each spec here is one a user could write and that a generated test once got wrong: a Module
sized from an arg that is no dimension name, non-tensor inputs of every kind tested at two
values, and float32 accuracy at extreme inputs where float32 rounding alone misses the exact
value (Note [what a float32 op can give] in the harness).
"""

from __future__ import annotations

import importlib
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import ROOT, generated_tests, import_package, run_generated_tests

RMS_NORM = """\
name: rms_norm
inputs:
  x: Tensor[..., D]
  weight: Tensor[D]
  eps: float = 1e-6
let:
  rms: sqrt(mean(x * x, dim=-1, keepdim=true) + eps)
outputs:
  y: x / rms * weight
module:
  name: RMSNorm
  args:
    dim: int
    eps: float = 1e-6
  parameters:
    weight: {shape: [dim], init: ones}
"""

KINDS = """\
name: kinds
inputs:
  x: Tensor
  k: int = 2
  flip: bool = false
  scale: float = 1.0
outputs:
  y: x**k * scale + flip * x
"""

SNAKE = """\
name: snake
inputs:
  x: Tensor
  a: Tensor
outputs:
  y: x + sin(a * x)**2 / a
tests:
  domain: {a: [0.1, 1.0]}
"""

LOGIT = """\
name: logit
inputs:
  p: Tensor
  eps: float = 1e-6
let:
  q: clamp(p, eps, 1 - eps)
outputs:
  y: log(q / (1 - q))
tests:
  domain: {p: [0, 1]}
"""


def test_module_is_built_with_the_sampled_sizes(tmp_path: Path):
    """`RMSNorm(dim=...)`: `dim` sizes the parameter `weight: Tensor[D]`, so it takes D's sample size."""
    tests = generated_tests(tmp_path, "rms_norm", RMS_NORM)
    source = Path(tests.__file__).read_text()
    assert f"RMSNorm(dim={tests.SHAPES['weight'][0]})" in source
    assert "test_module_matches_functional" in run_generated_tests(tests)


def test_non_tensor_inputs_are_tested_away_from_their_defaults(tmp_path: Path):
    tests = generated_tests(tmp_path, "kinds", KINDS)
    assert tests.VALUES == {"k": 2, "flip": False, "scale": 1.0}
    assert tests.OTHER_VALUES == {"k": 3, "flip": True, "scale": 0.7}  # both bools, another int, not 1.0
    assert "test_non_tensor_inputs_away_from_their_defaults" in run_generated_tests(tests)


def test_the_other_values_reach_the_op(tmp_path: Path):
    """An op that ignores `scale` passes the tests at the default and fails the one away from it."""
    tests = generated_tests(tmp_path, "kinds", KINDS)
    real = tests.OP.functional
    ignoring = type(tests.OP)(**{**vars(tests.OP), "functional": lambda x, k, flip, scale: real(x, k, flip, 1.0)})
    tests.harness.check_against_reference(ignoring, tests.sample_inputs(), tests.reference)
    with pytest.raises(AssertionError):
        tests.harness.check_against_reference(ignoring, tests.sample_inputs(values=tests.OTHER_VALUES), tests.reference)


@pytest.mark.parametrize(("name", "text"), [("snake", SNAKE), ("logit", LOGIT)])
def test_float32_extremes_ask_what_float32_can_give(tmp_path: Path, name: str, text: str):
    """Snake at |x| = 1e4 (float32 rounding of `a * x` alone moves the slope by 1e-4) and logit at
    its clamp bounds (`1 - eps` is no float32 number) pass with a correct op."""
    tests = generated_tests(tmp_path, name, text)
    assert tests.EXTREMES
    tests.test_float32_at_extreme_inputs()


def test_logit_rows_use_the_float32_bound(tmp_path: Path):
    """Beyond the clamp the exact value is the one at float32(1 - eps); at p = float32(eps) = eps
    the formula has a kink, so that row checks no slope."""
    tests = generated_tests(tmp_path, "logit", LOGIT)
    rows = {point: (values, slope) for _, point, values, slope, _ in tests.EXTREMES}
    q = float(torch.tensor(1 - 1e-6, dtype=torch.float32))
    (value,), _ = rows[1.0]  # the domain's edge, beyond the clamp
    assert abs(value - torch.log(torch.tensor(q / (1 - q), dtype=torch.float64)).item()) < 1e-9
    assert rows[float(torch.tensor(1e-6, dtype=torch.float32))][1] is None


def test_the_float32_check_with_its_slack_rejects_the_naive_formula():
    """swish as written, in float32, still fails the generated accuracy test (NaN slopes at -100)."""
    import_package(ROOT, "generated")
    tests = importlib.import_module("generated.tests.test_swish")
    naive = type(tests.OP)(**{**vars(tests.OP), "functional": lambda x, beta: x / (1 + torch.exp(-beta * x))})
    with pytest.raises(AssertionError, match="derivative at x = -100.0"):
        tests.harness.check_extremes(naive, tests.sample_inputs(), tests.EXTREMES, tests.PLACES, tests.reference)
    tests.test_float32_at_extreme_inputs()


def test_rows_check_no_slope_at_a_kink():
    """elu at 0 with alpha away from 1: the one-sided slopes (1 and alpha) differ, no slope is checked."""
    from opgen.errors import Problems
    from opgen.pipeline import run_stages
    from opgen.plan.extremes import extreme_rows
    from opgen.spec.load import load_text
    from opgen.spec.parse import parse_spec

    text = textwrap.dedent(
        """\
        name: elu
        inputs:
          x: Tensor
          alpha: float = 0.5
        outputs:
          y: where(x > 0, x, alpha * (exp(x) - 1))
        """
    )
    spec = parse_spec(load_text(text, "elu.yaml"), "elu.yaml", Problems())
    assert spec is not None
    stages = run_stages(spec, Problems(), stop_after="derive")  # the oracle: the formulas as written
    assert stages is not None
    rows = {point: slope for _, point, _, slope, _ in extreme_rows(spec, stages.oracle)}
    assert rows[0.0] is None and rows[30.0] == 1.0 and abs(rows[-3.0] - 0.5 * 2.718281828459045**-3) < 1e-15


def test_the_shared_generated_checks_meet_the_project_style():
    """The harness and the shape checks pass `ruff check` and `ruff format --check` (line length 120)."""
    import subprocess
    import sys

    ruff = Path(sys.executable).parent / "ruff"
    files = [str(ROOT / "generated" / "tests" / "harness.py"), str(ROOT / "generated" / "_shape_checks.py")]
    for command in (["check"], ["format", "--check"]):
        result = subprocess.run(
            [str(ruff), *command, "--config", str(ROOT / "pyproject.toml"), "--no-force-exclude", *files],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stdout + result.stderr
