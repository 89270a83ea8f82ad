"""The gated linear unit written as halves of one input: lowered to `F.glu` / `aten.glu_backward` where it is
exactly PyTorch's (opgen.nodes.glu, found by opgen.optimize.gates), and right everywhere, near misses included,
against PyTorch in float64."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_norm_lowering_forms import _op

GLU = {
    "slices": "x[..., :D // 2] * sigmoid(x[..., D // 2:])",
    "chunk": "chunk(x, 2, dim=-1)[0] * sigmoid(chunk(x, 2, dim=-1)[1])",
    "scaled": "2 * sigmoid(x[..., D // 2:]) * x[..., :D // 2]",
}


def _forward(source: str) -> str:
    return source.split("def forward", 1)[1].split("def setup_context", 1)[0]


def _agree(op, want, inputs: tuple[torch.Tensor, ...]) -> None:
    """Values, gradients, double backward (gradgradcheck), torch.func jvp, vmap, jacrev and hessian as `want`'s."""
    y, expected = op(*inputs), want(*inputs)
    torch.testing.assert_close(y, expected)
    g = torch.randn_like(y)
    torch.testing.assert_close(torch.autograd.grad(y, inputs, g), torch.autograd.grad(expected, inputs, g))
    assert torch.autograd.gradgradcheck(op, inputs)
    tangents = tuple(torch.randn_like(t) for t in inputs)
    torch.testing.assert_close(torch.func.jvp(op, inputs, tangents)[1], torch.func.jvp(want, inputs, tangents)[1])
    plain = tuple(t.detach() for t in inputs)
    torch.testing.assert_close(torch.func.vmap(op)(*plain), torch.func.vmap(want)(*plain))
    torch.testing.assert_close(torch.func.jacrev(op)(*plain), torch.func.jacrev(want)(*plain))
    row = plain[0][0]

    def scalar(f):
        return lambda r: (f(r) ** 2).sum()

    torch.testing.assert_close(torch.func.hessian(scalar(op))(row), torch.func.hessian(scalar(want))(row))


@pytest.mark.parametrize("how", sorted(GLU))
def test_glu_is_pytorchs_kernel(tmp_path: Path, how: str) -> None:
    op, source = _op(tmp_path, f"glu_{how}", "  x: Tensor[..., D]\n", f"outputs:\n  y: {GLU[how]}\n")
    assert "torch.nn.functional.glu(x, -1)" in _forward(source)
    assert "torch.ops.aten.glu_backward(" in source.split("def backward", 1)[1]
    torch.manual_seed(0)
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    scale = 2.0 if how == "scaled" else 1.0
    _agree(op, lambda x: scale * F.glu(x, -1), (x,))


def test_glu_through_lets_and_another_dim(tmp_path: Path) -> None:
    lets = "let:\n  a: x[..., :C // 2, :]\n  b: x[..., C // 2:, :]\n"
    op, source = _op(tmp_path, "glu_dim", "  x: Tensor[..., C, T]\n", f"{lets}outputs:\n  y: a * sigmoid(b)\n")
    assert "torch.nn.functional.glu(x, -2)" in _forward(source)
    torch.manual_seed(1)
    x = torch.randn(2, 6, 5, dtype=torch.float64, requires_grad=True)
    _agree(op, lambda x: F.glu(x, -2), (x,))


def test_glu_inside_a_larger_formula(tmp_path: Path) -> None:
    """The node among other terms that read `x` too: its gradient is one part of `x`'s."""
    body = "outputs:\n  y: x[..., :D // 2] * sigmoid(x[..., D // 2:]) + exp(x[..., :D // 2])\n"
    op, source = _op(tmp_path, "glu_sum", "  x: Tensor[..., D]\n", body)
    assert "glu_backward" in source
    torch.manual_seed(2)
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    _agree(op, lambda x: F.glu(x, -1) + torch.exp(x[..., :3]), (x,))


NEAR_MISSES = {
    # sigmoid of the first half: not glu
    "swapped": ("sigmoid(x[..., :D // 2]) * x[..., D // 2:]", lambda x: torch.sigmoid(x[..., :6]) * x[..., 6:]),
    # halves of different tensors
    "two_tensors": ("x[..., :D // 2] * sigmoid(z[..., D // 2:])", None),
    # thirds
    "thirds": (
        "x[..., :D // 3] * sigmoid(x[..., D // 3:2 * D // 3])",
        lambda x: x[..., :4] * torch.sigmoid(x[..., 4:8]),
    ),
    # halves of the first half
    "quarters": ("x[..., :D // 4] * sigmoid(x[..., D // 4:D // 2])", lambda x: F.glu(x[..., :6], -1)),
    # SwiGLU's silu gate
    "swiglu": (
        "x[..., :D // 2] * sigmoid(x[..., :D // 2]) * x[..., D // 2:]",
        lambda x: F.silu(x[..., :6]) * x[..., 6:],
    ),
    # the gate squared
    "squared": ("x[..., :D // 2] * sigmoid(x[..., D // 2:])**2", lambda x: x[..., :6] * torch.sigmoid(x[..., 6:]) ** 2),
}


@pytest.mark.parametrize("how", sorted(NEAR_MISSES))
def test_near_misses_stay_formulas(tmp_path: Path, how: str) -> None:
    formula, want = NEAR_MISSES[how]
    inputs = "  x: Tensor[..., D]\n" + ("  z: Tensor[..., D]\n" if want is None else "")
    op, source = _op(tmp_path, f"near_{how}", inputs, f"outputs:\n  y: {formula}\n")
    assert "functional.glu" not in source and "glu_backward" not in source
    torch.manual_seed(3)
    x = torch.randn(2, 12, dtype=torch.float64, requires_grad=True)
    if want is None:
        z = torch.randn(2, 12, dtype=torch.float64, requires_grad=True)
        y, expected = op(x, z), x[..., :6] * torch.sigmoid(z[..., 6:])
        torch.testing.assert_close(y, expected)
        g = torch.randn_like(y)
        torch.testing.assert_close(torch.autograd.grad(y, (x, z), g), torch.autograd.grad(expected, (x, z), g))
        return
    _agree(op, want, (x,))


@pytest.mark.parametrize("other", [(2, 3, 4), (3, 4), (2, 1, 4)])
def test_glu_gradient_with_batch_dimensions_broadcast(tmp_path: Path, other: tuple[int, ...]) -> None:
    """Another input's bigger batch reaches the kernel's gradient (Note [carried batch dimensions]): summed first."""
    inputs = "  x: Tensor[..., D]\n  s: Tensor[..., E]\n"
    body = "outputs:\n  y: x[..., :D // 2] * sigmoid(x[..., D // 2:]) * sum(s, dim=-1, keepdim=true)\n"
    op, source = _op(tmp_path, f"glu_batch{len(other)}{other[0]}", inputs, body)
    assert "glu_backward" in source
    torch.manual_seed(4)
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    s = torch.randn(*other, dtype=torch.float64, requires_grad=True)
    y, expected = op(x, s), F.glu(x, -1) * s.sum(-1, keepdim=True)
    torch.testing.assert_close(y, expected)
    g = torch.randn_like(y)
    torch.testing.assert_close(torch.autograd.grad(y, (x, s), g), torch.autograd.grad(expected, (x, s), g))
    assert torch.autograd.gradgradcheck(op, (x, s))
