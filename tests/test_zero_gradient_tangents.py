"""The zero gradient of a Tensor input with declared dimensions that no formula differentiates (read only for
the size of a dimension, or dropped by SymPy: `x + 0 * z`) is a function of the incoming gradient in the input's
shape. It was a fresh `new_zeros`, which has no tangent: gradgradcheck's forward-over-reverse check, which the
generated tests run, failed with a size mismatch on a valid spec. Checked against plain torch autograd of the
formula as written, float64, and by gradgradcheck itself."""

from __future__ import annotations

import pytest
import torch
from spec_ops import build_ops

CASES = {
    "size_only": (
        "  x1: Tensor[K, M]\n  x3: Tensor[N, M]\n",
        "where(x3 >= 0, x3, K)",
        lambda x1, x3: torch.where(x3 >= 0, x3, x1.shape[0]),
    ),
    "times_zero": (
        "  x1: Tensor[M]\n  x3: Tensor[N, M]\n",
        "x3 ** 2 + 0 * x1",
        lambda x1, x3: x3**2 + 0 * x1,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_zero_gradient_has_a_tangent(tmp_path, case):
    inputs, formula, reference = CASES[case]
    spec = f'name: op\ninputs:\n{inputs}outputs:\n  o: "{formula}"\n'
    ops = build_ops(tmp_path, f"zero_{case}", {"op": spec})
    torch.manual_seed(0)
    x1 = torch.randn(5, 4, dtype=torch.float64) if case == "size_only" else torch.randn(4, dtype=torch.float64)
    x3 = torch.randn(3, 4, dtype=torch.float64)
    args = (x1.requires_grad_(), x3.requires_grad_())
    got, want = ops.op(*args), reference(*args)
    torch.testing.assert_close(got, want)
    weights = torch.randn(want.shape, dtype=torch.float64)
    mine = torch.autograd.grad(got, args, weights, create_graph=True)
    theirs = torch.autograd.grad(want, args, weights, create_graph=True, allow_unused=True, materialize_grads=True)
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradgradcheck(ops.op, args, check_fwd_over_rev=True)
