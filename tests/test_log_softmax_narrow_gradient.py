"""The gradient through `log_softmax(a, dim)` is `g - softmax(a) * sum(g, dim, keepdim=true)`. A `g`
constant along `dim` (the scalar of `sum(log_softmax(a))`, the size 1 of a `keepdim=true` sum) sums to
`g` times the size of `dim`: the sum over a dimension the scalar lacks crashed at call time (IndexError:
Dimension out of range), the sum over its size 1 counted one entry instead of all of them."""

from __future__ import annotations

import pytest
import torch
from spec_ops import build_ops

FORMULAS = {
    "whole": "sum(log_softmax(x, dim=-2))",
    "kept": "sum(log_softmax(exp(x), dim=-2), dim=-2, keepdim=true)",
    "last": "sum(log_softmax(x, dim=-1), dim=(-2, -1))",
    "nested": "sum(log_softmax(softmax(x, dim=-2), dim=-2))",
}

PLAIN = {
    "whole": lambda x: torch.log_softmax(x, -2).sum(),
    "kept": lambda x: torch.log_softmax(x.exp(), -2).sum(-2, keepdim=True),
    "last": lambda x: torch.log_softmax(x, -1).sum((-2, -1)),
    "nested": lambda x: torch.log_softmax(torch.softmax(x, -2), -2).sum(),
}


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("case", sorted(FORMULAS))
def test_log_softmax_gradient_constant_along_its_dim(tmp_path, case, lower):
    spec = f"""
        name: op
        inputs:
          x: Tensor[N, K]
        outputs:
          o: {FORMULAS[case]}
        optimize: {{lower: {str(lower).lower()}}}
    """
    ops = build_ops(tmp_path, f"lsm_{case}_{lower}", {"op": spec})
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    o = ops.op(x)
    want = PLAIN[case](x)
    torch.testing.assert_close(o, want)
    seed = torch.rand_like(want)
    (g,) = torch.autograd.grad((o * seed).sum(), x)
    (g_want,) = torch.autograd.grad((want * seed).sum(), x)
    torch.testing.assert_close(g, g_want)
    assert torch.autograd.gradgradcheck(ops.op, (x,))
