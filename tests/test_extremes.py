"""The generated float32 accuracy tests (opgen/plan/extremes.py): exact rows, and a check that can fail."""

from __future__ import annotations

import importlib

import mpmath
import torch
from conftest import ROOT, import_package
from spec_ops import build_ops

from opgen.errors import Problems
from opgen.pipeline import run_stages
from opgen.plan.extremes import extreme_rows, float32
from opgen.spec.load import load_file
from opgen.spec.parse import parse_spec


def _spec(name: str):
    path = ROOT / "specs" / f"{name}.yaml"
    spec = parse_spec(load_file(path, str(path)), f"specs/{name}.yaml", Problems())
    assert spec is not None
    return spec


def _rows(name: str):
    """The extreme rows of spec `name`, from its derivation as written (the oracle the pipeline hands on)."""
    spec = _spec(name)
    stages = run_stages(spec, Problems(), stop_after="derive")
    assert stages is not None
    return extreme_rows(spec, stages.oracle)


def test_rows_are_the_formula_as_written_at_50_digits():
    rows = {point: (values, slope) for _, point, values, slope, _ in _rows("swish")}
    assert {-1e4, -100.0, -30.0, 0.0, 30.0, 100.0, 1e4, float32(1e-6)} <= set(rows)
    with mpmath.workdps(50):
        for point in (-100.0, float32(1e-6), 30.0):
            x = mpmath.mpf(point)
            value = x / (1 + mpmath.exp(-x))
            slope = mpmath.diff(lambda t: t / (1 + mpmath.exp(-t)), x)
            (got_value,), got_slope = rows[point]
            assert abs(got_value - value) <= 1e-15 * abs(value) and abs(got_slope - slope) <= 1e-15 * abs(slope)


def test_a_domain_without_real_values_has_no_rows():
    rows = _rows("safe_sqrt")
    assert rows and all(point >= 0 or values[0] == 0 for _, point, values, _, _ in rows)


def test_the_check_fails_for_the_naive_float32_formula():
    """The generated swish test's rows and `accurate` (tests/accuracy.py) reject plain autograd of the formula."""
    import_package(ROOT, "generated")
    tests = importlib.import_module("generated.tests.test_swish")
    accuracy = importlib.import_module("generated.tests.accuracy")
    rejected = []
    for _, point, (value,), slope, _ in tests.EXTREMES:
        x = torch.tensor([point], dtype=torch.float32, requires_grad=True)
        y = x / (1 + torch.exp(-x))
        (grad,) = torch.autograd.grad(y.sum(), x)
        if not (accuracy.accurate(y.detach(), value) and accuracy.accurate(grad, slope)):
            rejected.append(point)
    assert -100.0 in rejected and -1e4 in rejected
    tests.test_float32_at_extreme_inputs()  # while the generated op passes


CELU_AS_IN_THE_DOCS = """\
name: celu_docs
inputs:
  x: Tensor
  alpha: float = 1.0
outputs:
  y: max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
"""


def test_a_tie_of_a_smooth_formula_checks_no_slope(tmp_path):
    """CELU as PyTorch's docs write it is smooth at 0 (slope 1 both sides), but each of its `max` and
    `min` gives the tie to the number, so plain autograd gives 0 there; the op gives F.celu's 1 (Note
    [branches that join] in opgen/optimize/rewrite.py). The generated accuracy test must not expect
    either at that tie (Note [slopes at ties]), and still checks the slope elsewhere."""
    package = build_ops(tmp_path, "celu_ops", {"celu_docs": CELU_AS_IN_THE_DOCS})
    x = torch.zeros(1, requires_grad=True)
    (grad,) = torch.autograd.grad((torch.relu(x) - torch.relu(-torch.expm1(x))).sum(), x)  # min(0, u) = -relu(-u)
    (op_grad,) = torch.autograd.grad(package.celu_docs(x).sum(), x)
    assert grad.item() == 0.0 and op_grad.item() == 1.0  # plain autograd of the formula at the tie, and the op
    tests = importlib.import_module("celu_ops.tests.test_celu_docs")
    slopes = {point: slope for _, point, _, slope, _ in tests.EXTREMES}
    assert slopes[0.0] is None and slopes[-30.0] is not None and slopes[30.0] == 1.0
    tests.test_float32_at_extreme_inputs()
