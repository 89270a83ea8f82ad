"""Ops users write from papers and blog posts (round 3), each checked against plain torch.

Every spec below is generated once; each op is compared in float64 with an independent plain-torch
reference (values, gradients, `torch.func.jvp`, `vmap`, gradgradcheck), and in float32 at
extreme inputs where the reference is finite, which is where the formulas as written overflow.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import user_ops

SPECS = {
    # Two outputs; the output `var` is named like the function it calls.
    "moments": """
inputs:
  x: Tensor[..., D]
outputs:
  mean: mean(x, dim=-1)
  var: var(x, dim=-1, correction=0)
""",
    # LogSumExp pooling as the paper writes it: log(mean(exp(r x))) / r overflows past r x = 88.
    "lse_pool": """
inputs:
  x: Tensor[..., D]
  r: float = 5.0
outputs:
  y: log(mean(exp(r * x), dim=-1)) / r
""",
    # Soft clipping (Klimek & Perelstein): the quotient is inf / inf past a x = 88.
    "soft_clip": """
inputs:
  x: Tensor
  a: float = 5.0
outputs:
  y: log((1 + exp(a * x)) / (1 + exp(a * (x - 1)))) / a
""",
    "serf": """
inputs:
  x: Tensor
outputs:
  y: x * erf(log(1 + exp(x)))
""",
    # TanhExp and the Gumbel CDF: exp(x) overflows, and the formula takes it back (tanh(inf) = 1).
    "tanhexp": """
inputs:
  x: Tensor
outputs:
  y: x * tanh(exp(x))
""",
    "gumbel_cdf": """
inputs:
  x: Tensor
outputs:
  y: exp(-exp(-x))
""",
    "sigmoid_of_exp": """
inputs:
  x: Tensor
outputs:
  y: x / (1 + exp(exp(x)))
""",
    # PACT with a learnable clip: the override of the scalar `alpha` written as the sum it is.
    "pact": """
inputs:
  x: Tensor
  alpha: Tensor[]
  bits: int = 4
let:
  levels: 2**bits - 1
outputs:
  y: round(clamp(x, 0, alpha) * levels / alpha) * alpha / levels
gradients:
  x: grad * ((x >= 0) & (x < alpha))
  alpha: sum(grad * (x >= alpha))
tests:
  domain: {alpha: [1, 3]}
""",
    "logit_adjusted_ce": """
inputs:
  logits: Tensor[..., C]
  target: Tensor[..., C]
  prior: Tensor[C]
  tau: float = 1.0
outputs:
  loss: -sum(target * log_softmax(logits + tau * log(prior), dim=-1), dim=-1)
tests:
  domain: {prior: [0.05, 1], target: [0, 1]}
""",
    "mixture_of_softmaxes": """
inputs:
  prior: Tensor[..., K]
  logits: Tensor[..., K, V]
outputs:
  p: sum(unsqueeze(softmax(prior, dim=-1), dim=-1) * softmax(logits, dim=-1), dim=-2)
""",
    "giou_1d": """
inputs:
  l1: Tensor
  r1: Tensor
  l2: Tensor
  r2: Tensor
let:
  inter: max(min(r1, r2) - max(l1, l2), 0)
  union: (r1 - l1) + (r2 - l2) - inter
  hull: max(r1, r2) - min(l1, l2)
outputs:
  loss: 1 - inter / union + (hull - union) / hull
tests:
  domain: {l1: [-3, -1], r1: [0, 2], l2: [-2, 0], r2: [1, 3]}
""",
}


def _giou(l1, r1, l2, r2):
    inter = torch.clamp(torch.minimum(r1, r2) - torch.maximum(l1, l2), min=0)
    union = (r1 - l1) + (r2 - l2) - inter
    hull = torch.maximum(r1, r2) - torch.minimum(l1, l2)
    return 1 - inter / union + (hull - union) / hull


# Each reference takes the op's arguments and returns its outputs as a tuple.
REFERENCE = {
    "moments": lambda x: (x.mean(-1), x.var(-1, correction=0)),
    "lse_pool": lambda x, r: ((torch.logsumexp(r * x, -1) - math.log(x.shape[-1])) / r,),
    "soft_clip": lambda x, a: ((F.softplus(a * x) - F.softplus(a * (x - 1))) / a,),
    "serf": lambda x: (x * torch.erf(F.softplus(x)),),
    "tanhexp": lambda x: (x * torch.tanh(torch.exp(x)),),
    "gumbel_cdf": lambda x: (torch.exp(-torch.exp(-x)),),
    "sigmoid_of_exp": lambda x: (x * torch.sigmoid(-torch.exp(x)),),
    "logit_adjusted_ce": lambda z, t, p, tau: (-(t * torch.log_softmax(z + tau * torch.log(p), -1)).sum(-1),),
    "mixture_of_softmaxes": lambda p, z: ((torch.softmax(p, -1).unsqueeze(-1) * torch.softmax(z, -1)).sum(-2),),
    "giou_1d": lambda *a: (_giou(*a),),
}

# Float32 inputs (the tensor arguments) at which the formula as written overflows.
EXTREME = {
    "lse_pool": lambda: (torch.tensor([[100.0, 90.0, -1e4], [1e4, 1e4 - 1, 0.0]]), 5.0),
    "soft_clip": lambda: (torch.tensor([-1e4, -100.0, -10.0, 0.5, 10.0, 100.0, 1e4]), 5.0),
    "serf": lambda: (torch.tensor([-1e4, -100.0, -10.0, 10.0, 100.0, 1e4]),),
    "tanhexp": lambda: (torch.tensor([-1e4, -100.0, -10.0, 10.0, 89.0, 100.0, 1e4]),),
    "gumbel_cdf": lambda: (torch.tensor([-1e4, -100.0, -10.0, 10.0, 100.0, 1e4]),),
    "sigmoid_of_exp": lambda: (torch.tensor([-1e4, -100.0, -10.0, 4.0, 10.0, 100.0, 1e4]),),
    "logit_adjusted_ce": lambda: (
        torch.tensor([[1e4, -1e4, 0.0], [100.0, 100.0, -100.0]]),
        torch.tensor([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]]),
        torch.tensor([0.1, 0.3, 0.6]),
        1.0,
    ),
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return user_ops.generate(tmp_path_factory.mktemp("round3"), "round3_ops", SPECS)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_float64_against_plain_torch(ops, name):
    op, args, tensors = user_ops.case(ops, name)
    mine, theirs = user_ops.of(op, args, tensors), user_ops.of(REFERENCE[name], args, tensors)
    primals = tuple(args[k] for k in tensors)
    user_ops.check_float64(mine, theirs, primals)
    batch = tuple(torch.stack([p, 2 * p]) for p in primals)
    batched = torch.func.vmap(mine)(*batch)
    for k, one in enumerate(theirs(*(b[1] for b in batch))):
        torch.testing.assert_close(batched[k][1], one)


@pytest.mark.parametrize("name", sorted(EXTREME))
def test_float32_at_extreme_inputs(ops, name):
    user_ops.check_float32(getattr(ops, name), REFERENCE[name], list(EXTREME[name]()))


def test_forward_mode_of_a_summed_override_of_a_scalar_input(ops):
    """`alpha: sum(grad * h)` of a `Tensor[]` input is `grad * h` summed to its shape: forward mode along
    `alpha` works (it was refused as not linear in the gradient), and jvp and vjp are transposes."""
    forward, (x, alpha) = user_ops.jacobians_both_ways(ops, "pact")
    torch.testing.assert_close(forward[0][1], (x >= alpha).to(x.dtype))
