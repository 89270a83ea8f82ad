"""`cat([...], dim=...)` along a named dimension and `stack` along a new one (Note [concatenation] in
opgen/nodes/concat.py) against torch.cat and torch.stack in float64: values, gradients, second
derivatives, gradcheck and gradgradcheck, forward mode, vmap, torch.compile and the custom_op form;
`specs/rotary_embedding.yaml` against Hugging Face's rotate_half and `specs/complex_rotation.yaml`
against torch.polar, in plain torch; located shape errors with a fix."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT, import_package
from spec_ops import assert_like_plain_torch, assert_located, assert_transforms_like_plain_torch, build_ops

DTYPE = torch.float64

SPECS = {
    "halves": """
        name: halves
        inputs: {x: "Tensor[..., D]", w: "Tensor[D]"}
        let: {x1: "x[..., :D // 2]", x2: "x[..., D // 2:]"}
        outputs: {y: "exp(cat([-x2 * w[:D // 2], sin(x1)], dim=-1)) * x"}
    """,
    "stacked": """
        name: stacked
        inputs: {a: "Tensor[..., K]", b: "Tensor[K]"}
        let: {p: "stack([a * b, exp(a)], dim=-1)"}
        outputs: {y: "sum(p**2, dim=-1) * p[..., 1] + sum(stack([b, b * 2, sin(b)], dim=0), dim=0)"}
    """,
    "copies": """
        name: copies
        inputs: {a: "Tensor[N, K]", b: "Tensor[N, K]"}
        outputs: {y: "sum(cat([a * b, tanh(a), b], dim=1)**2, dim=-1)"}
        form: custom_op
    """,
}


def _halves(x, w):
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.exp(torch.cat([-x2 * w[:d], torch.sin(x1)], dim=-1)) * x


def _copies(a, b):
    return (torch.cat([a * b, torch.tanh(a), b], dim=1) ** 2).sum(-1)


def _stacked(a, b):
    p = torch.stack([a * b, torch.exp(a)], dim=-1)
    return (p**2).sum(-1) * p[..., 1] + torch.stack([b, b * 2, torch.sin(b)], dim=0).sum(0)


PLAIN = {"halves": _halves, "copies": _copies, "stacked": _stacked}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return build_ops(tmp_path_factory.mktemp("cat"), "cat_ops", SPECS)


def _args(name, seed=0, batch=(2,)):
    g = torch.Generator().manual_seed(seed)
    if name in ("halves", "stacked"):
        return [torch.randn(*batch, 6, generator=g, dtype=DTYPE), torch.randn(6, generator=g, dtype=DTYPE)]
    return [torch.randn(3, 4, generator=g, dtype=DTYPE) for _ in range(2)]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_values_and_derivatives_of_two_orders_match_torch_cat(ops, name):
    assert_like_plain_torch(getattr(ops, name), PLAIN[name], _args(name))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_forward_mode_vmap_and_compile(ops, name):
    batch = [torch.stack([_args(name, seed)[k] for seed in range(3)]) for k in range(2)]
    assert_transforms_like_plain_torch(getattr(ops, name), PLAIN[name], _args(name, 1), _args(name, 2), batch)


def test_the_custom_op_form(ops):
    torch.library.opcheck(torch.ops.cat_ops.copies, _args("copies", 3))


def test_the_rotary_embedding_spec_matches_rotate_half():
    generated = import_package(ROOT, "generated")

    def rotate_half(x):  # transformers' apply_rotary_pos_emb
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=g, dtype=DTYPE, requires_grad=True)
    angles = torch.arange(5, dtype=DTYPE)[:, None] * torch.rand(4, generator=g, dtype=DTYPE)
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().requires_grad_(), emb.sin().requires_grad_()
    got, want = generated.rotary_embedding(x, cos, sin), x * cos + rotate_half(x) * sin
    torch.testing.assert_close(got, want)
    args = (x, cos, sin)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), args), torch.autograd.grad(want.sum(), args))
    assert torch.autograd.gradgradcheck(generated.rotary_embedding, args)


INPUTS = '{x: "Tensor[N, K]", y: "Tensor[M, K]", v: "Tensor[K]", b: "Tensor[..., K]", k: int = 1}'
BAD = {
    "cat([x, v], dim=-1)": "cat() joins pieces that differ only along dim=-1: [N, K] and [K]",
    "cat([x, x.T], dim=-1)": "cat() joins pieces that differ only along dim=-1",
    "cat([x, y], dim=0)": "cat() joins parts of one named dimension (x[..., :D // 2] and x[..., D // 2:])",
    "cat([b, b], dim=0)": "with batch dimensions `...` cat() counts `dim` from the end",
    "cat([x, 2], dim=-1)": "cat() joins tensors; `2` is a number",
    "cat(x, dim=-1)": "cat() takes a list of tensors and `dim=`, e.g. cat([-x2, x1], dim=-1)",
    "cat([x, x], dim=k)": "`dim` of cat() must be a whole number such as -1",
    "cat([x, x], dim=2)": "dim=2 is not a dimension of [N, K]",
    "stack([x, v], dim=-1)": "stack() joins pieces of one shape with declared dimensions",
    "stack([x], dim=-1)": "stack() of one tensor is a dimension of size 1: write unsqueeze(x, dim=-1)",
    "stack([x, x], dim=3)": "dim=3 is not a place for a new dimension of [N, K]",
}


@pytest.mark.parametrize("formula", sorted(BAD))
def test_shape_errors_are_located_with_a_fix(tmp_path, formula):
    assert_located(tmp_path, INPUTS, formula, BAD[formula])


def test_the_complex_rotation_spec_matches_torch_polar():
    generated = import_package(ROOT, "generated")
    g = torch.Generator().manual_seed(1)
    x, y, theta = (torch.randn(2, 5, generator=g, dtype=DTYPE, requires_grad=True) for _ in range(3))
    want = torch.view_as_real(torch.polar(torch.ones_like(theta), theta) * torch.complex(x, y))
    got = generated.complex_rotation(x, y, theta)
    torch.testing.assert_close(got, want)
    weight = torch.linspace(-1, 1, want.numel(), dtype=DTYPE).view_as(want)
    args = (x, y, theta)
    torch.testing.assert_close(
        torch.autograd.grad((got * weight).sum(), args), torch.autograd.grad((want * weight).sum(), args)
    )
    assert torch.autograd.gradgradcheck(generated.complex_rotation, args)
