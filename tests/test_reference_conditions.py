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


def test_conditions_in_arithmetic_are_numbers_in_the_reference(tmp_path):
    ops = build_ops(tmp_path, "reference_conditions", {"counted": SPEC})
    sys.path.insert(0, str(tmp_path))
    try:
        tests = importlib.import_module("reference_conditions.tests.test_counted")
    finally:
        sys.path.pop(0)
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
