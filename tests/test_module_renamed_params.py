"""A module parameter whose name an nn.Module attribute has (`forward`, `reset_parameters`) is kept
under another attribute (`forward_`); the generated module test reads it there."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch
from spec_ops import build_ops

SPEC = """
    name: clashing
    inputs:
      x: Tensor
      forward: Tensor
      reset_parameters: Tensor
    outputs:
      y: x * forward + reset_parameters
    module:
      args:
        n: int
      parameters:
        forward: {shape: [n], init: constant(2)}
        reset_parameters: {shape: [n], init: ones}
"""


def test_the_generated_module_test_passes_for_renamed_parameters(tmp_path):
    ops = build_ops(tmp_path, "renamed_params_ops", {"clashing": SPEC})
    module = ops.Clashing(3).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    torch.testing.assert_close(module(x), 2 * x + 1)
    assert set(dict(module.named_parameters())) == {"forward_", "reset_parameters_"}
    sys.path.insert(0, str(Path(ops.__file__).parents[1]))
    try:
        tests = importlib.import_module("renamed_params_ops.tests.test_clashing")
    finally:
        sys.path.pop(0)
    tests.test_module_matches_functional()  # it read `module.forward`, the method, before
