"""Scale-free ratios (Note [scale-free ratios] in opgen/optimize/scales.py): cosine similarity written
from its definition, `sum(x1*x2) / (norm(x1) * norm(x2))`, is finite where its norms and its sum
overflow or underflow in float32 (entries near 1e20, 1e30, 1e-25), with the value and the first and
second derivatives of F.cosine_similarity in float64; gradcheck and gradgradcheck hold in float64.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from conftest import import_package

from opgen.cli import main

SPECS = {
    "cos_written": "sum(x1 * x2, dim=-1) / (norm(x1, dim=-1) * norm(x2, dim=-1))",
    "cos_scaled": (
        "3 * sum(x2 * x1, dim=-1, keepdim=true) / norm(x1, dim=-1, keepdim=true) / norm(x2, dim=-1, keepdim=true)"
    ),
}
FACTOR = {"cos_written": 1.0, "cos_scaled": 3.0}
KEEP = {"cos_written": False, "cos_scaled": True}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scale_free")
    specs = folder / "specs"
    specs.mkdir()
    for name, formula in SPECS.items():
        text = f"name: {name}\ninputs:\n  x1: Tensor[..., D]\n  x2: Tensor[..., D]\noutputs:\n  y: {formula}\n"
        (specs / f"{name}.yaml").write_text(text)
    assert main(["generate", str(specs), "-o", str(folder / "scale_free_ops")]) == 0
    return import_package(folder, "scale_free_ops")


def _native(name):
    def f(a, b):
        y = FACTOR[name] * F.cosine_similarity(a, b, dim=-1, eps=0.0)
        return y.unsqueeze(-1) if KEEP[name] else y

    return f


def _orders(f, a, b):
    """The value and the first and second derivatives (of the summed first) in both inputs."""
    y = f(a, b)
    firsts = torch.autograd.grad(y.sum(), (a, b), create_graph=True)
    seconds = torch.autograd.grad(sum(g.sum() for g in firsts), (a, b))
    return [y.detach(), *(g.detach() for g in firsts), *seconds]


@pytest.mark.parametrize("scale", [1.0, 1e20, 1e30, 1e-25])
@pytest.mark.parametrize("name", SPECS)
def test_float32_is_cosine_similarity_in_float64_at_every_scale(ops, name, scale):
    torch.manual_seed(0)
    a, b = torch.randn(4, 6) * scale, torch.randn(4, 6) * scale
    got = _orders(getattr(ops, name), a.clone().requires_grad_(), b.clone().requires_grad_())
    want = _orders(_native(name), a.double().requires_grad_(), b.double().requires_grad_())
    for g, w in zip(got, want, strict=True):
        w = w.float()  # past float32's range as it should be: the second derivative at 1e-25 is ~1e50
        assert torch.isfinite(g[torch.isfinite(w)]).all(), (name, scale)
        size = w.nan_to_num(posinf=0.0, neginf=0.0).abs().max().item()
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * size)


def test_the_formula_as_written_is_not_finite_there():
    a = torch.full((1, 4), 1e20)
    written = (a * a).sum(-1) / (torch.linalg.vector_norm(a, dim=-1) * torch.linalg.vector_norm(a, dim=-1))
    assert not torch.isfinite(written).all()
    tiny = torch.full((1, 4), 1e-25)  # the norms underflow to 0: 0/0
    assert torch.isnan((tiny * tiny).sum(-1) / torch.linalg.vector_norm(tiny, dim=-1) ** 2).all()


@pytest.mark.parametrize("name", SPECS)
def test_gradients_of_every_order_in_float64(ops, name):
    torch.manual_seed(1)
    a = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    op = getattr(ops, name)
    torch.testing.assert_close(op(a, b), _native(name)(a, b))
    assert torch.autograd.gradcheck(op, (a, b))
    assert torch.autograd.gradgradcheck(op, (a, b))


def test_a_zero_vector_is_nan_as_written(ops):
    """The formula as written is 0/0 there; F.cosine_similarity clamps each norm at eps and gives 0."""
    y = ops.cos_written(torch.zeros(1, 4), torch.ones(1, 4))
    assert torch.isnan(y).all()


def test_the_scale_is_held_out_of_the_gradient(ops):
    source = inspect.getsource(ops.CosWrittenFunction)
    assert "amax(-1, keepdim=True).detach()" in source and "**2 /" not in source.replace(" ", "")


@pytest.mark.parametrize("scale", [1.0, 1e20, 1e-25])
def test_forward_mode_is_cosine_similaritys_at_every_scale(ops, scale):
    torch.manual_seed(2)
    a, b, ta, tb = (torch.randn(3, 5) * scale for _ in range(4))
    _, got = torch.func.jvp(ops.cos_written, (a, b), (ta, tb))
    _, want = torch.func.jvp(_native("cos_written"), (a.double(), b.double()), (ta.double(), tb.double()))
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
