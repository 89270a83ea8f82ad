"""Losses of an input and a target: backward makes no more full-size tensors than plain autograd of the
same formula (Note [spread gradients] in opgen/optimize/spread.py, Note [gradients that negate
another] in opgen/plan/backward.py), and its values, gradients and second derivatives are plain
autograd's, in float64, broadcasting included and with either input alone requiring a gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import import_package
from full_size import FullSize

from opgen.cli import main

LOSSES = {
    # name: (formula, the same in PyTorch's ops)
    "mse_mean": ("mean((input - target)**2)", lambda x, t: ((x - t) ** 2).mean()),
    "bce_mean": ("mean(softplus(input) - input * target)", lambda x, t: (F.softplus(x) - x * t).mean()),
    "abs_sum": ("sum(abs(input - target))", lambda x, t: (x - t).abs().sum()),
    "sq_each": ("(input - target)**2 / 2", lambda x, t: (x - t) ** 2 / 2),
    "huber_each": (
        "where(abs(input - target) < 1, 0.5 * (input - target)**2, abs(input - target) - 0.5)",
        lambda x, t: torch.where((x - t).abs() < 1, 0.5 * (x - t) ** 2, (x - t).abs() - 0.5),
    ),
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    root = tmp_path_factory.mktemp("loss_passes")
    (root / "specs").mkdir()
    for name, (formula, _) in LOSSES.items():
        text = f"name: {name}\ninputs:\n  input: Tensor\n  target: Tensor\noutputs:\n  loss: {formula}\n"
        (root / "specs" / f"{name}.yaml").write_text(text, encoding="utf-8")
    assert main(["generate", str(root / "specs"), "-o", str(root / "loss_ops"), "--no-cache"]) == 0
    return import_package(root, "loss_ops")


def _backward_passes(function, x: torch.Tensor, t: torch.Tensor) -> int:
    y = function(x, t)
    g = torch.ones_like(y)
    with FullSize(torch.broadcast_shapes(x.shape, t.shape).numel()) as mode:
        torch.autograd.grad(y, [x, t], g)
    return mode.count


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("shapes", [((6, 5), (6, 5)), ((6, 5), (5,)), ((1, 5), (4, 1))])
def test_loss_backward_is_plain_autograds_with_no_more_passes(ops, name, shapes):
    op, plain = getattr(ops, name), LOSSES[name][1]
    torch.manual_seed(0)
    x = torch.randn(shapes[0], dtype=torch.float64, requires_grad=True)
    t = torch.randn(shapes[1], dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(op(x, t), plain(x, t))
    y, want = op(x, t), plain(x, t)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, t], g, create_graph=True)
    expected = torch.autograd.grad(want, [x, t], g, create_graph=True)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)
        assert a.shape == b.shape
    second = torch.autograd.grad(sum((a * a).sum() for a in got), [x, t])
    torch.testing.assert_close(second, torch.autograd.grad(sum((b * b).sum() for b in expected), [x, t]))
    for needs in ((True, False), (False, True)):
        xs, ts = x.detach().requires_grad_(needs[0]), t.detach().requires_grad_(needs[1])
        leaf = xs if needs[0] else ts
        (one,) = torch.autograd.grad(op(xs, ts), [leaf], g)
        torch.testing.assert_close(one, torch.autograd.grad(plain(xs, ts), [leaf], g)[0])
    assert _backward_passes(op, x, t) <= _backward_passes(plain, x, t)


def test_a_whole_mean_spreads_its_gradient_without_a_full_size_copy(ops):
    """`mean((input - target)**2)`: the incoming scalar is divided by the count before it meets the
    difference (it was expanded to the inputs' shape, then divided: a full-size copy), and the target's
    gradient is the negated product (it was the product computed twice), and the 2 of `2*x - 2*t` is
    taken out of the sum: two passes fewer than plain autograd of the formula (one more than it
    before), and the values PyTorch's own mse_loss gives."""
    x = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
    t = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
    assert _backward_passes(ops.mse_mean, x, t) <= _backward_passes(LOSSES["mse_mean"][1], x, t) - 2
    assert _backward_passes(ops.huber_each, x, t) < _backward_passes(LOSSES["huber_each"][1], x, t)
    g = torch.tensor(0.75, dtype=torch.float64)
    got = torch.autograd.grad(ops.mse_mean(x, t), [x, t], g)
    torch.testing.assert_close(got, torch.autograd.grad(F.mse_loss(x, t), [x, t], g))
    got = torch.autograd.grad(ops.huber_each(x, t), [x, t], torch.ones(64, 32, dtype=torch.float64))
    want = torch.autograd.grad(F.huber_loss(x, t, reduction="none").sum(), [x, t])
    torch.testing.assert_close(got, want)


def test_huber_and_smooth_l1_backward_make_no_more_passes_than_pytorchs(ops):
    """Huber of `input - target` (Note [losses of a difference]): one backward kernel on the input and the
    target for both gradients, negated once for the target's: as many full-size passes as F.huber_loss."""
    x = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
    t = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
    native = _backward_passes(lambda x, t: F.huber_loss(x, t, reduction="none"), x, t)
    assert _backward_passes(ops.huber_each, x, t) <= native


@pytest.fixture(scope="module")
def kinks(tmp_path_factory):
    root = tmp_path_factory.mktemp("loss_kinks")
    (root / "specs").mkdir()
    specs = {
        "huber_alone": "inputs:\n  x: Tensor\n  delta: float = 1.0\noutputs:\n"
        "  y: where(abs(x) < delta, 0.5 * x**2, delta * (abs(x) - 0.5 * delta))\n",
        "smooth_pair": "inputs:\n  input: Tensor\n  target: Tensor\n  beta: float = 1.0\noutputs:\n"
        "  loss: where(abs(input - target) < beta, 0.5 * (input - target)**2 / beta,"
        " abs(input - target) - 0.5 * beta)\n",
    }
    for name, text in specs.items():
        (root / "specs" / f"{name}.yaml").write_text(f"name: {name}\n{text}", encoding="utf-8")
    assert main(["generate", str(root / "specs"), "-o", str(root / "kink_ops"), "--no-cache"]) == 0
    return import_package(root, "kink_ops")


def test_huber_of_one_input_has_every_derivative_torch_func_takes(kinks):
    """PyTorch's `huber_loss_backward` has no forward-mode derivative: jacfwd of the gradient (and the
    hessian) take the formula, and agree with reverse over reverse and with F.huber_loss's own."""
    x = torch.tensor([-2.0, -0.7, -0.3, 0.0, 0.3, 0.7, 2.0], dtype=torch.float64)

    def loss(v: torch.Tensor) -> torch.Tensor:
        return kinks.huber_alone(v, 0.5).sum()

    forward_over_reverse = torch.func.jacfwd(torch.func.grad(loss))(x)
    reverse_over_reverse = torch.func.jacrev(torch.func.grad(loss))(x)
    torch.testing.assert_close(forward_over_reverse, reverse_over_reverse)
    torch.testing.assert_close(torch.func.hessian(loss)(x), reverse_over_reverse)
    native = torch.func.grad(lambda v: F.huber_loss(v, torch.zeros_like(v), delta=0.5, reduction="sum"))
    torch.testing.assert_close(reverse_over_reverse, torch.func.jacrev(native)(x))


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_smooth_l1_gradients_are_pytorchs_also_at_beta_zero(kinks, beta):
    """At beta = 0 smooth L1 is the L1 loss, as F.smooth_l1_loss computes it (l1_loss): gradient sign(d),
    0 where input equals target (the kernel `smooth_l1_loss_backward` gives -1 there, the clip NaN)."""
    x = torch.tensor([0.0, 1.0, -2.0, 0.25, 0.3, -0.5], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.3, 0.0], dtype=torch.float64, requires_grad=True)
    g = torch.randn(6, dtype=torch.float64)
    got = torch.autograd.grad(kinks.smooth_pair(x, t, beta), [x, t], g)
    want = torch.autograd.grad(F.smooth_l1_loss(x, t, reduction="none", beta=beta), [x, t], g)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(kinks.smooth_pair(x, t, beta), F.smooth_l1_loss(x, t, reduction="none", beta=beta))
