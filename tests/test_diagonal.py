"""`diagonal`, `diag_embed`, `diag` and `eye` over named dimensions (Note [diagonals] in
opgen/nodes/diagonal.py) against torch.diagonal, torch.diag_embed, torch.diag and torch.eye in
float64: values, gradients, gradcheck and gradgradcheck (backward is built of differentiable ops),
gradients and tangents narrower than the node (a trace), forward mode, vmap, torch.compile and the
custom_op form; `specs/barlow_twins.yaml` against the loss in plain torch; located shape errors."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT, import_package
from spec_ops import assert_located, build_ops

DTYPE = torch.float64

SPECS = {
    "diag_ops": """
        name: diag_ops
        inputs: {v: "Tensor[..., N]", m: "Tensor[..., N, N]"}
        outputs:
          y: diag_embed(exp(v)) @ m + sum(diagonal(m)) * diag_embed(v) + m * eye(N)
          t: diagonal(m @ m) * v
    """,
    "trace": """
        name: trace
        inputs: {m: "Tensor[N, N]", s: "Tensor[N]"}
        outputs: {y: sum(diagonal(m)) + sum(diag_embed(s)) * sum(diag(m)**2) + sum(diag(s) @ m)}
        form: custom_op
    """,
}


def _plain(v, m):
    y = torch.diag_embed(v.exp()) @ m + torch.diagonal(m, dim1=-2, dim2=-1).sum() * torch.diag_embed(v)
    y = y + m * torch.eye(m.shape[-1], dtype=m.dtype)
    return y, torch.diagonal(m @ m, dim1=-2, dim2=-1) * v


def _trace(m, s):
    return torch.diagonal(m).sum() + torch.diag_embed(s).sum() * (torch.diag(m) ** 2).sum() + (torch.diag(s) @ m).sum()


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return build_ops(tmp_path_factory.mktemp("diag"), "diag_ops_pkg", SPECS)


def _args(seed=0, batch=(2,)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*batch, 3, generator=g, dtype=DTYPE), torch.randn(*batch, 3, 3, generator=g, dtype=DTYPE)]


def test_values_and_gradients_match_torch(ops):
    args = [a.requires_grad_() for a in _args()]
    got, want = ops.diag_ops(*args), _plain(*args)
    torch.testing.assert_close(got, want)
    weights = [torch.linspace(-1, 1, w.numel(), dtype=DTYPE).view_as(w) for w in want]
    g = torch.autograd.grad(sum((o * w).sum() for o, w in zip(got, weights, strict=True)), args, create_graph=True)
    w = torch.autograd.grad(sum((o * w).sum() for o, w in zip(want, weights, strict=True)), args, create_graph=True)
    torch.testing.assert_close(g, w)
    second = torch.autograd.grad(sum(x.pow(2).sum() for x in g), args)
    torch.testing.assert_close(second, torch.autograd.grad(sum(x.pow(2).sum() for x in w), args))


def test_gradcheck_and_gradgradcheck(ops):
    args = [a.requires_grad_() for a in _args(1)]
    assert torch.autograd.gradcheck(ops.diag_ops, args, check_forward_ad=True, check_batched_grad=True)
    assert torch.autograd.gradgradcheck(ops.diag_ops, args, check_fwd_over_rev=True)
    m, s = torch.randn(3, 3, dtype=DTYPE, requires_grad=True), torch.randn(3, dtype=DTYPE, requires_grad=True)
    assert torch.autograd.gradcheck(ops.trace, (m, s), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(ops.trace, (m, s))


def test_narrow_gradients_and_tangents_of_a_trace(ops):
    """`sum(diagonal(m))` gets a scalar gradient, `sum(diag_embed(s))` too: each expanded before it moves."""
    m, s = torch.randn(4, 4, dtype=DTYPE, requires_grad=True), torch.randn(4, dtype=DTYPE, requires_grad=True)
    got = torch.autograd.grad(ops.trace(m, s), (m, s))
    torch.testing.assert_close(got, torch.autograd.grad(_trace(m, s), (m, s)))
    tangents = (torch.randn(4, 4, dtype=DTYPE), torch.randn(4, dtype=DTYPE))
    primals = (m.detach(), s.detach())
    torch.testing.assert_close(torch.func.jvp(ops.trace, primals, tangents), torch.func.jvp(_trace, primals, tangents))
    torch.library.opcheck(torch.ops.diag_ops_pkg.trace, primals)


def test_forward_mode_vmap_and_compile(ops):
    args = _args(2)
    tangents = tuple(_args(3))
    torch.testing.assert_close(
        torch.func.jvp(ops.diag_ops, tuple(args), tangents), torch.func.jvp(_plain, tuple(args), tangents)
    )
    batch = _args(4, batch=(5, 2))
    grads = torch.func.vmap(torch.func.grad(lambda v, m: ops.diag_ops(v, m)[1].sum(), argnums=(0, 1)))(*batch)
    plain = torch.func.vmap(torch.func.grad(lambda v, m: _plain(v, m)[1].sum(), argnums=(0, 1)))(*batch)
    torch.testing.assert_close(grads, plain)
    compiled = torch.compile(ops.diag_ops, fullgraph=True, backend="aot_eager")
    args = [a.requires_grad_() for a in args]
    out = compiled(*args)
    torch.testing.assert_close(out, _plain(*args))
    torch.testing.assert_close(
        torch.autograd.grad(out[0].sum() + out[1].sum(), args),
        torch.autograd.grad(sum(o.sum() for o in _plain(*args)), args),
    )


def test_the_barlow_twins_spec_matches_plain_torch():
    generated = import_package(ROOT, "generated")
    g = torch.Generator().manual_seed(0)
    z1, z2 = (torch.randn(8, 5, generator=g, dtype=DTYPE, requires_grad=True) for _ in range(2))

    def plain(z1, z2, lam=0.005):
        c = z1.T @ z2 / z1.shape[0]
        on = (torch.diagonal(c) - 1).pow(2).sum()
        off = (c - torch.diag(torch.diagonal(c))).pow(2).sum()
        return on + lam * off

    torch.testing.assert_close(generated.barlow_twins(z1, z2), plain(z1, z2))
    got = torch.autograd.grad(generated.barlow_twins(z1, z2), (z1, z2))
    torch.testing.assert_close(got, torch.autograd.grad(plain(z1, z2), (z1, z2)))
    assert torch.autograd.gradgradcheck(generated.barlow_twins, (z1, z2))


BAD = {
    "diagonal(x)": "diagonal() needs a square matrix, its last two dimensions the same named dimension; [N, K] has N",
    "diagonal(v)": "diagonal() needs at least two dimensions; [K] has 1",
    "diag_embed(x, 1)": "diag_embed() takes one tensor and no keywords",
    "diag(b)": "diag() takes a vector [N] or a square matrix [N, N], as torch.diag",
    "eye(3) * x": "eye() takes one named dimension of a Tensor input, e.g. eye(D) (K, N here)",
    "eye(N) + x": "cannot broadcast [N, K] with [N, N]",
}


@pytest.mark.parametrize("formula", sorted(BAD))
def test_shape_errors_are_located_with_a_fix(tmp_path, formula):
    assert_located(tmp_path, '{x: "Tensor[N, K]", v: "Tensor[K]", b: "Tensor[..., K]"}', formula, BAD[formula])
