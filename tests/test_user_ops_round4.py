"""Tensor ops users write from papers and blog posts (round 4), each checked against plain torch.

Norms over several dims, matrix products, attention with a mask, contrastive and distribution
losses, softmax over other dims, several outputs sharing a reduction, learnable scalars and
modules. Every spec below is generated once; each op is compared in float64 with an independent
plain-torch reference (values, gradients, gradgradcheck, `torch.func.jvp`, `vmap`, `hessian`),
and in float32 at extreme inputs where the reference is finite.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import user_ops

SPECS = {
    "attention": """
inputs:
  q: Tensor[..., N, D]
  k: Tensor[..., M, D]
  v: Tensor[..., M, E]
outputs:
  o: softmax(q @ k.T / sqrt(D), dim=-1) @ v
""",
    "biased_lse": """
inputs:
  x: Tensor[..., D]
  bias: Tensor[D]?
outputs:
  y: logsumexp(x + bias, dim=-1)
""",
    "bilinear_attention": """
inputs:
  x: Tensor[N, D]
  W: Tensor[D, E]
  y: Tensor[M, E]
outputs:
  a: softmax(x @ W @ y.T, dim=-1)
""",
    "center_loss": """
inputs:
  x: Tensor[N, D]
  c: Tensor[N, D]
outputs:
  loss: mean(sum((x - c)**2, dim=-1)) / 2
""",
    "cosine_head": """
inputs:
  x: Tensor[N, D]
  w: Tensor[C, D]
  s: float = 16.0
outputs:
  logits: s * (x / norm(x, dim=-1, keepdim=true)) @ (w / norm(w, dim=-1, keepdim=true)).T
""",
    "dual_softmax": """
inputs:
  a: Tensor[N, D]
  b: Tensor[M, D]
  tau: float = 0.1
let:
  s: a @ b.T / tau
outputs:
  p: softmax(s, dim=0) * softmax(s, dim=1)
""",
    "entropy_reg": """
inputs:
  logits: Tensor[..., C]
let:
  p: softmax(logits, dim=-1)
outputs:
  h: -sum(p * log(p), dim=-1)
""",
    "focal_multiclass": """
inputs:
  logits: Tensor[..., C]
  target: Tensor[..., C]
  gamma: float = 2.0
let:
  p: softmax(logits, dim=-1)
outputs:
  loss: -sum(target * (1 - p)**gamma * log_softmax(logits, dim=-1), dim=-1)
tests:
  domain: {target: [0, 1]}
""",
    "gauss_kl": """
inputs:
  mu: Tensor[..., D]
  logvar: Tensor[..., D]
outputs:
  kl: -0.5 * sum(1 + logvar - mu**2 - exp(logvar), dim=-1)
""",
    "geglu_ffn": """
inputs:
  x: Tensor[..., D]
  w1: Tensor[D, H]
  w2: Tensor[D, H]
  w3: Tensor[H, D]
outputs:
  y: (gelu(x @ w1) * (x @ w2)) @ w3
""",
    "gram_style": """
inputs:
  x: Tensor[C, N]
  target: Tensor[C, C]
outputs:
  loss: mean((x @ x.T / N - target)**2)
""",
    "info_nce": """
inputs:
  z1: Tensor[N, D]
  z2: Tensor[N, D]
  tau: float = 0.1
let:
  a: z1 / norm(z1, dim=-1, keepdim=true)
  b: z2 / norm(z2, dim=-1, keepdim=true)
outputs:
  loss: mean(logsumexp(a @ b.T / tau, dim=-1) - sum(a * b, dim=-1) / tau)
""",
    "instance_norm": """
inputs:
  x: Tensor[N, C, H, W]
  eps: float = 1e-5
let:
  mu: mean(x, dim=(2, 3), keepdim=true)
  v: var(x, dim=(2, 3), keepdim=true, correction=0)
outputs:
  y: (x - mu) / sqrt(v + eps)
""",
    "instance_norm_affine": """
inputs:
  x: Tensor[N, C, H, W]
  weight: Tensor[C]
  bias: Tensor[C]?
  eps: float = 1e-5
let:
  mu: mean(x, dim=(2, 3), keepdim=true)
  v: var(x, dim=(2, 3), keepdim=true, correction=0)
  scale: unsqueeze(unsqueeze(weight, dim=-1), dim=-1)
outputs:
  y: (x - mu) * rsqrt(v + eps) * scale + unsqueeze(unsqueeze(bias, dim=-1), dim=-1)
module:
  name: InstanceNorm2d
  args:
    num_features: int
    eps: float = 1e-5
    affine: bool = true
  parameters:
    weight: {shape: [num_features], init: ones}
    bias: {shape: [num_features], init: zeros, when: affine}
""",
    "layer_scale": """
inputs:
  x: Tensor[..., D]
  residual: Tensor[..., D]
  gamma: Tensor[D]
outputs:
  y: residual + gamma * x
module:
  name: LayerScale
  args:
    dim: int
    init_values: float = 1e-5
  parameters:
    gamma: {shape: [dim], init: constant(init_values)}
""",
    "log_cosh_loss": """
inputs:
  pred: Tensor
  target: Tensor
outputs:
  loss: mean(log(cosh(pred - target)))
""",
    "logit_norm_ce": """
inputs:
  logits: Tensor[..., C]
  target: Tensor[..., C]
  tau: float = 0.04
outputs:
  loss: -sum(target * log_softmax(logits / (tau * (norm(logits, dim=-1, keepdim=true) + 1e-7)), dim=-1), dim=-1)
tests:
  domain: {target: [0, 1]}
""",
    "ls_kl": """
inputs:
  logits: Tensor[..., C]
  target: Tensor[..., C]
  eps: float = 0.1
let:
  q: (1 - eps) * target + eps / C
outputs:
  kl: sum(xlogy(q, q) - q * log_softmax(logits, dim=-1), dim=-1)
tests:
  domain: {target: [0, 1]}
""",
    "masked_attention": """
inputs:
  q: Tensor[..., N, D]
  k: Tensor[..., M, D]
  mask: Tensor[..., N, M]
  temperature: float = 1.0
let:
  s: q @ k.T / (sqrt(D) * temperature)
outputs:
  p: softmax(where(mask > 0.5, s, -1e9), dim=-1)
tests:
  domain: {mask: [0, 1]}
""",
    "mean_only_bn": """
inputs:
  x: Tensor[N, C]
  bias: Tensor[C]
outputs:
  y: x - mean(x, dim=0, keepdim=true) + bias
module:
  name: MeanOnlyBatchNorm
  args:
    num_features: int
  parameters:
    bias: {shape: [num_features], init: zeros}
""",
    "mqa_scores": """
inputs:
  q: Tensor[..., H, N, D]
  k: Tensor[..., M, D]
outputs:
  s: q @ unsqueeze(k, dim=-3).T / sqrt(D)
""",
    "poly_act": """
inputs:
  x: Tensor
  a: Tensor[]
  b: Tensor[]
  c: Tensor[]
outputs:
  y: a + b * x + c * x**2
module:
  name: PolyAct
  parameters:
    a: {shape: [], init: zeros}
    b: {shape: [], init: ones}
    c: {shape: [], init: constant(0.1)}
""",
    "power_norm": """
inputs:
  x: Tensor[N, C]
  weight: Tensor[C]
  bias: Tensor[C]
  eps: float = 1e-5
outputs:
  y: weight * x / sqrt(mean(x**2, dim=0, keepdim=true) + eps) + bias
""",
    "rms_residual": """
inputs:
  x: Tensor[..., D]
  residual: Tensor[..., D]
  gain: Tensor[D]
  eps: float = 1e-6
let:
  h: x + residual
outputs:
  y: h * rsqrt(mean(h**2, dim=-1, keepdim=true) + eps) * gain
  new_residual: h
""",
    "scale_norm": """
inputs:
  x: Tensor[..., D]
  g: Tensor[]
  eps: float = 1e-5
outputs:
  y: g * x / clamp(norm(x, dim=-1, keepdim=true), min=eps)
module:
  name: ScaleNorm
  args:
    dim: int
    eps: float = 1e-5
  parameters:
    g: {shape: [], init: constant(sqrt(dim))}
""",
    "softmax_dim0": """
inputs:
  x: Tensor[N, C]
outputs:
  y: softmax(x, dim=0)
""",
    "softmax_middle": """
inputs:
  x: Tensor[B, N, C]
outputs:
  y: softmax(x, dim=1)
  z: log_softmax(x, dim=-2)
""",
    "stable_softmax": """
inputs:
  x: Tensor[..., D]
let:
  e: exp(x - amax(x, dim=-1, keepdim=true))
outputs:
  y: e / sum(e, dim=-1, keepdim=true)
""",
    "standardize": """
inputs:
  x: Tensor[..., D]
let:
  mu: mean(x, dim=-1, keepdim=true)
  sd: std(x, dim=-1, keepdim=true)
outputs:
  centered: x - mu
  sd_out: sd
  z: (x - mu) / sd
""",
    "triplet_loss_nd": """
inputs:
  a: Tensor[N, D]
  p: Tensor[N, D]
  n: Tensor[N, D]
  margin: float = 1.0
outputs:
  loss: mean(relu(norm(a - p, dim=-1) - norm(a - n, dim=-1) + margin))
""",
    "var_std": """
inputs:
  x: Tensor[..., D]
outputs:
  v1: var(x, dim=-1)
  v0: var(x, dim=-1, correction=0)
  s1: std(x, dim=-1)
  s0: std(x, dim=-1, correction=0)
""",
    "ws_linear": """
inputs:
  x: Tensor[..., I]
  w: Tensor[O, I]
  eps: float = 1e-5
let:
  wc: w - mean(w, dim=1, keepdim=true)
  ws: wc / sqrt(var(w, dim=1, keepdim=true, correction=0) + eps)
outputs:
  y: x @ ws.T
""",
    # A mean over every dimension of a batch whose operand passes through reductions and products:
    # its count is the batch's size times the named dims (it was refused as not elementwise).
    "triplet_loss": """
inputs:
  a: Tensor[..., D]
  p: Tensor[..., D]
  n: Tensor[..., D]
  margin: float = 1.0
outputs:
  loss: mean(relu(norm(a - p, dim=-1) - norm(a - n, dim=-1) + margin))
""",
    "mean_scores": """
inputs:
  q: Tensor[..., N, D]
  k: Tensor[..., M, D]
outputs:
  m: mean(q @ k.T)
""",
    "scaled_max_mean": """
inputs:
  x: Tensor[..., D]
  w: Tensor[D]
outputs:
  y: mean(amax(x, dim=-1, keepdim=true) * w)
""",
    "var_of_norms": """
inputs:
  x: Tensor[..., D]
outputs:
  v: var(norm(x, dim=-1))
  s: std(norm(x, dim=-1), correction=0)
""",
    # A whole reduction of a product or a transpose: a scalar gradient meets `@` and `.T`.
    "sum_matmul": """
inputs:
  x: Tensor[N, K]
  w: Tensor[K, M]
outputs:
  s: sum(x @ w)
  t: sum(x.T * 2, dim=(0, 1))
""",
    "mean_rows_matmul": """
inputs:
  x: Tensor[D]
  w: Tensor[D, H]
outputs:
  m: mean(x @ w)
""",
}


def _rms(h, gain, eps):
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * gain


def _std_parts(x):
    mu = x.mean(-1, keepdim=True)
    return x - mu, x.std(-1, keepdim=True), (x - mu) / x.std(-1, keepdim=True)


# Each reference takes the op's arguments and returns its outputs as a tuple.
REFERENCE = {
    "attention": lambda q, k, v: (F.scaled_dot_product_attention(q, k, v),),
    "biased_lse": lambda x, b: (torch.logsumexp(x + b, -1),),
    "bilinear_attention": lambda x, w, y: (torch.softmax(x @ w @ y.T, -1),),
    "center_loss": lambda x, c: ((x - c).pow(2).sum(-1).mean() / 2,),
    "cosine_head": lambda x, w, s: (s * F.normalize(x, dim=-1) @ F.normalize(w, dim=-1).T,),
    "dual_softmax": lambda a, b, tau: (torch.softmax(a @ b.T / tau, 0) * torch.softmax(a @ b.T / tau, 1),),
    "entropy_reg": lambda z: (torch.distributions.Categorical(logits=z).entropy(),),
    "focal_multiclass": lambda z, t, g: (-(t * (1 - torch.softmax(z, -1)) ** g * torch.log_softmax(z, -1)).sum(-1),),
    "gauss_kl": lambda mu, lv: (-0.5 * (1 + lv - mu**2 - lv.exp()).sum(-1),),
    "geglu_ffn": lambda x, w1, w2, w3: ((F.gelu(x @ w1) * (x @ w2)) @ w3,),
    "gram_style": lambda x, t: ((x @ x.T / x.shape[1] - t).pow(2).mean(),),
    "instance_norm": lambda x, eps: (F.instance_norm(x, eps=eps),),
    "instance_norm_affine": lambda x, w, b, eps: (F.instance_norm(x, weight=w, bias=b, eps=eps),),
    "info_nce": lambda z1, z2, tau: (
        F.cross_entropy(F.normalize(z1, dim=-1) @ F.normalize(z2, dim=-1).T / tau, torch.arange(z1.shape[0])),
    ),
    "layer_scale": lambda x, r, g: (r + g * x,),
    "log_cosh_loss": lambda p, t: ((p - t + F.softplus(-2 * (p - t)) - math.log(2)).mean(),),
    "logit_norm_ce": lambda z, t, tau: (
        -(t * torch.log_softmax(z / (tau * (torch.linalg.vector_norm(z, dim=-1, keepdim=True) + 1e-7)), -1)).sum(-1),
    ),
    "ls_kl": lambda z, t, eps: (
        F.kl_div(torch.log_softmax(z, -1), (1 - eps) * t + eps / z.shape[-1], reduction="none").sum(-1),
    ),
    "masked_attention": lambda q, k, m, t: (
        torch.softmax(torch.where(m > 0.5, q @ k.mT / (math.sqrt(q.shape[-1]) * t), -1e9), -1),
    ),
    "mean_only_bn": lambda x, b: (x - x.mean(0, keepdim=True) + b,),
    "mqa_scores": lambda q, k: (q @ k.unsqueeze(-3).mT / math.sqrt(q.shape[-1]),),
    "poly_act": lambda x, a, b, c: (a + b * x + c * x**2,),
    "power_norm": lambda x, w, b, eps: (w * x / torch.sqrt(x.pow(2).mean(0, keepdim=True) + eps) + b,),
    "rms_residual": lambda x, r, g, eps: (_rms(x + r, g, eps), x + r),
    "scale_norm": lambda x, g, eps: (g * x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=eps),),
    "softmax_dim0": lambda x: (torch.softmax(x, 0),),
    "softmax_middle": lambda x: (torch.softmax(x, 1), torch.log_softmax(x, -2)),
    "stable_softmax": lambda x: (torch.softmax(x, -1),),
    "standardize": _std_parts,
    "triplet_loss_nd": lambda a, p, n, m: (
        F.relu(torch.linalg.vector_norm(a - p, dim=-1) - torch.linalg.vector_norm(a - n, dim=-1) + m).mean(),
    ),
    "var_std": lambda x: (x.var(-1), x.var(-1, correction=0), x.std(-1), x.std(-1, correction=0)),
    "triplet_loss": lambda a, p, n, m: (
        F.relu(torch.linalg.vector_norm(a - p, dim=-1) - torch.linalg.vector_norm(a - n, dim=-1) + m).mean(),
    ),
    "mean_scores": lambda q, k: ((q @ k.mT).mean(),),
    "scaled_max_mean": lambda x, w: ((x.amax(-1, keepdim=True) * w).mean(),),
    "var_of_norms": lambda x: (
        torch.linalg.vector_norm(x, dim=-1).var(),
        torch.linalg.vector_norm(x, dim=-1).std(correction=0),
    ),
    "sum_matmul": lambda x, w: ((x @ w).sum(), (x.T * 2).sum()),
    "mean_rows_matmul": lambda x, w: ((x @ w).mean(),),
    "ws_linear": lambda x, w, eps: (
        x @ ((w - w.mean(1, keepdim=True)) / torch.sqrt(w.var(1, keepdim=True, correction=0) + eps)).T,
    ),
}


# Ops sampled with batch dimensions: what they reduce over every dimension is the batch.
BATCHED = {"triplet_loss", "mean_scores", "scaled_max_mean", "var_of_norms"}


def _t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


# Float32 inputs at which the formulas as written overflow or cancel.
EXTREME = {
    "entropy_reg": lambda: (_t([1e4, -1e4, 0.0], [100.0, -100.0, 30.0], [1.0, 2.0, 3.0]),),
    "log_cosh_loss": lambda: (_t(-1e4, -100.0, -10.0, 0.5, 10.0, 100.0, 1e4), torch.zeros(7)),
    "focal_multiclass": lambda: (
        _t([1e4, -1e4, 0.0], [100.0, 100.0, -100.0]),
        _t([0.2, 0.3, 0.5], [1.0, 0.0, 0.0]),
        2.0,
    ),
    "ls_kl": lambda: (_t([1e4, -1e4, 0.0], [100.0, 100.0, -100.0]), _t([0.0, 0.0, 1.0], [1.0, 0.0, 0.0]), 0.1),
    "logit_norm_ce": lambda: (_t([1e4, -1e4, 0.0], [100.0, 100.0, -100.0]), _t([0.2, 0.3, 0.5], [1.0, 0.0, 0.0]), 0.04),
    "stable_softmax": lambda: (_t([1e4, -1e4, 0.0], [100.0, 100.0, -100.0]),),
    "softmax_dim0": lambda: (_t([1e4, -1e4, 0.0], [100.0, 100.0, -100.0]),),
    "masked_attention": lambda: (
        _t([[100.0, -100.0], [30.0, 10.0]]),
        _t([[100.0, 100.0], [-100.0, 1.0], [1.0, 1.0]]),
        _t([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]]),
        1.0,
    ),
    "info_nce": lambda: (_t([1e4, 1.0], [-100.0, 3.0], [1e-3, -1e4]), _t([1.0, 1e4], [-3.0, 100.0], [5.0, 5.0]), 0.01),
    "gauss_kl": lambda: (_t([1e4, 0.0, -1.0], [100.0, -100.0, 3.0]), _t([-100.0, 80.0, 0.0], [30.0, -30.0, 10.0])),
    "dual_softmax": lambda: (_t([100.0, 1.0], [-100.0, 3.0], [1.0, -100.0]), _t([1.0, 10.0], [-3.0, 1.0]), 0.01),
    "scale_norm": lambda: (_t([1e4, -1e4, 0.0], [1e-3, 2e-3, 0.0]), torch.tensor(2.0), 1e-5),
    "cosine_head": lambda: (_t([1e4, -1e4, 1.0], [1e-3, 2e-3, 0.5]), _t([1e3, 1.0, 1.0], [-100.0, 0.0, 3.0]), 16.0),
    "standardize": lambda: (_t([1e4, -1e4, 3.0], [100.0, -100.0, 30.0]),),
    "triplet_loss_nd": lambda: (
        _t([1e4, 0.0], [100.0, 1.0]),
        _t([-1e4, 0.0], [100.0, 2.0]),
        _t([1e4, 1.0], [0.0, 1.0]),
        1.0,
    ),
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return user_ops.generate(tmp_path_factory.mktemp("round4"), "round4_ops", SPECS)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_float64_against_plain_torch(ops, name):
    op, args, tensors = user_ops.case(ops, name, batched=name in BATCHED)
    mine, theirs = user_ops.of(op, args, tensors), user_ops.of(REFERENCE[name], args, tensors)
    user_ops.check_float64(mine, theirs, tuple(args[k] for k in tensors), hessian=True)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_vmap_over_a_new_batch_dim(ops, name):
    op, args, tensors = user_ops.case(ops, name, batched=name in BATCHED)
    mine, theirs = user_ops.of(op, args, tensors), user_ops.of(REFERENCE[name], args, tensors)
    batch = tuple(torch.stack([args[k], 2 * args[k]]) for k in tensors)
    one = tuple(b[1] for b in batch)
    for got, want in zip(torch.func.vmap(mine)(*batch), theirs(*one), strict=True):
        torch.testing.assert_close(got[1], want)
    rows = torch.func.vmap(torch.func.jacrev(lambda *xs: mine(*xs)[0].sum()))(*batch)
    torch.testing.assert_close(rows[1], torch.func.jacrev(lambda *xs: theirs(*xs)[0].sum())(*one))


@pytest.mark.parametrize("name", sorted(EXTREME))
def test_float32_at_extreme_inputs(ops, name):
    user_ops.check_float32(getattr(ops, name), REFERENCE[name], list(EXTREME[name]()))


def test_modules_start_from_their_args_and_equal_the_functional(ops):
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    norm = ops.InstanceNorm2d(3, affine=False).double()
    assert norm.bias is None
    torch.testing.assert_close(norm(x), F.instance_norm(x, weight=norm.weight, eps=1e-5))
    assert torch.equal(ops.LayerScale(4, init_values=0.1).gamma, torch.full((4,), 0.1))
    scale = ops.ScaleNorm(16)
    assert scale.g.shape == () and scale.g.item() == 4.0  # constant(sqrt(dim))
    rows = torch.randn(3, 16)
    scale(rows).sum().backward()
    want = torch.autograd.grad(REFERENCE["scale_norm"](rows, scale.g, 1e-5)[0].sum(), scale.g)[0]
    torch.testing.assert_close(scale.g.grad, want)
    poly = ops.PolyAct()
    assert [p.item() for p in poly.parameters()] == pytest.approx([0.0, 1.0, 0.1])
    bn = ops.MeanOnlyBatchNorm(3)
    torch.testing.assert_close(bn(rows[:, :3]), REFERENCE["mean_only_bn"](rows[:, :3], bn.bias)[0])


def test_a_boolean_mask_selects_the_scores(ops):
    q, k = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(2, 5, 4, dtype=torch.float64)
    mask = torch.rand(2, 3, 5) > 0.3
    want = REFERENCE["masked_attention"](q, k, mask, 1.0)[0]
    torch.testing.assert_close(ops.masked_attention(q, k, mask), want)
