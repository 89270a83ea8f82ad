"""An argument with a default declared before one without (`eps: float = 1e-5` before
`normalized_shape: int`) keeps its place and its default; the arguments from the first one without a
default that follows it are keyword-only (`def __init__(self, eps=1e-05, *, normalized_shape, bias=True)`),
the one valid Python signature that keeps every declared default and the declared order. The Module's
`__init__` had kept the default and was not valid Python (SyntaxError: non-default argument follows
default argument), then dropped it (`LayerNorm(1e-5, 4)` had to pass eps)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
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
    assert params["eps"].default == 1e-5
    assert params["eps"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert params["normalized_shape"].default is inspect.Parameter.empty
    assert params["normalized_shape"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["bias"].default is True
    x = torch.randn(2, 4, dtype=torch.float64)
    module = ops.LayerNorm(normalized_shape=4)
    assert module.eps == 1e-5 and module.bias is not None
    torch.testing.assert_close(module.double()(x), torch.nn.functional.layer_norm(x, (4,), eps=1e-5))
    module = ops.LayerNorm(1e-3, normalized_shape=4, bias=False)
    assert module.bias is None
    torch.testing.assert_close(module.double()(x), torch.nn.functional.layer_norm(x, (4,), eps=1e-3))
    with pytest.raises(TypeError, match="normalized_shape"):  # not silently eps=4
        ops.LayerNorm(4)
    # The generated test constructs the module leaving the default out.
    tests = tmp_path / "default_order" / "tests"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "module", str(tests)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-2000:]
