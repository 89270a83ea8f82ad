"""`cumprod(x, dim)` and `prod(x, dim)` (Note [cumprod] in opgen/nodes/scan.py) against torch.cumprod and
torch.prod in float64, with no, one and two zeros in a slice: values, gradients of the first two orders,
gradcheck and gradgradcheck with forward mode, torch.func.jvp, vmap, torch.compile, the custom_op form; and
their misuse as located errors."""

from __future__ import annotations

import pytest
import torch
from spec_ops import assert_located, build_ops

DTYPE = torch.float64
SPECS = {
    "cumprod_op": (
        "name: cumprod_op\ninputs: {x: 'Tensor[..., N]', w: 'Tensor[N]'}\n"
        "outputs: {y: 'sum(w * cumprod(x, dim=-1), dim=-1) + sum(cumprod(x, -1))'}\n"
    ),
    "cumprod_first": (
        "name: cumprod_first\ninputs: {x: 'Tensor[M, N]'}\noutputs: {y: 'cumprod(x, 0) * cumprod(x, dim=1)'}\n"
    ),
    "prod_op": (
        "name: prod_op\ninputs: {x: 'Tensor[..., N]', w: 'Tensor[N]'}\n"
        "outputs: {y: 'prod(x * w, dim=-1) + sum(prod(x, -1, keepdim=true))'}\n"
    ),
    "prod_first": "name: prod_first\ninputs: {x: 'Tensor[M, N]'}\noutputs: {y: 'prod(x, 0) * prod(x, dim=-2)'}\n",
    "prod_custom": (
        "name: prod_custom\ninputs: {x: 'Tensor[..., N]'}\noutputs: {y: '1 - prod(1 - x, dim=-1)'}\nform: custom_op\n"
    ),
    "cumprod_custom": (
        "name: cumprod_custom\ninputs: {x: 'Tensor[..., N]'}\noutputs: {y: 'cumprod(x, dim=-1)**2'}\nform: custom_op\n"
    ),
}


def plain_op(x, w):
    return (w * torch.cumprod(x, -1)).sum(-1) + torch.cumprod(x, -1).sum()


def plain_first(x):
    return torch.cumprod(x, 0) * torch.cumprod(x, 1)


def plain_prod(x, w):
    return torch.prod(x * w, -1) + torch.prod(x, -1, keepdim=True).sum()


def plain_prod_first(x):
    return torch.prod(x, 0) * torch.prod(x, -2)


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return build_ops(tmp_path_factory.mktemp("cumprod"), "cumprod_ops", SPECS)


def _args(*shapes, zeros=()):
    """Uniform in [-1, 1], then the entries `zeros` of the first argument put to 0."""
    g = torch.Generator().manual_seed(0)
    args = [torch.rand(s, generator=g, dtype=DTYPE) * 2 - 1 for s in shapes]
    for index in zeros:
        args[0][index] = 0.0
    return [a.requires_grad_() for a in args]


ZEROS = {"none": (), "one": ((1, 2),), "two": ((1, 2), (2, 1), (2, 3))}  # rows 1 and 2: one zero, two zeros


@pytest.mark.parametrize("zeros", sorted(ZEROS))
@pytest.mark.parametrize(
    ("name", "plain", "shapes"),
    [
        ("cumprod_op", plain_op, [(3, 5), (5,)]),
        ("cumprod_first", plain_first, [(4, 5)]),
        ("prod_op", plain_prod, [(3, 5), (5,)]),
        ("prod_first", plain_prod_first, [(4, 5)]),
    ],
)
def test_values_and_two_orders_of_gradients_match_torch(ops, name, plain, shapes, zeros):
    op, args = getattr(ops, name), _args(*shapes, zeros=ZEROS[zeros])
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


def test_gradient_at_zeros_is_finite_and_not_out_over_x(ops):
    """With a zero at j the gradient of entry j is the product of the others (not 0/0), and with two zeros
    in a slice every entry's gradient is 0 but theirs; torch.cumprod's gradient agrees."""
    x = torch.tensor([[2.0, 0.0, 3.0, 5.0], [0.0, 4.0, 0.0, 7.0]], dtype=DTYPE, requires_grad=True)
    w = torch.zeros(4, dtype=DTYPE)
    (got,) = torch.autograd.grad(ops.cumprod_op(x, w).sum(), x)
    assert torch.isfinite(got).all()
    # the sum over all entries counts each row twice (once in its own row's value, once in every row's);
    # row 0: d/dx1 of (2 + 2 x1 + 2 x1 3 + 2 x1 3 5) = 2 + 6 + 30; row 1: d/dx0 = 1 + 4 (x2 = 0 ends the rest)
    assert got[0, 1].item() == 2 * 38.0
    assert got[1, 0].item() == 2 * 5.0
    (want,) = torch.autograd.grad(plain_op(x, w).sum(), x)
    torch.testing.assert_close(got, want)


def test_jvp_vmap_compile_and_custom_op(ops):
    x, w = (a.detach() for a in _args((3, 5), (5,), zeros=ZEROS["two"]))
    t, s = torch.ones_like(x), torch.linspace(-1, 1, 5, dtype=DTYPE)
    torch.testing.assert_close(torch.func.jvp(ops.cumprod_op, (x, w), (t, s)), torch.func.jvp(plain_op, (x, w), (t, s)))
    grad = torch.func.grad(lambda v: ops.cumprod_op(v, w).sum())
    torch.testing.assert_close(
        torch.func.vmap(grad)(x), torch.func.vmap(torch.func.grad(lambda v: plain_op(v, w).sum()))(x)
    )
    xg = x.clone().requires_grad_()
    compiled = torch.compile(ops.cumprod_first, fullgraph=True, backend="aot_eager")
    (got,) = torch.autograd.grad(compiled(xg[:3]).sum(), xg)
    (want,) = torch.autograd.grad(plain_first(xg[:3]).sum(), xg)
    torch.testing.assert_close(got, want)
    torch.library.opcheck(torch.ops.cumprod_ops.cumprod_custom, (x,))
    torch.testing.assert_close(ops.cumprod_custom(x), torch.cumprod(x, -1) ** 2)
    assert torch.autograd.gradcheck(ops.cumprod_custom, (xg,), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(ops.cumprod_custom, (xg,))


def test_prod_compile_and_custom_op_at_zeros(ops):
    x = _args((3, 5), zeros=ZEROS["two"])[0].detach()
    xg = x.clone().requires_grad_()
    compiled = torch.compile(ops.prod_first, fullgraph=True, backend="aot_eager")
    (got,) = torch.autograd.grad(compiled(xg[:3]).sum(), xg)
    (want,) = torch.autograd.grad(plain_prod_first(xg[:3]).sum(), xg)
    torch.testing.assert_close(got, want)
    ones = (1 - x).requires_grad_()  # the op takes prod(1 - ones) = prod(x), with zeros in its slices
    torch.library.opcheck(torch.ops.cumprod_ops.prod_custom, (ones.detach(),))
    torch.testing.assert_close(ops.prod_custom(ones), 1 - torch.prod(x, -1))
    assert torch.autograd.gradcheck(ops.prod_custom, (ones,), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(ops.prod_custom, (ones,))


def test_prod_jvp_and_vmap_at_zeros(ops):
    x, w = (a.detach() for a in _args((3, 5), (5,), zeros=ZEROS["two"]))
    t, s = torch.linspace(-1, 1, 15, dtype=DTYPE).reshape(3, 5), torch.ones(5, dtype=DTYPE)
    got = torch.func.jvp(ops.prod_op, (x, w), (t, s))
    torch.testing.assert_close(got, torch.func.jvp(plain_prod, (x, w), (t, s)))
    grad = torch.func.grad(lambda v: ops.prod_op(v, w).sum())
    want = torch.func.vmap(torch.func.grad(lambda v: plain_prod(v, w).sum()))(x)
    torch.testing.assert_close(torch.func.vmap(grad)(x), want)


@pytest.mark.parametrize(
    ("inputs", "formula", "expected"),
    [
        ("{x: 'Tensor[..., N]'}", "cumprod(x, dim=-2)", "dim=-2 is not a dimension of [..., N]; it takes -1 to -1"),
        ("{x: 'Tensor[M, N]'}", "cumprod(x, 2)", "it takes -2 to -1 or 0 to 1"),
        ("{x: 'Tensor'}", "cumprod(x, -1)", "needs a tensor of declared dimensions"),
        ("{x: 'Tensor[N]'}", "cumprod(x)", "takes a tensor and one dim"),
        ("{x: 'Tensor[..., N]'}", "prod(x, dim=-2)", "dim=-2 is not a dimension of [..., N]; it takes -1 to -1"),
        ("{x: 'Tensor[N]'}", "prod(x)", "prod() takes a tensor, one dim and `keepdim=`"),
        ("{x: 'Tensor[N]'}", "prod(x, -1, keepdim=2)", "`keepdim` of prod() must be true or false"),
    ],
)
def test_misuse_is_a_located_error(tmp_path, inputs, formula, expected):
    assert_located(tmp_path, inputs, formula, expected)
