"""`cumsum(x, dim)` and `logcumsumexp(x, dim)` (Notes [scans], [logcumsumexp] in opgen/nodes/scan.py) against
torch's in float64: values,
gradients of the first two orders (a narrower gradient expanded first), gradcheck and gradgradcheck with
forward mode, vmap, torch.compile, the custom_op form; and its misuse as located errors."""

from __future__ import annotations

import pytest
import torch
from spec_ops import assert_located, build_ops

DTYPE = torch.float64
SPECS = {
    "scan_op": (
        "name: scan_op\ninputs: {x: 'Tensor[..., N]', w: 'Tensor[N]'}\n"
        "outputs: {y: 'sum(cumsum(x * w, dim=-1)**2 / 2, dim=-1) + sum(cumsum(x, -1))'}\n"
    ),
    "scan_first": "name: scan_first\ninputs: {x: 'Tensor[M, N]'}\noutputs: {y: 'cumsum(x, 0) * cumsum(x, dim=1)'}\n",
    "lcse_op": (
        "name: lcse_op\ninputs: {x: 'Tensor[..., N]', w: 'Tensor[N]'}\n"
        "outputs: {y: 'sum(w * logcumsumexp(x, dim=-1), dim=-1) + sum(logcumsumexp(x, -1))'}\n"
    ),
    "lcse_written": (
        "name: lcse_written\ninputs: {x: 'Tensor[..., N]'}\noutputs: {y: 'log(2 * cumsum(exp(x), dim=-1))'}\n"
    ),
    "scan_custom": (
        "name: scan_custom\ninputs: {x: 'Tensor[..., N]'}\noutputs: {y: 'exp(cumsum(x, dim=-1))'}\nform: custom_op\n"
    ),
}


def plain_scan(x, w):
    return (torch.cumsum(x * w, -1) ** 2 / 2).sum(-1) + torch.cumsum(x, -1).sum()


def plain_lcse(x, w):
    return (w * torch.logcumsumexp(x, -1)).sum(-1) + torch.logcumsumexp(x, -1).sum()


def plain_first(x):
    return torch.cumsum(x, 0) * torch.cumsum(x, 1)


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return build_ops(tmp_path_factory.mktemp("scan"), "scan_ops", SPECS)


def _args(*shapes):
    g = torch.Generator().manual_seed(0)
    return [(torch.rand(s, generator=g, dtype=DTYPE) * 2 - 1).requires_grad_() for s in shapes]


@pytest.mark.parametrize(
    ("name", "plain", "shapes"),
    [
        ("scan_op", plain_scan, [(3, 5), (5,)]),
        ("scan_first", plain_first, [(4, 3)]),
        ("lcse_op", plain_lcse, [(3, 5), (5,)]),
    ],
)
def test_values_and_two_orders_of_gradients_match_torch(ops, name, plain, shapes):
    op, args = getattr(ops, name), _args(*shapes)
    torch.testing.assert_close(op(*args), plain(*args))
    got = torch.autograd.grad(op(*args).sum(), args, create_graph=True)
    want = torch.autograd.grad(plain(*args).sum(), args, create_graph=True)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    again = torch.autograd.grad(sum((g**2).sum() for g in got), args)
    twice = torch.autograd.grad(sum((w**2).sum() for w in want), args)
    for g, w in zip(again, twice, strict=True):
        torch.testing.assert_close(g, w)
    assert torch.autograd.gradcheck(op, tuple(args), check_forward_ad=True, check_batched_grad=True)
    assert torch.autograd.gradgradcheck(op, tuple(args), check_fwd_over_rev=True)


def test_jvp_vmap_compile_and_custom_op(ops):
    x, w = (a.detach() for a in _args((3, 5), (5,)))
    t, s = torch.ones_like(x), torch.linspace(-1, 1, 5, dtype=DTYPE)
    torch.testing.assert_close(torch.func.jvp(ops.scan_op, (x, w), (t, s)), torch.func.jvp(plain_scan, (x, w), (t, s)))
    grad = torch.func.grad(lambda v: ops.scan_op(v, w).sum())
    torch.testing.assert_close(
        torch.func.vmap(grad)(x), torch.func.vmap(torch.func.grad(lambda v: plain_scan(v, w).sum()))(x)
    )
    xg = x.clone().requires_grad_()
    compiled = torch.compile(ops.scan_first, fullgraph=True, backend="aot_eager")
    (got,) = torch.autograd.grad(compiled(xg[:3]).sum(), xg)
    (want,) = torch.autograd.grad(plain_first(xg[:3]).sum(), xg)
    torch.testing.assert_close(got, want)
    torch.library.opcheck(torch.ops.scan_ops.scan_custom, (x,))
    torch.testing.assert_close(ops.scan_custom(x), torch.exp(torch.cumsum(x, -1)))
    assert torch.autograd.gradgradcheck(ops.scan_custom, (xg,))


@pytest.mark.parametrize(
    ("inputs", "formula", "expected"),
    [
        ("{x: 'Tensor[..., N]'}", "cumsum(x, dim=-2)", "dim=-2 is not a dimension of [..., N]; it takes -1 to -1"),
        ("{x: 'Tensor[..., N]'}", "cumsum(x, 0)", "dim=0 is not a dimension"),
        ("{x: 'Tensor[M, N]'}", "cumsum(x, 2)", "it takes -2 to -1 or 0 to 1"),
        ("{x: 'Tensor'}", "cumsum(x, -1)", "needs a tensor of declared dimensions"),
        ("{x: 'Tensor[N]'}", "cumsum(x, dim=1.5)", "must be a whole-number literal"),
        ("{x: 'Tensor[N]'}", "cumsum(x)", "takes a tensor and one dim"),
        ("{x: 'Tensor[N]'}", "cumsum(x, -1, dim=-1)", "takes a tensor and one dim"),
    ],
)
def test_misuse_is_a_located_error(tmp_path, inputs, formula, expected):
    assert_located(tmp_path, inputs, formula, expected)


def test_logcumsumexp_is_finite_at_100_in_float32(ops):
    """torch.logcumsumexp's forward and its gradient (the positive and negative parts of the incoming
    gradient, each through a reversed logcumsumexp): no exp overflows at x = 100, with gradients of both signs."""
    x = torch.tensor([[100.0, 99.0, 101.0, -3.0]], requires_grad=True)
    w = torch.tensor([1.0, -2.0, 0.5, 3.0])
    y = ops.lcse_op(x, w)
    want = plain_lcse(x.double(), w.double())
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.double(), want)
    (got,) = torch.autograd.grad(y.sum(), x)
    exact = x.detach().double().requires_grad_()
    (ref,) = torch.autograd.grad(plain_lcse(exact, w.double()).sum(), exact)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_log_of_cumsum_of_exp_is_read_as_logcumsumexp(ops):
    """`log(2 * cumsum(exp(x), dim=-1))` is computed as `log(2) + logcumsumexp(x, -1)`: finite at x = 100 in
    float32, where exp(x) overflows, and equal to the float64 value as written, gradient too."""
    x = torch.tensor([[100.0, 99.0, 101.0, -3.0], [0.5, -1.0, 2.0, 0.25]], requires_grad=True)
    g = torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.5, 1.0, -1.0, 2.0]])
    y = ops.lcse_written(x)
    exact = x.detach().double().requires_grad_()
    want = torch.log(2 * torch.cumsum(torch.exp(exact), -1))
    torch.testing.assert_close(y.double(), want)
    (got,) = torch.autograd.grad(y, x, g)
    (ref,) = torch.autograd.grad(want, exact, g.double())
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
    assert not torch.isfinite(torch.log(2 * torch.cumsum(torch.exp(x.detach()), -1))).all()  # as written, in float32
