"""`gradients:` overrides and `differentiable: false` outputs, on ops built from small specs."""

from __future__ import annotations

import inspect

import pytest
import torch
from spec_ops import build_ops

SPECS = {
    # An override reading a let, an output, a non-tensor input and `grad_<output>`; `w` keeps
    # its derived gradient.
    "mixed": """
        name: mixed
        inputs:
          x: Tensor
          w: Tensor
          scale: float = 2.0
        let:
          s: sigmoid(x)
        outputs:
          y: s * w
          z: x * w
        gradients:
          x: scale * grad_y * y * (1 - s) + grad_z
    """,
    # Two outputs that are not differentiable next to one that is.
    "split": """
        name: split
        inputs:
          x: Tensor
        outputs:
          y: where(x > 0, x**2, -x)
          mask: {formula: x > 0, differentiable: false}
          level: {formula: round(3 * x), differentiable: false}
    """,
    # A non-differentiable output used by an override of the differentiable one.
    "gate": """
        name: gate
        inputs:
          x: Tensor
        outputs:
          y: x * (x > 0)
          mask: {formula: x > 0, differentiable: false}
        gradients:
          x: grad * mask + 0.1 * grad * (1 - mask)
    """,
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return build_ops(tmp_path_factory.mktemp("overrides"), "override_ops", SPECS)


def inputs(*shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()


def test_override_is_exactly_the_formula_and_the_other_input_keeps_its_derivative(ops):
    x, w = inputs(3, 4), inputs(3, 4, seed=1)
    y, z = ops.mixed(x, w, 3.0)
    gy, gz = torch.randn_like(y), torch.randn_like(z)
    gx, gw = torch.autograd.grad([y, z], [x, w], [gy, gz])
    s = torch.sigmoid(x.detach())
    torch.testing.assert_close(gx, 3.0 * gy * (s * w.detach()) * (1 - s) + gz)
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    (want_w,) = torch.autograd.grad([torch.sigmoid(xr) * wr, xr * wr], [wr], [gy, gz])
    torch.testing.assert_close(gw, want_w)


def test_non_differentiable_outputs_are_marked_and_get_no_gradient(ops):
    x = inputs(5)
    y, mask, level = ops.split(x)
    assert y.requires_grad and not mask.requires_grad and not level.requires_grad
    torch.testing.assert_close(mask, (x > 0).to(x.dtype))
    torch.testing.assert_close(level, torch.round(3 * x.detach()))
    with pytest.raises(RuntimeError):
        torch.autograd.grad(level.sum(), x)
    assert "mark_non_differentiable(mask, level)" in inspect.getsource(ops.SplitFunction.setup_context)


def test_non_differentiable_outputs_do_not_break_backward_of_the_others(ops):
    x = inputs(6)
    y, mask, level = ops.split(x)
    (y * 2 + mask + level).sum().backward()  # the marked outputs join the graph as constants
    xr = x.detach().requires_grad_()
    torch.where(xr > 0, xr**2, -xr).sum().backward()
    torch.testing.assert_close(x.grad, 2 * xr.grad)
    assert torch.autograd.gradcheck(lambda t: ops.split(t)[0], (inputs(6, seed=2),))
    assert torch.autograd.gradgradcheck(lambda t: ops.split(t)[0], (inputs(6, seed=3),))


def test_an_override_may_read_a_non_differentiable_output(ops):
    x = inputs(8)
    y, mask = ops.gate(x)
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, x, g)
    positive = (x.detach() > 0).to(x.dtype)
    torch.testing.assert_close(gx, g * positive + 0.1 * g * (1 - positive))
