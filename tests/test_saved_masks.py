"""A piecewise-linear primitive whose gradient needs only a condition saves that condition as a bool
mask, a byte an element, and its backward kernel reads the mask (Note [saved masks] in
opgen/nodes/kernels.py): counted in bytes and aten calls, and checked against plain autograd of the
same formula in float64, first and second order and forward mode."""

from __future__ import annotations

import pytest
import torch
from conftest import generate_specs

from benchmarks import work

OPS = {
    # name: (formula, plain torch, optimize section)
    "leaky": ("where(x > 0, x, s * x)", lambda x, s: torch.where(x > 0, x, s * x), ""),
    "leaky_speed": ("where(x > 0, x, s * x)", lambda x, s: torch.where(x > 0, x, s * x), "optimize: {policy: speed}\n"),
    "shrink": ("where(abs(x) > s, x, 0)", lambda x, s: torch.where(x.abs() > s, x, 0.0), ""),
    "leaky_times_x": ("where(x > 0, x, s * x) * x", lambda x, s: torch.where(x > 0, x, s * x) * x, ""),
}
N = 40000  # above the small-call size: the Function runs (Note [small calls])


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    head = "inputs:\n  x: Tensor\n  s: float = 0.1\noutputs:\n  y:"
    texts = {name: f"name: {name}\n{head} {formula}\n{extra}" for name, (formula, _, extra) in OPS.items()}
    return generate_specs(tmp_path_factory.mktemp("masks"), texts, "mask_ops")


def _x(n: int, dtype: torch.dtype = torch.float32, nan: bool = True) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(0), dtype=dtype)
    x[:3] = torch.tensor([0.0, -0.0, float("nan") if nan else 1.5], dtype=dtype)  # at the kink, and a NaN
    return x.requires_grad_()


@pytest.mark.parametrize(("name", "per_element"), [("leaky", 1), ("leaky_speed", 4), ("shrink", 1)])
def test_the_mask_is_saved_as_bool_and_read_by_the_kernel(ops, name, per_element):
    """A bool mask, one byte an element (the float input under `speed`, which spares forward's compare)."""
    counted = work.count_work(getattr(ops, name), [_x(N), -0.3])
    assert counted.saved == per_element * N
    assert counted.passes == 1 and {"leaky_relu_backward", "threshold_backward"} & set(counted.names)
    plain = work.count_work(OPS[name][1], [_x(N), -0.3])  # a bool mask, and six calls
    assert counted.passes <= plain.passes
    assert (counted.saved <= plain.saved) == (name != "leaky_speed")


def test_a_gradient_that_reads_the_input_saves_no_mask_beside_it(ops):
    counted = work.count_work(ops.leaky_times_x, [_x(N), 0.1])
    assert counted.saved == 4 * N  # x alone


@pytest.mark.parametrize("slope", [0.1, -0.3, 2.0, 0.0])
@pytest.mark.parametrize("name", sorted(OPS))
def test_gradients_are_plain_autograds(ops, name, slope):
    op, plain = getattr(ops, name), OPS[name][1]
    x = _x(N, torch.float64, nan=name != "shrink")  # F.hardshrink(nan) is nan, the formula's 0 (lowering)
    g = torch.randn(N, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y, want = op(x, slope), plain(x, slope)
    torch.testing.assert_close(y, want, equal_nan=True)
    got = torch.autograd.grad(y, x, g, create_graph=True)[0]
    expected = torch.autograd.grad(want, x, g, create_graph=True)[0]
    torch.testing.assert_close(got, expected, equal_nan=True)
    if expected.requires_grad:  # second order: where the gradient depends on x
        d = torch.randn_like(x)
        second = torch.autograd.grad((got * d).nansum(), x, allow_unused=True, materialize_grads=True)[0]
        again = torch.autograd.grad((expected * d).nansum(), x, allow_unused=True, materialize_grads=True)[0]
        torch.testing.assert_close(second, again, equal_nan=True)
    t = torch.randn_like(x)
    _, tangent = torch.func.jvp(lambda v: op(v, slope), (x.detach(),), (t,))
    _, tangent_plain = torch.func.jvp(lambda v: plain(v, slope), (x.detach(),), (t,))
    torch.testing.assert_close(tangent, tangent_plain, equal_nan=True)
    small = (torch.randn(20000, dtype=torch.float64) + 0.5).requires_grad_()  # no kink within gradcheck's step
    small = small.detach().masked_fill(small.abs() < 1e-3, 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda v: op(v, slope), (small,), fast_mode=True)
    assert torch.autograd.gradgradcheck(lambda v: op(v, slope), (small,), fast_mode=True)
