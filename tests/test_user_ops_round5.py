"""Ops users write from papers, blog posts and forum answers (round 5), each checked against plain torch.

Gradient overrides (straight-through estimators, surrogate spikes, gradient reversal and clipping,
detached parts), several outputs with non-differentiable masks and metrics, modules with learnable
scalars, and numerically delicate losses and activations. Every spec below is generated once; each op
is compared in float64 with an independent plain-torch reference (values, gradients, gradgradcheck,
`torch.func.jvp`, `vmap`, `hessian`), and in float32 at extreme inputs where the reference is finite.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import user_ops

SPECS = {
    "round_ste_scaled": """
inputs:
  x: Tensor
  scale: float = 4.0
outputs:
  y: round(x * scale) / scale
gradients:
  x: grad
""",
    "bireal_sign": """
inputs:
  x: Tensor
outputs:
  y: sign(x)
gradients:
  x: grad * where(abs(x) < 1, 2 - 2 * abs(x), 0)
""",
    "binarize_hardtanh": """
inputs:
  x: Tensor
outputs:
  y: where(x >= 0, 1.0, -1.0) + 0 * x
gradients:
  x: grad * ((x >= -1) & (x <= 1))
""",
    "clamp_ste": """
inputs:
  x: Tensor
  lo: float = -1.0
  hi: float = 1.0
outputs:
  y: clamp(x, lo, hi)
gradients:
  x: grad
""",
    "spike_atan": """
inputs:
  v: Tensor
  threshold: float = 1.0
  alpha: float = 2.0
outputs:
  s: heaviside(v - threshold)
gradients:
  v: grad * alpha / 2 / (1 + (pi / 2 * alpha * (v - threshold))**2)
""",
    "spike_triangle": """
inputs:
  v: Tensor
  threshold: float = 1.0
  width: float = 0.5
outputs:
  s: heaviside(v - threshold)
gradients:
  v: grad * max(1 - abs(v - threshold) / width, 0) / width
""",
    "spike_sigmoid": """
inputs:
  v: Tensor
  k: float = 5.0
let:
  sg: sigmoid(k * v)
outputs:
  s: (v >= 0) * 1.0
gradients:
  v: grad * k * sg * (1 - sg)
""",
    "grl_scaled": """
inputs:
  x: Tensor
  w: Tensor
  lambd: float = 0.5
outputs:
  y: x * w
gradients:
  x: -lambd * grad * w
""",
    "clip_inside": """
inputs:
  x: Tensor
  w: Tensor
  c: float = 0.5
outputs:
  y: tanh(x) * w
gradients:
  x: clamp(grad * w * (1 - y**2 / w**2), -c, c)
tests:
  domain: {w: [0.5, 2]}
""",
    "detached_gate": """
inputs:
  x: Tensor
outputs:
  y: x * sigmoid(x)
gradients:
  x: grad * sigmoid(x)
""",
    "vq_straight_through": """
inputs:
  z: Tensor
  q: Tensor
outputs:
  y: z + (q - z)
gradients:
  z: grad
  q: 0 * grad
""",
    "gumbel_hard": """
inputs:
  logits: Tensor[..., C]
  tau: float = 1.0
let:
  p: softmax(logits / tau, dim=-1)
outputs:
  y: (logits >= amax(logits, dim=-1, keepdim=true)) * 1.0
gradients:
  logits: p * (grad - sum(grad * p, dim=-1, keepdim=true)) / tau
""",
    "lsq_quant": """
inputs:
  x: Tensor
  s: Tensor[]
  qn: float = -4.0
  qp: float = 3.0
let:
  v: x / s
  inside: (v >= qn) & (v <= qp)
outputs:
  y: round(clamp(v, qn, qp)) * s
gradients:
  x: grad * inside
  s: sum(grad * where(inside, round(v) - v, clamp(v, qn, qp)))
tests:
  domain: {s: [0.3, 1]}
""",
    # Two outputs, the gradient of `x` clamped as a whole: backward is given None for an unused output.
    "clip_two_outputs": """
inputs:
  x: Tensor
  w: Tensor
  c: float = 0.5
outputs:
  y: tanh(x) * w
  z: x * w
gradients:
  x: clamp(grad_y * w * (1 - tanh(x)**2) + grad_z * w, -c, c)
""",
    # A learnable threshold (a `Tensor[]`) with the fast-sigmoid surrogate, and the firing rate as a metric.
    "spike_learned_threshold": """
inputs:
  v: Tensor
  thr: Tensor[]
  k: float = 5.0
let:
  sg: 1 / (1 + k * abs(v - thr))**2
outputs:
  s: heaviside(v - thr)
  rate: {formula: mean(heaviside(v - thr)), differentiable: false}
gradients:
  v: grad_s * sg
  thr: -sum(grad_s * sg)
""",
    # The threshold's gradient scaled down by a number outside the sum: still linear in the gradient.
    "spike_slow_threshold": """
inputs:
  v: Tensor
  thr: Tensor[]
  k: float = 5.0
let:
  sg: 1 / (1 + k * abs(v - thr))**2
outputs:
  s: heaviside(v - thr)
gradients:
  v: grad * sg
  thr: -sum(grad * sg) / k
""",
    "bce_with_accuracy": """
inputs:
  z: Tensor
  t: Tensor
outputs:
  loss: mean(softplus(z) - t * z)
  acc: {formula: mean(((z > 0) == (t > 0.5)) * 1.0), differentiable: false}
tests:
  domain: {t: [0, 1]}
""",
    "max_with_mask": """
inputs:
  x: Tensor[..., D]
let:
  m: amax(x, dim=-1, keepdim=true)
outputs:
  y: sum(x * (x >= m), dim=-1)
  mask: {formula: x >= m, differentiable: false}
""",
    "relu_with_mask": """
inputs:
  x: Tensor
outputs:
  y: relu(x)
  active: {formula: x > 0, differentiable: false}
""",
    "softmax_stats": """
inputs:
  x: Tensor[..., C]
let:
  logp: log_softmax(x, dim=-1)
  p: exp(logp)
outputs:
  entropy: -sum(p * logp, dim=-1)
  confidence: amax(p, dim=-1)
  probs: p
""",
    "gauss_nll_and_mse": """
inputs:
  mu: Tensor
  logvar: Tensor
  x: Tensor
let:
  d2: (x - mu)**2
outputs:
  nll: 0.5 * (logvar + d2 * exp(-logvar))
  mse: {formula: d2, differentiable: false}
""",
    "prelu_channels": """
inputs:
  x: Tensor
  a: Tensor
outputs:
  y: where(x >= 0, x, a * x)
module:
  name: PReLUChannels
  args:
    num_parameters: int = 1
    init: float = 0.25
  parameters:
    a: {shape: [num_parameters], init: constant(init)}
""",
    "snake_beta": """
inputs:
  x: Tensor
  log_alpha: Tensor
  log_beta: Tensor
outputs:
  y: x + sin(x * exp(log_alpha))**2 / (exp(log_beta) + 1e-9)
module:
  name: SnakeBeta
  args:
    in_features: int
    alpha: float = 1.0
  parameters:
    log_alpha: {shape: [in_features], init: constant(log(alpha))}
    log_beta: {shape: [in_features], init: constant(log(alpha))}
""",
    "relu_pow": """
inputs:
  x: Tensor
  p: int = 2
outputs:
  y: relu(x)**p
""",
    "hinge": """
inputs:
  y: Tensor
  t: Tensor
  margin: float = 1.0
  squared: bool = true
let:
  h: relu(margin - y * t)
outputs:
  loss: where(squared, h**2, h)
tests:
  domain: {t: [-1, 1]}
""",
    "temperature_scale": """
inputs:
  logits: Tensor[..., C]
  T: Tensor[]
outputs:
  logp: log_softmax(logits / T, dim=-1)
module:
  name: TemperatureScaling
  parameters:
    T: {shape: [], init: constant(1.5)}
tests:
  domain: {T: [0.5, 2]}
""",
    "gem_pool": """
inputs:
  x: Tensor[..., D]
  p: Tensor[]
  eps: float = 1e-6
outputs:
  y: mean(clamp(x, min=eps)**p, dim=-1)**(1 / p)
module:
  name: GeM
  args:
    p: float = 3.0
    eps: float = 1e-6
  parameters:
    p: {shape: [], init: constant(p)}
tests:
  domain: {x: [0.1, 3], p: [1, 4]}
""",
    "log1mexp": """
inputs:
  x: Tensor
outputs:
  y: log(1 - exp(-x))
tests:
  domain: {x: [0.01, 20]}
""",
    "softplus_threshold": """
inputs:
  x: Tensor
  beta: float = 2.0
  threshold: float = 20.0
outputs:
  y: where(beta * x > threshold, x, log(1 + exp(beta * x)) / beta)
""",
    # PyTorch's parameters of activations, as F.* takes them (they were refused: "takes no keyword arguments").
    "softplus_torch_style": """
inputs:
  x: Tensor
  beta: float = 2.0
  threshold: float = 20.0
outputs:
  y: softplus(x, beta=beta, threshold=threshold)
""",
    "leaky_elu": """
inputs:
  x: Tensor
  slope: float = 0.1
  alpha: float = 0.5
outputs:
  y: leaky_relu(x, slope) + elu(x, alpha=alpha) + celu(x, alpha) + hardtanh(x, -alpha, 2 * alpha)
""",
    "logit_eps": """
inputs:
  p: Tensor
  eps: float = 1e-6
let:
  z: clamp(p, eps, 1 - eps)
outputs:
  y: log(z / (1 - z))
tests:
  domain: {p: [0.01, 0.99]}
""",
    "barron_loss": """
inputs:
  x: Tensor
  alpha: Tensor
  c: float = 1.0
let:
  b: abs(alpha - 2)
outputs:
  loss: b / alpha * (((x / c)**2 / b + 1)**(alpha / 2) - 1)
tests:
  domain: {alpha: [0.2, 1.8]}
""",
    "student_t_nll": """
inputs:
  x: Tensor
  mu: Tensor
  log_sigma: Tensor
  nu: float = 4.0
let:
  z: (x - mu) / exp(log_sigma)
outputs:
  nll: (nu + 1) / 2 * log(1 + z**2 / nu) + log_sigma + 0.5 * log(nu * pi) + lgamma(nu / 2) - lgamma((nu + 1) / 2)
""",
    "focal_optional_alpha": """
inputs:
  z: Tensor
  t: Tensor
  alpha: float = 0.25
  gamma: float = 2.0
let:
  p: sigmoid(z)
  ce: log(1 + exp(-abs(z))) + max(z, 0) - z * t
  p_t: p * t + (1 - p) * (1 - t)
  w: where(alpha >= 0, alpha * t + (1 - alpha) * (1 - t), 1)
outputs:
  loss: w * ce * (1 - p_t)**gamma
tests:
  domain: {t: [0, 1]}
""",
    "poly1_ce": """
inputs:
  logits: Tensor[..., C]
  target: Tensor[..., C]
  epsilon: float = 1.0
let:
  ce: -sum(target * log_softmax(logits, dim=-1), dim=-1)
  pt: sum(target * softmax(logits, dim=-1), dim=-1)
outputs:
  loss: ce + epsilon * (1 - pt)
tests:
  domain: {target: [0, 1]}
""",
    "charbonnier": """
inputs:
  x: Tensor
  y: Tensor
  eps: float = 1e-3
outputs:
  loss: mean(sqrt((x - y)**2 + eps**2))
""",
    "cauchy_loss": """
inputs:
  x: Tensor
  y: Tensor
  c: float = 1.0
outputs:
  loss: c**2 / 2 * log(1 + ((x - y) / c)**2)
""",
    "dpo_loss": """
inputs:
  pc: Tensor
  pr: Tensor
  rc: Tensor
  rr: Tensor
  beta: float = 0.1
outputs:
  loss: -logsigmoid(beta * ((pc - rc) - (pr - rr)))
""",
    "poisson_nll": """
inputs:
  x: Tensor
  t: Tensor
  log_input: bool = true
  eps: float = 1e-8
outputs:
  loss: where(log_input, exp(x) - t * x, x - t * log(x + eps))
tests:
  domain: {x: [0.1, 3], t: [0, 4]}
""",
    "tweedie_nll": """
inputs:
  x: Tensor
  t: Tensor
  rho: float = 1.5
outputs:
  loss: -t * exp(x * (1 - rho)) / (1 - rho) + exp(x * (2 - rho)) / (2 - rho)
tests:
  domain: {t: [0, 4]}
""",
    "gelu_sigmoid": """
inputs:
  x: Tensor
outputs:
  y: x * sigmoid(1.5957691216057308 * (x + 0.044715 * x**3))
""",
    "swish_learnable": """
inputs:
  x: Tensor
  beta: Tensor[]
outputs:
  y: x / (1 + exp(-beta * x))
module:
  name: SwishBeta
  parameters:
    beta: {shape: [], init: ones}
tests:
  domain: {beta: [0.5, 2]}
""",
    "squared_hinge": """
inputs:
  y: Tensor
  t: Tensor
outputs:
  loss: mean(max(0, 1 - y * t)**2)
tests:
  domain: {t: [-1, 1]}
""",
    "celu_alpha": """
inputs:
  x: Tensor
  alpha: float = 1.5
outputs:
  y: max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
""",
    "selu_written": """
inputs:
  x: Tensor
outputs:
  y: 1.0507009873554805 * where(x > 0, x, 1.6732632423543772 * (exp(x) - 1))
""",
    "mish_log1p": """
inputs:
  x: Tensor
outputs:
  y: x * tanh(log1p(exp(x)))
""",
    "snake_fixed": """
inputs:
  x: Tensor
  a: float = 0.5
outputs:
  y: x + sin(a * x)**2 / a
""",
}


def _through(value, surrogate):
    """`value` forward, the gradient (first and second) of `surrogate` backward: plain autograd of an
    override `grad * h` is the surrogate whose derivative is `h`."""
    return value.detach() + surrogate - surrogate.detach()


def _triangle(v, threshold, width):
    u = ((v - threshold) / width).clamp(-1, 1)
    return u - u * u.abs() / 2


def _bireal(x):
    return torch.where(x.abs() < 1, 2 * x - x * x.abs(), torch.sign(x))


def _lsq(x, s, qn, qp):
    v = (x / s).clamp(qn, qp)
    return ((v.round() - v).detach() + v) * s


def _log1mexp(x):
    """log(1 - exp(-x)) to float64's digits: `1 - exp(-x)` cancels near 0, `expm1(-x)` rounds to -1 past 37."""
    return torch.where(x < math.log(2), torch.log(-torch.expm1(-x)), torch.log1p(-torch.exp(-x)))


def _gumbel_hard(z, tau):
    p = torch.softmax(z / tau, -1)
    return _through((z >= z.amax(-1, keepdim=True)).to(z.dtype), p)


def _softmax_stats(x):
    p = torch.softmax(x, -1)
    return -(p * torch.log_softmax(x, -1)).sum(-1), p.amax(-1), p


def _barron(x, alpha, c):
    b = (alpha - 2).abs()  # as robust_loss_pytorch computes it: `u**a - 1` cancels even in float64 at a = 1e-6
    return (b / alpha * torch.expm1(alpha / 2 * torch.log1p((x / c) ** 2 / b)),)


def _student_t(x, mu, log_sigma, nu):
    return (-torch.distributions.StudentT(nu, mu, log_sigma.exp()).log_prob(x),)


def _focal(z, t, alpha, gamma):
    p = torch.sigmoid(z)
    ce = torch.log1p(torch.exp(-z.abs())) + F.relu(z) - z * t  # as written: its slope at z = 0 is -t
    loss = ce * (1 - (p * t + (1 - p) * (1 - t))) ** gamma
    return (loss * (alpha * t + (1 - alpha) * (1 - t)) if alpha >= 0 else loss,)


def _poly1(z, t, eps):
    return (-(t * torch.log_softmax(z, -1)).sum(-1) + eps * (1 - (t * torch.softmax(z, -1)).sum(-1)),)


def _tweedie(x, t, rho):
    return (-t * torch.exp(x * (1 - rho)) / (1 - rho) + torch.exp(x * (2 - rho)) / (2 - rho),)


# Each reference takes the op's arguments and returns its outputs as a tuple. An override `grad * h`
# is checked as plain autograd of a surrogate whose derivative is `h`, second derivatives included.
REFERENCE = {
    "round_ste_scaled": lambda x, s: (_through(torch.round(x * s) / s, x),),
    "bireal_sign": lambda x: (_through(torch.sign(x), _bireal(x)),),
    "binarize_hardtanh": lambda x: (_through(torch.where(x >= 0, 1.0, -1.0).to(x.dtype), x.clamp(-1, 1)),),
    "clamp_ste": lambda x, lo, hi: (_through(x.clamp(lo, hi), x),),
    "spike_atan": lambda v, th, a: (_through((v >= th).to(v.dtype), torch.atan(math.pi / 2 * a * (v - th)) / math.pi),),
    "spike_triangle": lambda v, th, w: (_through((v >= th).to(v.dtype), _triangle(v, th, w)),),
    "spike_sigmoid": lambda v, k: (_through((v >= 0).to(v.dtype), torch.sigmoid(k * v)),),
    "detached_gate": lambda x: (_through(F.silu(x), F.softplus(x)),),
    "spike_learned_threshold": lambda v, thr, k: (
        _through((v >= thr).to(v.dtype), (v - thr) / (1 + k * (v - thr).abs())),
        (v >= thr).to(v.dtype).mean(),
    ),
    "vq_straight_through": lambda z, q: (z + (q - z).detach(),),
    "gumbel_hard": lambda z, tau: (_gumbel_hard(z, tau),),
    "lsq_quant": lambda x, s, qn, qp: (_lsq(x, s, qn, qp),),
    "bce_with_accuracy": lambda z, t: (
        F.binary_cross_entropy_with_logits(z, t),
        ((z > 0) == (t > 0.5)).to(z.dtype).mean(),
    ),
    # A condition returned as an output is 1 where it holds and 0 elsewhere, in the inputs' dtype.
    "max_with_mask": lambda x: (x.amax(-1), (x >= x.amax(-1, keepdim=True)).to(x.dtype)),
    "relu_with_mask": lambda x: (F.relu(x), (x > 0).to(x.dtype)),
    "softmax_stats": _softmax_stats,
    "gauss_nll_and_mse": lambda mu, lv, x: (
        F.gaussian_nll_loss(mu, x, lv.exp(), reduction="none", eps=1e-12),
        ((x - mu) ** 2).detach(),
    ),
    "prelu_channels": lambda x, a: (torch.where(x >= 0, x, a * x),),
    "snake_beta": lambda x, la, lb: (x + torch.sin(x * la.exp()) ** 2 / (lb.exp() + 1e-9),),
    "relu_pow": lambda x, p: (F.relu(x) ** p,),
    "hinge": lambda y, t, m, sq: (F.relu(m - y * t) ** (2 if sq else 1),),
    "temperature_scale": lambda z, T: (torch.log_softmax(z / T, -1),),
    "gem_pool": lambda x, p, eps: (x.clamp(min=eps).pow(p).mean(-1).pow(1 / p),),
    "log1mexp": lambda x: (_log1mexp(x),),
    "softplus_threshold": lambda x, beta, th: (F.softplus(x, beta, th),),
    "logit_eps": lambda p, eps: (torch.logit(p, eps),),
    "softplus_torch_style": lambda x, beta, th: (F.softplus(x, beta, th),),
    "leaky_elu": lambda x, s, a: (F.leaky_relu(x, s) + F.elu(x, a) + F.celu(x, a) + F.hardtanh(x, -a, 2 * a),),
    "barron_loss": _barron,
    "student_t_nll": _student_t,
    "focal_optional_alpha": _focal,
    "poly1_ce": _poly1,
    "charbonnier": lambda x, y, eps: (torch.sqrt((x - y) ** 2 + eps**2).mean(),),
    "cauchy_loss": lambda x, y, c: (c**2 / 2 * torch.log1p(((x - y) / c) ** 2),),
    "dpo_loss": lambda pc, pr, rc, rr, beta: (-F.logsigmoid(beta * ((pc - rc) - (pr - rr))),),
    "poisson_nll": lambda x, t, log_input, eps: (
        F.poisson_nll_loss(x, t, log_input=log_input, eps=eps, reduction="none"),
    ),
    "tweedie_nll": _tweedie,
    "gelu_sigmoid": lambda x: (F.gelu(x, approximate="tanh"),),
    "swish_learnable": lambda x, beta: (x * torch.sigmoid(beta * x),),
    "squared_hinge": lambda y, t: (F.relu(1 - y * t).pow(2).mean(),),
    # Two kinks at 0 that each give the tie to the number (slope 0 at 0), unlike F.celu's slope 1.
    # PyTorch's celu: slope 1 at the join (Note [branches that join] in opgen/optimize/rewrite.py)
    "celu_alpha": lambda x, alpha: (F.celu(x, alpha),),
    "selu_written": lambda x: (F.selu(x),),
    "mish_log1p": lambda x: (F.mish(x),),
    "snake_fixed": lambda x, a: (x + torch.sin(a * x) ** 2 / a,),
}

# Overrides that are no function's gradient (the gradient of `x` reads `w`, that of `w` does not read
# the gradient of `x`): backward is compared with the override formula, first order only. Each entry:
# the outputs, and the gradients of `x` and `w` given the outputs' incoming gradients.
FIRST_ORDER = {
    "grl_scaled": (lambda x, w, lambd: (x * w,), lambda gs, x, w, lambd: (-lambd * gs[0] * w, gs[0] * x)),
    "clip_inside": (
        lambda x, w, c: (torch.tanh(x) * w,),
        lambda gs, x, w, c: ((gs[0] * w * (1 - torch.tanh(x) ** 2)).clamp(-c, c), gs[0] * torch.tanh(x)),
    ),
    "clip_two_outputs": (
        lambda x, w, c: (torch.tanh(x) * w, x * w),
        lambda gs, x, w, c: (
            (gs[0] * w * (1 - torch.tanh(x) ** 2) + gs[1] * w).clamp(-c, c),
            gs[0] * torch.tanh(x) + gs[1] * x,
        ),
    ),
}

# Overrides linear in the incoming gradient through a reduction: forward mode is refused (it would need
# the override's transpose), reverse mode is checked.
REVERSE_ONLY = {"gumbel_hard"}

BATCHED = {"max_with_mask", "softmax_stats", "temperature_scale", "gem_pool", "gumbel_hard", "poly1_ce"}


def _t(*values):
    return torch.tensor(values, dtype=torch.float32)


WIDE = (-1e4, -100.0, -10.0, -1.0, 0.0, 1.0, 10.0, 100.0, 1e4)

# Float32 inputs at which the formulas as written overflow or cancel (the reference is finite).
EXTREME = {
    "log1mexp": lambda: (_t(1e-6, 1e-3, 0.1, 0.7, 5.0, 20.0, 100.0, 1e4),),
    "softplus_threshold": lambda: (_t(*WIDE), 2.0, 20.0),
    "softplus_torch_style": lambda: (_t(*WIDE), 2.0, 20.0),
    "leaky_elu": lambda: (_t(*WIDE), 0.1, 0.5),
    # 1 - eps is rounded in float32 (torch.logit's own float32 value at p = 1 is off by 1e-3 for eps 1e-6).
    "logit_eps": lambda: (_t(0.0, 1e-8, 1e-3, 0.5, 0.999, 1.0), 1e-4),
    "barron_loss": lambda: (_t(*WIDE), torch.full((9,), 1.0), 1.0),
    "student_t_nll": lambda: (_t(*WIDE), torch.zeros(9), _t(-3.0, 0.0, 1.0, 2.0, 0.0, -2.0, 3.0, 0.0, 5.0), 4.0),
    "focal_optional_alpha": lambda: (_t(*WIDE), _t(1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0), 0.25, 2.0),
    "poly1_ce": lambda: (_t([1e4, -1e4, 0.0], [100.0, 100.0, -100.0]), _t([0.2, 0.3, 0.5], [1.0, 0.0, 0.0]), 1.0),
    "charbonnier": lambda: (_t(*WIDE), torch.zeros(9), 1e-3),
    "cauchy_loss": lambda: (_t(*WIDE), torch.zeros(9), 1.0),
    "dpo_loss": lambda: (_t(*WIDE), torch.zeros(9), torch.zeros(9), _t(*WIDE).flip(0), 0.1),
    "poisson_nll": lambda: (_t(-100.0, -10.0, 0.0, 10.0, 50.0), _t(0.0, 1.0, 2.0, 3.0, 0.0), True, 1e-8),
    "tweedie_nll": lambda: (_t(-100.0, -10.0, 0.0, 10.0, 100.0), _t(1.0, 0.0, 2.0, 3.0, 0.0), 1.5),
    "gelu_sigmoid": lambda: (_t(*WIDE),),
    "swish_learnable": lambda: (_t(*WIDE), torch.tensor(1.0)),
    "squared_hinge": lambda: (_t(*WIDE), _t(1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0)),
    "celu_alpha": lambda: (_t(*WIDE), 1.5),
    "selu_written": lambda: (_t(*WIDE),),
    "mish_log1p": lambda: (_t(*WIDE),),
    "snake_fixed": lambda: (_t(*WIDE), 0.5),
    "gauss_nll_and_mse": lambda: (torch.zeros(5), _t(-10.0, -1.0, 0.0, 10.0, 30.0), _t(1e4, 100.0, -100.0, 1e4, 10.0)),
    "softmax_stats": lambda: (_t([1e4, -1e4, 0.0], [100.0, 100.0, -100.0]),),
    "temperature_scale": lambda: (_t([1e4, -1e4, 0.0], [100.0, 100.0, -100.0]), torch.tensor(0.5)),
    "relu_pow": lambda: (_t(*WIDE), 2),
    "hinge": lambda: (_t(*WIDE), _t(1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0), 1.0, True),
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return user_ops.generate(tmp_path_factory.mktemp("round5"), "round5_ops", SPECS)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_float64_against_plain_torch(ops, name):
    op, args, tensors = user_ops.case(ops, name, batched=name in BATCHED)
    mine, theirs = user_ops.of(op, args, tensors), user_ops.of(REFERENCE[name], args, tensors)
    primals = tuple(args[k] for k in tensors)
    user_ops.check_float64(mine, theirs, primals, hessian=True, forward_mode=name not in REVERSE_ONLY)
    batch = tuple(torch.stack([args[k], 2 * args[k]]) for k in tensors)
    for got, want in zip(torch.func.vmap(mine)(*batch), theirs(*(b[1] for b in batch)), strict=True):
        torch.testing.assert_close(got[1], want)


@pytest.mark.parametrize("name", sorted(FIRST_ORDER))
def test_overrides_that_are_no_gradient(ops, name):
    op, args, tensors = user_ops.case(ops, name)
    forward, override = FIRST_ORDER[name]
    x, w, *rest = args
    xs = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    outs = user_ops.of(op, args, tensors)(*xs)
    for got, want in zip(outs, forward(*args), strict=True):
        torch.testing.assert_close(got, want)
    grads = [torch.rand_like(o) for o in outs]
    for got, want in zip(torch.autograd.grad(outs, xs, grads, retain_graph=True), override(grads, *args), strict=True):
        torch.testing.assert_close(got, want)
    assert torch.autograd.gradgradcheck(lambda *ts: user_ops.of(op, args, tensors)(*ts), xs)
    # An output left out of the loss: backward is given None for it (its gradient taken as 0).
    zero = [torch.zeros_like(o) for o in outs[:-1]] + grads[-1:]
    for got, want in zip(torch.autograd.grad(outs[-1], xs, grads[-1]), override(zero, *args), strict=True):
        torch.testing.assert_close(got, want)
    # Forward mode along `w` alone: jvp refuses only the tangent of `x`, and `x` has none.
    tangents = torch.func.jvp(lambda w: user_ops.of(op, args, tensors)(x, w), (w,), (torch.ones_like(w),))[1]
    for got, want in zip(tangents, forward(x, torch.ones_like(w), *rest), strict=True):
        torch.testing.assert_close(got, want)

    def along_x():
        return torch.func.jvp(lambda x: user_ops.of(op, args, tensors)(x, w), (x,), (torch.ones_like(x),))[1]

    if name == "grl_scaled":  # linear in the gradient: the tangent is the override's factor
        torch.testing.assert_close(along_x()[0], -rest[0] * w)
        return
    with pytest.raises(NotImplementedError, match="forward-mode AD along 'x' is not available"):
        along_x()


@pytest.mark.parametrize("name", sorted(EXTREME))
def test_float32_at_extreme_inputs(ops, name):
    user_ops.check_float32(getattr(ops, name), REFERENCE[name], list(EXTREME[name]()))


def test_log1mexp_keeps_its_digits_in_float32(ops):
    """`log(1 - exp(-x))` is Mächler's two-sided form: `1 - exp(-x)` cancels near 0 and rounds to 1 past 17."""
    x = torch.tensor([1e-6, 1e-3, 0.5, 0.69, 0.7, 5.0, 18.9, 30.0, 80.0], requires_grad=True)
    y = ops.log1mexp(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    exact = x.detach().double()
    want = _log1mexp(exact)
    torch.testing.assert_close(y.double(), want, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad.double(), 1 / torch.expm1(exact), rtol=1e-6, atol=0)


def test_barron_loss_keeps_its_digits_near_alpha_zero(ops):
    """`u**(a/2) - 1` is `expm1(a/2 * log1p(x**2/|a-2|))` (Note [powers less one]): float32 keeps the value's
    digits at a = 1e-6, where the power is 1 + 5e-7 * log(u), and at a = 1e4, where `u` rounds."""
    x = torch.tensor([1e-3, 0.5, 3.0, 100.0, 1e4, 0.03], requires_grad=True)
    alpha = torch.tensor([1e-6, 1e-6, -1e-6, 1e-6, 1e-6, 1e4])
    y = ops.barron_loss(x, alpha)
    (grad,) = torch.autograd.grad(y.sum(), x)
    x64 = x.detach().double().requires_grad_()
    want = _barron(x64, alpha.double(), 1.0)[0]
    (want_grad,) = torch.autograd.grad(want.sum(), x64)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=0)
    torch.testing.assert_close(grad.double(), want_grad, rtol=1e-5, atol=0)


def test_modules_start_from_their_args_and_train_their_parameters(ops):
    x = torch.randn(5, 4, dtype=torch.float64)
    prelu = ops.PReLUChannels(4, init=0.1)
    assert torch.equal(prelu.a, torch.full((4,), 0.1)) and "num_parameters=4, init=0.1" in repr(prelu)
    prelu = prelu.double()
    one = ops.PReLUChannels().double()  # nn.PReLU's defaults: one slope of 0.25
    torch.testing.assert_close(one(x), F.prelu(x, one.a))
    snake = ops.SnakeBeta(4, alpha=0.5).double()
    torch.testing.assert_close(snake.log_alpha, torch.full((4,), math.log(0.5), dtype=torch.float64))
    torch.testing.assert_close(snake(x), REFERENCE["snake_beta"](x, snake.log_alpha, snake.log_beta)[0])
    gem = ops.GeM(p=2.5).double()
    assert gem.p.shape == () and gem.p.item() == 2.5 and "2.5" in repr(gem)
    pos = x.abs() + 0.1
    torch.testing.assert_close(gem(pos), pos.pow(2.5).mean(-1).pow(1 / 2.5))
    temperature = ops.TemperatureScaling().double()
    swish = ops.SwishBeta().double()
    for module, reference in (
        (prelu, lambda m: REFERENCE["prelu_channels"](x, m.a)[0]),
        (snake, lambda m: REFERENCE["snake_beta"](x, m.log_alpha, m.log_beta)[0]),
        (gem, lambda m: REFERENCE["gem_pool"](pos, m.p, 1e-6)[0]),
        (temperature, lambda m: REFERENCE["temperature_scale"](x, m.T)[0]),
        (swish, lambda m: REFERENCE["swish_learnable"](x, m.beta)[0]),
    ):
        params = list(module.parameters())
        out = module(pos if module is gem else x)
        got = torch.autograd.grad(out.square().sum(), params)
        want = torch.autograd.grad(reference(module).square().sum(), params)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("log_input", [True, False])
def test_poisson_nll_both_ways(ops, log_input):
    """`where(log_input, ...)` on a bool input: each value picks one formula, as F.poisson_nll_loss's flag."""
    x = torch.rand(3, 4, dtype=torch.float64) * 3 + 0.1
    t = torch.rand(3, 4, dtype=torch.float64) * 4
    xs = (x.requires_grad_(), t.requires_grad_())
    got = ops.poisson_nll(*xs, log_input)
    want = F.poisson_nll_loss(*xs, log_input=log_input, eps=1e-8, reduction="none")
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), xs), torch.autograd.grad(want.sum(), xs))
    assert torch.autograd.gradgradcheck(lambda a, b: ops.poisson_nll(a, b, log_input), xs)


def test_forward_and_reverse_mode_agree_on_a_scaled_sum_override(ops):
    """`thr: -sum(grad * sg) / k` of a `Tensor[]` input is `-grad * sg / k` summed to its shape: forward mode
    along `thr` works (it was refused as not linear in the gradient), and jvp and vjp are transposes."""
    forward, (v, thr) = user_ops.jacobians_both_ways(ops, "spike_slow_threshold")
    torch.testing.assert_close(forward[0][1], -((1 + 5.0 * (v - thr).abs()) ** -2) / 5.0)
