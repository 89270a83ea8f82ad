"""An argument with a default declared before one without (`eps: float = 1e-5` before
`normalized_shape: int`) keeps its declared place and loses its default, as the functional's and
`forward`'s inputs always did: the Module's `__init__` kept it and was not valid Python
(SyntaxError: non-default argument follows default argument)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import torch
from spec_ops import build_ops

SPEC = """
    name: layer_norm
    inputs:
      x: Tensor[..., D]
      weight: Tensor[D]
      bias: Tensor[D]?
      eps: float = 1e-5
    let:
      mu: mean(x, dim=-1, keepdim=true)
      sigma2: var(x, dim=-1, keepdim=true, correction=0)
    outputs:
      y: (x - mu) * rsqrt(sigma2 + eps) * weight + bias
    module:
      name: LayerNorm
      args:
        eps: float = 1e-5
        normalized_shape: int
        bias: bool = true
      parameters:
        weight: {shape: [normalized_shape], init: ones}
        bias: {shape: [normalized_shape], init: zeros, when: bias}
"""


def test_a_default_before_an_argument_without_one(tmp_path):
    ops = build_ops(tmp_path, "default_order", {"layer_norm": SPEC})
    params = inspect.signature(ops.LayerNorm.__init__).parameters
    assert list(params) == ["self", "eps", "normalized_shape", "bias"]
    assert params["eps"].default is inspect.Parameter.empty
    assert params["bias"].default is True
    module = ops.LayerNorm(1e-5, 4)
    x = torch.randn(2, 4, dtype=torch.float64)
    torch.testing.assert_close(module.double()(x), torch.nn.functional.layer_norm(x, (4,), eps=1e-5))
    # The generated test constructs the module with the default it cannot leave out.
    tests = tmp_path / "default_order" / "tests"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "module", str(tests)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-2000:]
