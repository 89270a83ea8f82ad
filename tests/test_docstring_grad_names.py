"""The functional's docstring names each output's incoming gradient `grad` (one output) or
`grad_y`; when an input, let or output already has that name, the gradient's name gets `_`
appended: with an input `grad`, `grad_x = grad*grad` read as the input squared."""

from __future__ import annotations

import pytest
import torch
from spec_ops import build_ops

CASES = {
    "an input named grad": (
        {"x": "Tensor", "grad": "Tensor"},
        {"y": "x * grad"},
        ["grad_x = grad*grad_y", "grad_grad = grad_y*x"],
    ),
    "an output named like another's gradient": (
        {"x": "Tensor", "grad": "Tensor"},
        {"y": "x * grad", "grad_y": "x + grad"},
        ["grad_x = grad*grad_y_ + grad_grad_y", "grad_grad = grad_grad_y + grad_y_*x"],
    ),
    "the usual names": ({"x": "Tensor"}, {"y": "x * x"}, ["grad_x = 2*grad*x"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_incoming_gradients_are_named_apart_from_the_specs_names(tmp_path, case):
    inputs, outputs, want = CASES[case]
    lines = ["name: op", "inputs:", *(f"  {k}: {v}" for k, v in inputs.items())]
    lines += ["outputs:", *(f"  {k}: {v}" for k, v in outputs.items())]
    ops = build_ops(tmp_path, "grad_names", {"op": "\n".join(lines) + "\n"})
    doc = ops.op.__doc__
    assert [line.strip() for line in doc.split("Gradients:")[1].splitlines() if line.strip()] == want


def test_an_override_reads_an_input_named_grad_as_that_input(tmp_path):
    """In `gradients:` the spec's own names win, as in the docstring: `grad` is the input, `grad_y`
    the incoming gradient. `grad` was the incoming gradient, and the input could not be reached."""
    spec = (
        "name: op\ninputs:\n  x: Tensor\n  grad: Tensor\noutputs:\n  y: x * grad\ngradients:\n  x: grad_y * grad * 3\n"
    )
    ops = build_ops(tmp_path, "grad_override", {"op": spec})
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(5, dtype=torch.float64)
    seed = torch.rand(5, dtype=torch.float64)
    (got,) = torch.autograd.grad((ops.op(x, grad) * seed).sum(), x)
    torch.testing.assert_close(got, seed * grad * 3)
    assert "grad_x = 3*grad*grad_y  (override)" in ops.op.__doc__


OUTGOING = {
    "an input named like another's gradient": (
        {"x": "Tensor", "grad_x": "Tensor"},
        {"y": "x * grad_x + x**2"},
        ["grad_x_ = grad*(grad_x + 2*x)", "grad_grad_x = grad*x"],
        lambda x, grad_x: x * grad_x + x**2,
    ),
    "and an input named like that name": (
        {"x": "Tensor", "grad_x": "Tensor", "x_": "Tensor"},
        {"y": "x * grad_x * x_"},
        ["grad_x__ = grad*grad_x*x_", "grad_grad_x = grad*x*x_", "grad_x_ = grad*grad_x*x"],
        lambda x, grad_x, x_: x * grad_x * x_,
    ),
}


@pytest.mark.parametrize("case", sorted(OUTGOING))
def test_outgoing_gradients_are_named_apart_from_the_specs_names(tmp_path, case):
    """`grad_x = grad*(grad_x + 2*x)` read as a definition of the input `grad_x` in terms of itself: an input's
    gradient named like an input, let, output or incoming gradient gets `_` appended, as its local in backward."""
    inputs, outputs, want, reference = OUTGOING[case]
    lines = ["name: op", "inputs:", *(f"  {k}: {v}" for k, v in inputs.items())]
    lines += ["outputs:", *(f"  {k}: {v}" for k, v in outputs.items())]
    ops = build_ops(tmp_path, "grad_out_names", {"op": "\n".join(lines) + "\n"})
    doc = ops.op.__doc__
    assert [line.strip() for line in doc.split("Gradients:")[1].splitlines() if line.strip()] == want
    args = [torch.randn(4, dtype=torch.float64, requires_grad=True) for _ in inputs]
    assert torch.autograd.gradcheck(ops.op, tuple(args))
    # The op is the formula: its gradients are plain autograd's.
    want_y = reference(*args)
    seed = torch.randn(4, dtype=torch.float64)
    grads = [torch.autograd.grad(y, args, seed) for y in (ops.op(*args), want_y)]
    torch.testing.assert_close(*grads)


def test_gradients_read_the_lets_by_their_names():
    """A let the gradient computes reads by its name, whole (`p`, `ce`, `alpha_t`) or among a sum's terms
    (`1 - p*target - (1 - p)*(1 - target)` is `1 - p_t`): focal loss's gradient in two lines, not eight."""
    from conftest import ROOT, import_package

    doc = import_package(ROOT, "generated").focal_loss.__doc__
    gradients = doc.split("Gradients:")[1]
    assert "grad_logits = alpha_t*grad*(ce*gamma*p*(1 - p)*(1 - p_t)**(gamma - 1)" in gradients, gradients
    assert "sigmoid(" not in gradients and "softplus(" not in gradients
    huber = import_package(ROOT, "generated").huber.__doc__
    assert "grad_input = grad*where(abs(diff) < delta, diff, delta*sign(diff))" in huber
