"""The generated `nn.Module`: parameters shaped from constructor args, init, `when:`, attributes, repr."""

from __future__ import annotations

import torch
from spec_ops import build_ops

SPEC = """\
name: affine_act
inputs:
  x: Tensor
  scale: Tensor
  shift: Tensor?
  slope: float
outputs:
  y: softplus(scale * x + shift) * slope
module:
  name: AffineAct
  args:
    features: int
    bias: bool = true
    negative_slope: float = 0.5
  parameters:
    scale: {shape: [features], init: constant(2.0)}
    shift: {shape: [features], init: uniform(-0.1, 0.1), when: bias}
  attributes:
    slope: negative_slope
"""


def test_module_parameters_init_when_and_repr(tmp_path):
    package = build_ops(tmp_path, "mods", {"affine_act": SPEC})
    with_bias = package.AffineAct(5)
    assert dict(with_bias.named_parameters()).keys() == {"scale", "shift"}
    assert with_bias.scale.shape == (5,) and torch.equal(with_bias.scale.detach(), torch.full((5,), 2.0))
    assert with_bias.shift.abs().max() <= 0.1
    assert repr(with_bias) == "AffineAct(features=5, bias=True, negative_slope=0.5)"

    no_bias = package.AffineAct(5, bias=False, negative_slope=0.25)
    assert no_bias.shift is None and "shift" in dict(no_bias._parameters)
    assert dict(no_bias.named_parameters()).keys() == {"scale"}

    x = torch.randn(3, 5, requires_grad=True)
    torch.testing.assert_close(with_bias(x), package.affine_act(x, with_bias.scale, with_bias.shift, 0.5))
    torch.testing.assert_close(no_bias(x), torch.nn.functional.softplus(2.0 * x) * 0.25)

    # Gradients flow to the parameters, summed back over the broadcast batch dimension.
    with_bias(x).sum().backward()
    expected = (torch.sigmoid(2.0 * x + with_bias.shift) * 0.5 * x).sum(0)
    torch.testing.assert_close(with_bias.scale.grad, expected.detach())


def test_reset_parameters_redraws(tmp_path):
    package = build_ops(tmp_path, "mods", {"affine_act": SPEC})
    module = package.AffineAct(4)
    with torch.no_grad():
        module.scale.zero_()
    module.reset_parameters()
    assert torch.equal(module.scale.detach(), torch.full((4,), 2.0))
