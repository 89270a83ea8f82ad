"""Ops whose backward makes no more full-size tensors than plain autograd of the same formula, counted
structurally (aten calls whose result has the inputs' broadcast size), with values, gradients and second
derivatives those of plain autograd in float64: the hinge's shared kink (Note [shared kinks] in
opgen/plan/kinks.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import import_package
from full_size import FullSize

from opgen.cli import main

SPECS = {
    # name: (spec after the name, the formula in plain torch, the tensor inputs' shapes)
    "hinge": (
        "inputs:\n  x: Tensor\n  y: Tensor\noutputs:\n  loss: max(0, 1 - x * y)\n",
        lambda x, y: torch.clamp(1 - x * y, min=0),
        [(16, 8), (16, 8)],
    ),
    "hinge_broadcast": (
        "inputs:\n  x: Tensor\n  y: Tensor\noutputs:\n  loss: max(1 - x * y, 0)\n",
        lambda x, y: torch.relu(1 - x * y),
        [(16, 8), (8,)],
    ),
}
LSE_POOL = "inputs:\n  x: Tensor[..., D]\n  r: float = 5.0\noutputs:\n  y: log(mean(exp(r * x), dim=-1)) / r\n"
TRIPLET = (
    "inputs:\n  a: Tensor[..., D]\n  p: Tensor[..., D]\n  n: Tensor[..., D]\n  margin: float = 1.0\n"
    "outputs:\n  loss: mean(relu(norm(a - p, dim=-1) - norm(a - n, dim=-1) + margin))\n"
)


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    root = tmp_path_factory.mktemp("backward_passes")
    (root / "specs").mkdir()
    for name, text in [*((n, t) for n, (t, _, _) in SPECS.items()), ("lse_pool", LSE_POOL), ("triplet", TRIPLET)]:
        (root / "specs" / f"{name}.yaml").write_text(f"name: {name}\n{text}", encoding="utf-8")
    assert main(["generate", str(root / "specs"), "-o", str(root / "pass_ops"), "--no-cache"]) == 0
    return import_package(root, "pass_ops")


def _backward_passes(function, xs: list[torch.Tensor]) -> int:
    y = function(*xs)
    g = torch.randn_like(y)
    with FullSize(max(x.numel() for x in xs), views=False) as mode:
        torch.autograd.grad(y, xs, g)
    return mode.count


def _inputs(shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [(2 * torch.rand(s, generator=generator, dtype=torch.float64)).requires_grad_() for s in shapes]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_backward_is_plain_autograds_with_no_more_passes(ops, name):
    _, plain, shapes = SPECS[name]
    op = getattr(ops, name)
    xs = _inputs(shapes)
    torch.testing.assert_close(op(*xs), plain(*xs))
    g = torch.randn_like(plain(*xs))
    got = torch.autograd.grad(op(*xs), xs, g, create_graph=True)
    want = torch.autograd.grad(plain(*xs), xs, g, create_graph=True)
    torch.testing.assert_close(got, want)
    second = torch.autograd.grad(sum((a * a).sum() for a in got), xs)
    torch.testing.assert_close(second, torch.autograd.grad(sum((b * b).sum() for b in want), xs))
    assert torch.autograd.gradgradcheck(op, xs)
    for k in range(len(xs)):  # one input alone requiring a gradient
        alone = [x.detach().requires_grad_(i == k) for i, x in enumerate(xs)]
        (one,) = torch.autograd.grad(op(*alone), [alone[k]], g)
        torch.testing.assert_close(one, torch.autograd.grad(plain(*alone), [alone[k]], g)[0])
    assert _backward_passes(op, xs) <= _backward_passes(plain, xs)


def test_the_hinge_computes_its_kink_once(ops):
    """`max(0, 1 - x*y)`: the mask, the incoming gradient's negation and the `where` once for both
    gradients, read from the saved output (10 full-size passes before, plain autograd's 4 now)."""
    xs = _inputs([(16, 8), (16, 8)])
    assert _backward_passes(ops.hinge, xs) == 4


def _passes(function, xs: list[torch.Tensor]) -> tuple[int, int]:
    """Full-size passes of forward, then of backward."""
    with FullSize(max(x.numel() for x in xs), views=False) as forward:
        y = function(*xs)
    with FullSize(max(x.numel() for x in xs), views=False) as backward:
        torch.autograd.grad(y, xs, torch.ones_like(y))
    return forward.count, backward.count


def test_a_parameter_cancels_across_unsqueeze(ops):
    """`log(mean(exp(r*x), dim=-1)) / r`: the gradient was `r * exp(...) * (grad / r).unsqueeze(-1)`, two
    full-size products by `r` and `1/r`; now `exp(...) * grad.unsqueeze(-1)`, 4 backward passes (5 before),
    and forward and backward together no more than plain autograd's (which saves `exp(r*x)`)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, generator=generator, dtype=torch.float64, requires_grad=True)

    def plain(x: torch.Tensor) -> torch.Tensor:
        return torch.log(torch.exp(2.5 * x).mean(-1)) / 2.5

    def op(x: torch.Tensor) -> torch.Tensor:
        return ops.lse_pool(x, 2.5)

    g = torch.randn(16, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(op(x), x, g), torch.autograd.grad(plain(x), x, g))
    assert torch.autograd.gradgradcheck(op, [x])
    mine, theirs = _passes(op, [x]), _passes(plain, [x])
    assert mine[1] == 4
    assert sum(mine) <= sum(theirs)


def test_a_norms_gradient_is_masked_on_its_rows(ops):
    """A norm's gradient `where(norm == 0, 0, grad / norm) * a`: the mask and the quotient on the reduced
    rows, one full-size product (it was `grad * where(norm == 0, 0, a / norm)`, three): the triplet loss
    makes plain autograd's 7 full-size tensors in backward (11 before), with its values, first and second
    derivatives, and 0 where a row's difference is 0, as PyTorch's norm gives."""
    generator = torch.Generator().manual_seed(0)
    a, p, n = (torch.randn(16, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    p[3] = a[3]  # a zero norm
    xs = [t.requires_grad_() for t in (a, p, n)]

    def plain(a, p, n):
        return torch.relu(torch.linalg.vector_norm(a - p, dim=-1) - torch.linalg.vector_norm(a - n, dim=-1) + 1).mean()

    got = torch.autograd.grad(ops.triplet(*xs, 1.0), xs, create_graph=True)
    want = torch.autograd.grad(plain(*xs), xs, create_graph=True)
    torch.testing.assert_close(got, want)
    second = torch.autograd.grad(sum((g * g).sum() for g in got), xs)
    wanted = torch.autograd.grad(sum((w * w).sum() for w in want), xs)
    rows = torch.arange(16) != 3  # plain autograd's second derivative at a zero norm is NaN, ours 0
    torch.testing.assert_close([s[rows] for s in second], [w[rows] for w in wanted])
    assert all(torch.isfinite(s).all() for s in second)
    assert torch.autograd.gradgradcheck(lambda *t: ops.triplet(*t, 1.0), [x[:4].detach().requires_grad_() for x in xs])
    assert _backward_passes(lambda *t: ops.triplet(*t, 1.0), xs) == 7 <= _backward_passes(plain, xs)
