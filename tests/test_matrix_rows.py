"""Matrix specs declared `Tensor[N, ...]` on one row and on several: values and gradients equal
PyTorch's own op, and gradcheck / gradgradcheck pass with and without the optional bias."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, import_package


@pytest.fixture(scope="module")
def generated():
    return import_package(ROOT, "generated")


def _tensors(generator, *shapes):
    return [torch.randn(s, generator=generator, dtype=torch.float64, requires_grad=True) for s in shapes]


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("with_bias", [True, False])
def test_bilinear_equals_f_bilinear(generated, rows, with_bias):
    generator = torch.Generator().manual_seed(rows)
    x1, x2, weight, bias = _tensors(generator, (rows, 3), (rows, 4), (2, 3, 4), (2,))
    bias = bias if with_bias else None
    inputs = [t for t in (x1, x2, weight, bias) if t is not None]
    got, want = generated.bilinear(x1, x2, weight, bias), F.bilinear(x1, x2, weight, bias)
    torch.testing.assert_close(got, want)
    grad = torch.randn(want.shape, generator=generator, dtype=torch.float64)
    for a, e in zip(torch.autograd.grad(got, inputs, grad), torch.autograd.grad(want, inputs, grad), strict=True):
        torch.testing.assert_close(a, e)

    def op(*tensors):
        return generated.bilinear(*tensors, None) if not with_bias else generated.bilinear(*tensors)

    assert torch.autograd.gradcheck(op, inputs)
    assert torch.autograd.gradgradcheck(op, inputs)


@pytest.mark.parametrize("rows", [1, 5])
def test_linear_gradgradcheck_on_rows(generated, rows):
    generator = torch.Generator().manual_seed(rows)
    x, weight, bias = _tensors(generator, (rows, 4), (3, 4), (3,))
    assert torch.autograd.gradcheck(generated.linear, [x, weight, bias])
    assert torch.autograd.gradgradcheck(generated.linear, [x, weight, bias])
    assert torch.autograd.gradgradcheck(lambda a, b: generated.linear(a, b, None), [x, weight])
