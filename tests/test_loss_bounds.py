"""huber and smooth_l1 with a bound the kernels refuse (F.huber_loss: delta <= 0; F.smooth_l1_loss: beta < 0)
compute the formula as written, its linear branch, as a Tensor bound always did: the kernel's RuntimeError
escaped from the lowered forward, and the jvp's F.hardtanh(d, -delta, delta) refused delta < 0 too
(Note [parameters of lowered primitives] in opgen/optimize/lower.py)."""

from __future__ import annotations

import pytest
import torch
from spec_ops import build_ops

import generated


def huber_formula(x, t, delta):
    d = x - t
    return torch.where(d.abs() < delta, 0.5 * d**2, delta * (d.abs() - 0.5 * delta))


def smooth_l1_formula(x, t, beta):
    d = x - t
    return torch.where(d.abs() < beta, 0.5 * d**2 / beta, d.abs() - 0.5 * beta)


OPS = {"huber": (generated.huber, huber_formula), "smooth_l1": (generated.smooth_l1, smooth_l1_formula)}
BOUNDS = [-1.5, 0.0, 0.7]


def _samples():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, dtype=torch.float64, generator=gen).requires_grad_()
    t = torch.randn(6, dtype=torch.float64, generator=gen).requires_grad_()
    return x, t


@pytest.mark.parametrize("bound", BOUNDS)
@pytest.mark.parametrize("name", sorted(OPS))
def test_a_float_bound_the_kernel_refuses_follows_the_formula(name, bound):
    op, formula = OPS[name]
    x, t = _samples()
    if name == "smooth_l1" and bound == 0.0:
        want = (x - t).abs()  # the formula divides 0 by 0 inside, where `where` does not take it
    else:
        want = formula(x, t, bound)
    got = op(x, t, bound)
    torch.testing.assert_close(got, want)
    seed = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(got, (x, t), seed), torch.autograd.grad(want, (x, t), seed))
    tangents = (torch.randn_like(x), torch.randn_like(t))
    _, got_jvp = torch.func.jvp(lambda a, b: op(a, b, bound), (x.detach(), t.detach()), tangents)
    _, want_jvp = torch.func.jvp(lambda a, b: formula(a, b, bound), (x.detach(), t.detach()), tangents)
    if name == "smooth_l1" and bound == 0.0:
        want_jvp = torch.sign(x - t).detach() * (tangents[0] - tangents[1])
    torch.testing.assert_close(got_jvp, want_jvp)
    assert torch.autograd.gradgradcheck(lambda a, b: op(a, b, bound), (x, t))


@pytest.mark.parametrize("bound", BOUNDS)
def test_a_tensor_bound_follows_the_formula(tmp_path, bound):
    spec = """
        name: huber_t
        inputs:
          input: Tensor
          target: Tensor
          delta: Tensor
        let:
          diff: input - target
        outputs:
          loss: where(abs(diff) < delta, 0.5 * diff**2, delta * (abs(diff) - 0.5 * delta))
    """
    ops = build_ops(tmp_path, "huber_tensor_bound", {"huber_t": spec})
    x, t = _samples()
    delta = torch.tensor(bound, dtype=torch.float64, requires_grad=True)
    got, want = ops.huber_t(x, t, delta), huber_formula(x, t, delta)
    torch.testing.assert_close(got, want)
    seed = torch.randn_like(want)
    grads = [torch.autograd.grad(y, (x, t, delta), seed) for y in (got, want)]
    torch.testing.assert_close(*grads)
