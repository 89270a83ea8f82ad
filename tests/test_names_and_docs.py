"""Spec text never changes what generated code does: hostile names and doc text."""

from __future__ import annotations

import torch
from spec_ops import build_ops

HOSTILE = '''\
name: torch
doc: |
  Ends early? """ or \'\'\' and a backslash \\ and {{ jinja }} {% if x %} and a tab\\t.
inputs:
  ctx: Tensor
  grad: Tensor
  self: float = 2.0
  sum: Tensor?
let:
  math: exp(-ctx)
outputs:
  input: self * ctx * grad + math * sum
  output: ctx * (1 + sum)
module:
  name: TorchFunction2
  args:
    size: int
  parameters:
    grad: {shape: [size], init: ones}
'''


def test_any_identifier_works_as_a_name(tmp_path):
    package = build_ops(tmp_path, "pkg", {"torch": HOSTILE})
    op = package.torch
    generator = torch.Generator().manual_seed(0)
    ctx, grad, sum_ = (torch.randn(5, dtype=torch.float64, generator=generator, requires_grad=True) for _ in range(3))

    out, other = op(ctx, grad, 3.0, sum_)
    torch.testing.assert_close(out, 3.0 * ctx * grad + torch.exp(-ctx) * sum_)
    torch.testing.assert_close(other, ctx * (1 + sum_))
    assert torch.autograd.gradcheck(lambda a, b, c: op(a, b, 3.0, c), [ctx, grad, sum_])
    assert torch.autograd.gradgradcheck(lambda a, b, c: op(a, b, 3.0, c), [ctx, grad, sum_])

    # `sum` is a `Tensor?`: None drops its terms and returns no gradient for it.
    out, other = op(ctx, grad, 3.0, None)
    torch.testing.assert_close(out, 3.0 * ctx * grad)
    torch.testing.assert_close(other, ctx)
    (grads) = torch.autograd.grad(out.sum() + other.sum(), [ctx, grad])
    torch.testing.assert_close(grads[0], 3.0 * grad + 1)

    module = package.TorchFunction2(5)
    torch.testing.assert_close(module.grad.detach(), torch.ones(5, dtype=module.grad.dtype))


def test_doc_text_reaches_the_docstring_verbatim(tmp_path):
    package = build_ops(tmp_path, "pkg2", {"torch": HOSTILE})
    doc = package.torch.__doc__
    assert "Ends early? \"\"\" or ''' and a backslash \\ and {{ jinja }} {% if x %} and a tab\\t." in doc


# Generated code that reads the torch module where a name of the spec may stand: a count of broadcast
# inputs in setup_context, zeros for a None gradient of a residual in double backward (amax's, var's).
NAMED_TORCH = {
    "count": "name: count\ninputs:\n  t: Tensor\n  w: Tensor\noutputs:\n  torch: mean((t < -0.75) * w) + mean(t * w)\n",
    "residuals": (
        "name: residuals\ninputs:\n  torch: Tensor[..., D]\n"
        "outputs:\n  y: amax(torch, dim=-1, keepdim=true) + var(torch, dim=-1, keepdim=true) * torch\n"
    ),
}


def test_a_name_torch_does_not_hide_the_torch_module(tmp_path):
    package = build_ops(tmp_path, "pkg3", NAMED_TORCH)
    generator = torch.Generator().manual_seed(0)
    t, w = (torch.randn(2, 3, dtype=torch.float64, generator=generator, requires_grad=True) for _ in range(2))
    torch.testing.assert_close(package.count(t, w), ((t < -0.75) * w).mean() + (t * w).mean())
    assert torch.autograd.gradcheck(package.count, [t, w])
    assert torch.autograd.gradgradcheck(package.residuals, [t])


# A bool input prints as `int(flag)` in formulas: not where a let hides `int`, nor the module's own `int`.
NAMED_INT = {
    "hidden": "name: hidden\ninputs:\n  x: Tensor[..., K, M]\n  b: bool\nlet:\n  int: K\noutputs:\n  y: b * int + x\n",
    "int": "name: int\ninputs:\n  x: Tensor\n  b: bool\noutputs:\n  y: b * x + b\n",
}


def test_a_name_int_does_not_hide_the_bool_conversion(tmp_path):
    package = build_ops(tmp_path, "pkg4", NAMED_INT)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    for flag in (True, False):
        torch.testing.assert_close(package.hidden(x, flag), flag * 3 + x)
        torch.testing.assert_close(package.int(x, flag), flag * x + flag)
    assert torch.autograd.gradcheck(lambda x: package.hidden(x, True) * package.int(x, True), [x])
