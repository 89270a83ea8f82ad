"""specs/linear.yaml: the format page's `linear` (section 4) with leading batch dimensions
(`Tensor[..., N, in_features]`, so `Linear` takes what nn.Linear takes; the page's 2-D example
is generated as written by tests/test_spec_format_examples.py): module, repr, gradients equal
to F.linear's.

Behaviour is checked against PyTorch's own `torch.nn.functional.linear`, and the memory
contract (backward saves the input and the weight, never the output or the product) with
`torch.autograd.graph.saved_tensors_hooks`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import GENERATED, ROOT, import_package


@pytest.fixture(scope="module")
def generated():
    return import_package(ROOT, "generated")


def test_module_parameters_bias_false_and_repr(generated):
    m = generated.Linear(4, 3)
    assert m.weight.shape == (3, 4) and m.bias.shape == (3,)
    assert dict(m.named_parameters()).keys() == {"weight", "bias"}
    no_bias = generated.Linear(4, 3, bias=False)
    assert no_bias.bias is None and "bias" in no_bias._parameters
    assert dict(no_bias.named_parameters()).keys() == {"weight"}
    assert str(m) == "Linear(in_features=4, out_features=3, bias=True)"
    assert str(no_bias) == "Linear(in_features=4, out_features=3, bias=False)"


def test_module_equals_functional(generated):
    m = generated.Linear(4, 3)
    x = torch.randn(5, 4)
    torch.testing.assert_close(m(x), generated.linear(x, m.weight, m.bias))
    torch.testing.assert_close(m(x), F.linear(x, m.weight, m.bias))


@pytest.mark.parametrize("with_bias", [True, False])
def test_gradients_equal_f_linear(generated, with_bias):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, generator=generator, dtype=torch.float64, requires_grad=True) if with_bias else None
    grad = torch.randn(5, 3, generator=generator, dtype=torch.float64)
    inputs = [t for t in (x, w, b) if t is not None]
    got_out = generated.linear(x, w, b)
    want_out = F.linear(x, w, b)
    torch.testing.assert_close(got_out, want_out)
    got = torch.autograd.grad(got_out, inputs, grad)
    want = torch.autograd.grad(want_out, inputs, grad)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e)


def test_only_the_needed_gradients_are_computed(generated):
    x = torch.randn(5, 4, dtype=torch.float64)
    w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64)
    out = generated.linear(x, w, b)
    (grad_w,) = torch.autograd.grad(out.sum(), [w])
    torch.testing.assert_close(grad_w, torch.ones(5, 3, dtype=torch.float64).T @ x)


def test_saves_the_input_and_the_weight_only(generated):
    x = torch.randn(5, 4, requires_grad=True)
    w = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = generated.linear(x, w, b)
    assert [t.data_ptr() for t in saved] == [x.data_ptr(), w.data_ptr()]
    assert all(t.data_ptr() != out.data_ptr() for t in saved)


def test_backward_is_the_hand_written_linear():
    source = (GENERATED / "ops" / "linear.py").read_text(encoding="utf-8")
    backward = source[source.index("def backward") : source.index("\ndef linear(")]
    for line in (
        "input, weight = ctx.saved_tensors",
        "grad_input = grad_out @ weight",
        "grad_weight = grad_out.transpose(-2, -1) @ input",  # batch dimensions summed by sum_to_size (a no-op in 2-D)
        "grad_weight = grad_weight.sum_to_size(ctx.weight_shape)",  # weight is saved only for grad_input
        "grad_bias = grad_out.sum(-2)",
    ):
        assert line in backward
    assert "einsum" not in backward


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("with_bias", [True, False])
def test_gradcheck_and_gradgradcheck(generated, rows, with_bias):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, generator=generator, dtype=torch.float64, requires_grad=True)
    inputs = (x, w, b) if with_bias else (x, w)
    assert torch.autograd.gradcheck(generated.linear, inputs)
    assert torch.autograd.gradgradcheck(generated.linear, inputs)


def test_a_batch_of_vectors_at_a_weight_in_every_mode(tmp_path):
    """`input: Tensor[..., K]` (nn.Linear's `[*, in_features]`, also a single vector) at `weight.T`:
    forward mode kept the tangent of a vector as a matrix `[1, K]`, one dimension too many."""
    from spec_ops import build_ops

    ops = build_ops(
        tmp_path,
        "dense_ops",
        {
            "dense": """\
                name: dense
                inputs:
                  input: Tensor[..., K]
                  weight: Tensor[M, K]
                  bias: Tensor[M]
                outputs:
                  y: input @ weight.T + bias
            """
        },
    )
    generator = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(4, 3, generator=generator, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    for shape in ((3,), (2, 3), (5, 2, 3)):
        x = torch.randn(shape, generator=generator, dtype=torch.float64)
        args, tangents = (x, weight, bias), tuple(torch.randn_like(a) for a in (x, weight, bias))
        _, ours = torch.func.jvp(ops.dense, args, tangents)
        _, theirs = torch.func.jvp(F.linear, args, tangents)
        torch.testing.assert_close(ours, theirs)
        torch.testing.assert_close(
            torch.func.jacrev(ops.dense)(x, weight, bias), torch.func.jacrev(F.linear)(x, weight, bias)
        )
        assert torch.autograd.gradgradcheck(ops.dense, tuple(a.requires_grad_() for a in args))
