"""The generated tests' plain-torch reference reads a condition written in arithmetic as 1/0, as the
formula language does: torch refuses `-` of a bool tensor and adds two of them as their `or`."""

from __future__ import annotations

import importlib
import sys

import torch
from spec_ops import build_ops

SPEC = """
    name: counted
    inputs:
      x: Tensor
      y: Tensor
      n: int = 1
    outputs:
      a: ((x < y) - n) * x
      b: ((x > 0) + (y > 0)) * y
      c: -(x > y) + x - ~(y > 0)
"""


def _built(folder, package, name, spec):
    """The generated package's ops and its generated tests module of op `name`."""
    ops = build_ops(folder, package, {name: spec})
    sys.path.insert(0, str(folder))
    try:
        return ops, importlib.import_module(f"{package}.tests.test_{name}")
    finally:
        sys.path.pop(0)


def test_conditions_in_arithmetic_are_numbers_in_the_reference(tmp_path):
    ops, tests = _built(tmp_path, "reference_conditions", "counted", SPEC)
    x = torch.linspace(-2, 2, 9, dtype=torch.float64)
    y = x.flip(0) * 0.5
    as_number = lambda c: c.to(torch.float64)  # noqa: E731
    want = {
        "a": (as_number(x < y) - 2) * x,
        "b": (as_number(x > 0) + as_number(y > 0)) * y,
        "c": -as_number(x > y) + x - as_number(~(y > 0)),
    }
    got = tests.reference(x, y, 2)
    mine = ops.counted(x, y, 2)
    for name, value in zip("abc", mine, strict=True):
        torch.testing.assert_close(got[name], want[name])
        torch.testing.assert_close(value, want[name])


NOT_SPEC = """
    name: negated
    inputs:
      x: Tensor
      a: float
    outputs:
      d: {formula: "~False * x", differentiable: false}
      e: ~(a > 1) * x + 2 * x
"""


def test_not_of_a_number_condition_is_a_condition_in_the_reference(tmp_path):
    """Python's `~` of a bool is an int: `~False` is -1 and `~(a > 1)` -1 or -2, where the formula reads 1 and 0."""
    ops, tests = _built(tmp_path, "reference_negated", "negated", NOT_SPEC)
    x = torch.linspace(-2, 2, 9, dtype=torch.float64)
    for a in (0.5, 3.0):
        want = {"d": x, "e": float(not a > 1) * x + 2 * x}
        got = tests.reference(x, a)
        for name, value in zip("de", ops.negated(x, a), strict=True):
            torch.testing.assert_close(got[name], want[name])
            torch.testing.assert_close(value, want[name])
