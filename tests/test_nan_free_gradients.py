"""Gradients that were NaN where plain autograd's are finite, checked against plain torch autograd of the
formula as written, in float64, first and second derivatives.

- `sympy.together` put `a exp(-u) + b` over the common denominator `exp(u)`: where `exp(-u)` underflows,
  `exp(u)` overflows and the gradient was `0 * inf` (Note [no exponentials over a common denominator] in
  opgen/optimize/rewrite.py). `erf`'s and `erfc`'s derivatives hold `exp(-u**2)`.
- amax's gradient compared the operand, recomputed by backward, with the maximum forward saved: forward
  computed a constant let as `math.pow(25.05, ...)`, backward as SymPy's float64 value of it, one unit in
  the last place apart, so no entry was the maximum and the gradient was `0 / 0` (Note [ties with the
  maximum] in opgen/derive/vjp.py)."""

from __future__ import annotations

import math

import pytest
import torch
from spec_ops import build_ops

EXP_CASES = {
    "atan2_erf": (
        "atan2(erf(lgamma(x + 50)), 1.25 + x ** 2)",
        lambda x: torch.atan2(torch.erf(torch.lgamma(x + 50)), 1.25 + x**2),
    ),
    "atan2_erfc": (
        "atan2(erfc(lgamma(x + 50)), 1.25 + x ** 2)",
        lambda x: torch.atan2(torch.erfc(torch.lgamma(x + 50)), 1.25 + x**2),
    ),
    "fuzz": (  # the fuzz case's output, its inner value a plain input here
        "arctan(atan2(erf(lgamma(4499.955 * sin(x) + 5000.05)), 1.25 + x ** 2))",
        lambda x: torch.atan(torch.atan2(torch.erf(torch.lgamma(4499.955 * torch.sin(x) + 5000.05)), 1.25 + x**2)),
    ),
}


def _check(function, reference, x: torch.Tensor) -> None:
    got, want = function(x), reference(x)
    torch.testing.assert_close(got, want)
    weights = torch.randn(want.shape, dtype=torch.float64)
    (mine,) = torch.autograd.grad(got, x, weights, create_graph=True)
    (theirs,) = torch.autograd.grad(want, x, weights, create_graph=True)
    assert torch.isfinite(mine).all(), mine
    torch.testing.assert_close(mine, theirs)
    vector = torch.randn(x.shape, dtype=torch.float64)
    (mine2,) = torch.autograd.grad((mine * vector).sum(), x)
    (theirs2,) = torch.autograd.grad((theirs * vector).sum(), x)
    torch.testing.assert_close(mine2, theirs2, equal_nan=True)


@pytest.mark.parametrize("case", sorted(EXP_CASES))
def test_no_exponential_is_brought_over_a_common_denominator(tmp_path, case):
    formula, reference = EXP_CASES[case]
    spec = f'name: op\ninputs:\n  x: Tensor\noutputs:\n  o: "{formula}"\n'
    ops = build_ops(tmp_path, f"nan_{case}", {"op": spec})
    torch.manual_seed(0)
    _check(ops.op, reference, (torch.rand(6, dtype=torch.float64) + 1).requires_grad_())


AMAX_CASES = {
    "pow_let": (
        '  l0: "pi"\n  l1: "25.05 ** (2.7 * erf(l0))"\n',
        "amax(l1 + x)",
        lambda x: (math.pow(25.05, 2.7 * math.erf(math.pi)) + x).amax(),
    ),
    "dim": ('  l1: "exp(pi) ** 1.7"\n', "amax(x * l1, dim=-1)", lambda x: (x * math.exp(math.pi) ** 1.7).amax(-1)),
}


@pytest.mark.parametrize("policy", ["balanced", "memory", "speed"])
@pytest.mark.parametrize("case", sorted(AMAX_CASES))
def test_amax_ties_compare_values_computed_alike(tmp_path, case, policy):
    lets, formula, reference = AMAX_CASES[case]
    spec = f'name: op\ninputs:\n  x: Tensor[M, K]\nlet:\n{lets}outputs:\n  o: "{formula}"\n'
    spec += f"optimize: {{policy: {policy}}}\n"
    ops = build_ops(tmp_path, f"amax_{case}_{policy}", {"op": spec})
    torch.manual_seed(0)
    x = (torch.rand(4, 3, dtype=torch.float64) * 6 - 3).requires_grad_()
    got, want = ops.op(x), reference(x)
    torch.testing.assert_close(got, want)
    weights = torch.randn(want.shape, dtype=torch.float64)
    (mine,) = torch.autograd.grad(got, x, weights)
    (theirs,) = torch.autograd.grad(want, x, weights)
    torch.testing.assert_close(mine, theirs)
