"""A reduction over every dimension of a batched input (`sum(x)` of `Tensor[..., N, K]`) is a number-shaped
tensor: where SymPy drops it from a formula (`0 * sum(x) + y @ y.T`), the output keeps the shape of the rest,
as in torch. Its piece of the shape as written (Note [shapes as written] in opgen/formula/written.py) kept the
batch dimensions of `x`, and forward expanded the output to them: a broadcast error."""

from __future__ import annotations

import torch
from spec_ops import build_ops

SPEC = """
    name: op
    inputs:
      x: Tensor[..., N, K]
      y: Tensor[..., K, M]
    outputs:
      o: 0 * sum(x) + y @ y.T
"""


def test_a_dropped_whole_reduction_adds_no_batch_dimensions(tmp_path):
    ops = build_ops(tmp_path, "batched_whole", {"op": SPEC})
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True)
    o = ops.op(x, y)
    want = 0 * x.sum() + y @ y.mT
    torch.testing.assert_close(o, want)
    assert torch.autograd.gradcheck(ops.op, (x, y))
