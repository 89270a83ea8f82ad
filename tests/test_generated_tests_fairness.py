"""The generated tests fail only on a wrong op: a correct op a user writes from a paper passes them.

Each test here is a way the generated tests once failed a correct op: a condition used as a number
in the plain-torch reference, a NaN that one check accepted and another did not.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from conftest import ROOT, generated_tests, import_package, run_generated_tests

WINNER_SHARE = """\
name: winner_share
inputs:
  x: Tensor[N, D]
outputs:
  share: mean(x >= amax(x, dim=-1, keepdim=true), dim=0)
  scaled: x * sum(x > 0, dim=-1, keepdim=true)
"""


def test_a_condition_used_as_a_number_is_a_number_in_the_reference(tmp_path: Path):
    """`mean` and `sum` of a condition: torch.mean refuses a bool tensor, so the reference casts it."""
    tests = generated_tests(tmp_path, "winner_share", WINNER_SHARE)
    x = torch.tensor([[1.0, 3.0, 2.0], [4.0, 0.0, -1.0]], dtype=torch.float64, requires_grad=True)
    values = tests.reference(x)
    torch.testing.assert_close(values["share"], torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    torch.testing.assert_close(values["scaled"], x * torch.tensor([[3.0], [1.0]], dtype=torch.float64))
    run_generated_tests(tests)


def test_every_check_takes_the_same_nan_as_agreement():
    """vmap of an op that is NaN where a loop is NaN too passes, as the check of forward values does; a
    different value still fails."""
    import_package(ROOT, "generated")
    harness = importlib.import_module("generated.tests.harness")
    op = harness.OpUnderTest(torch.sqrt, ["x"], ["y"], tensor_inputs=[0], checked=[0], differentiable=[0])
    samples = [[(torch.linspace(-1.0, 1.0, 5, dtype=torch.float64) + k).requires_grad_()] for k in range(3)]
    harness.check_vmap(op, samples)
    harness.close(op(*samples[0])[0], torch.sqrt(samples[0][0]))  # the comparison every check goes through
    calls: list[int] = []

    def counting(x: torch.Tensor) -> torch.Tensor:  # one call under vmap, one per sample in the loop
        calls.append(0)
        return torch.sqrt(x) + len(calls)

    wrong = harness.OpUnderTest(counting, ["x"], ["y"], tensor_inputs=[0], checked=[0], differentiable=[0])
    with pytest.raises(AssertionError, match="vmap of y"):
        harness.check_vmap(wrong, samples)
