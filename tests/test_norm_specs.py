"""The norm, loss and gate specs (`rms_norm`, `layer_norm`, `cross_entropy`, `label_smoothing_ce`,
`kl_div`, `glu`, `swiglu`) against PyTorch's own ops: values, first derivatives of every input,
gradcheck and gradgradcheck in float64 at typical inputs, and float32 at extreme ones (logits up
to +-1e4, tiny and huge activations): wherever PyTorch's op is finite, the generated op is finite
and equal to it. The modules (`RMSNorm`, `LayerNorm`) against nn.RMSNorm and nn.LayerNorm.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, import_package


@pytest.fixture(scope="module")
def generated():
    return import_package(ROOT, "generated")


def _probabilities(shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype, zero: bool) -> torch.Tensor:
    p = torch.rand(shape, generator=generator, dtype=dtype) + 0.01
    if zero:
        p[..., 0] = 0  # a class with probability 0: 0 * log(0) = 0 (not for finite differences)
    return p / p.sum(-1, keepdim=True)


# name: (the op's arguments from (x-like scale, generator, dtype), PyTorch's op on the same arguments)
def _norm_args(shape, scale, generator, dtype):
    D = shape[-1]
    x = torch.randn(shape, generator=generator, dtype=dtype) * scale
    w = torch.randn(D, generator=generator, dtype=dtype)
    b = torch.randn(D, generator=generator, dtype=dtype)
    return x, w, b


CASES = {
    "rms_norm": (
        lambda s, g, d, z=True: _norm_args((2, 3, 8), s, g, d)[:2] + (1e-6,),
        lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps),
    ),
    "layer_norm": (
        lambda s, g, d, z=True: _norm_args((2, 3, 8), s, g, d) + (1e-5,),
        lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps),
    ),
    "cross_entropy": (
        lambda s, g, d, z=True: (torch.randn(4, 5, generator=g, dtype=d) * s, _probabilities((4, 5), g, d, z)),
        F.cross_entropy,
    ),
    "label_smoothing_ce": (
        lambda s, g, d, z=True: (torch.randn(4, 5, generator=g, dtype=d) * s, _probabilities((4, 5), g, d, z), 0.2),
        lambda x, t, eps: F.cross_entropy(x, t, label_smoothing=eps),
    ),
    "kl_div": (
        lambda s, g, d, z=True: (
            torch.log_softmax(torch.randn(4, 5, generator=g, dtype=d) * s, -1),
            _probabilities((4, 5), g, d, z),
        ),
        lambda x, t: F.kl_div(x, t, reduction="batchmean"),
    ),
    "glu": (
        lambda s, g, d, z=True: (torch.randn(2, 3, 8, generator=g, dtype=d) * s,),
        lambda x: F.glu(x, dim=-1),
    ),
    "swiglu": (
        lambda s, g, d, z=True: (torch.randn(2, 3, 8, generator=g, dtype=d) * s,),
        lambda x: F.silu(x.chunk(2, dim=-1)[0]) * x.chunk(2, dim=-1)[1],
    ),
}


def _tensors(args):
    return [a for a in args if torch.is_tensor(a)]


def _compare(op, native, args, rtol=None, atol=None):
    """Values and every input's first derivative equal PyTorch's, where PyTorch's are finite."""
    args = [a.detach().requires_grad_() if torch.is_tensor(a) else a for a in args]
    out, want = op(*args), native(*args)
    assert out.shape == want.shape
    finite = torch.isfinite(want)
    assert torch.isfinite(out[finite]).all(), (out, want)
    torch.testing.assert_close(out[finite], want[finite], rtol=rtol, atol=atol)
    grad = torch.ones_like(want)
    got = torch.autograd.grad(out, _tensors(args), grad, allow_unused=True)
    expected = torch.autograd.grad(want, _tensors(args), grad, allow_unused=True)
    for g, e in zip(got, expected, strict=True):
        if e is None:
            continue
        ok = torch.isfinite(e)
        assert torch.isfinite(g[ok]).all(), (g, e)
        torch.testing.assert_close(g[ok], e[ok], rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_pytorch_with_second_derivatives(generated, name):
    make, native = CASES[name]
    generator = torch.Generator().manual_seed(1)
    op = getattr(generated, name)
    _compare(op, native, make(1.0, generator, torch.float64))
    args = make(1.0, generator, torch.float64, False)
    _compare(op, native, args)
    tensors = [a.detach().requires_grad_() if torch.is_tensor(a) else a for a in args]
    assert torch.autograd.gradcheck(op, tensors, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(op, tensors)


@pytest.mark.parametrize("scale", [1e-4, 30.0, 1e3, 1e4])
@pytest.mark.parametrize("name", sorted(CASES))
def test_float32_at_extreme_inputs(generated, name, scale):
    make, native = CASES[name]
    generator = torch.Generator().manual_seed(2)
    args = make(scale, generator, torch.float32)
    _compare(getattr(generated, name), native, args, rtol=1e-4, atol=1e-5 * max(1.0, scale))


@pytest.mark.parametrize("name", ["cross_entropy", "label_smoothing_ce"])
def test_losses_finite_at_logits_far_apart(generated, name):
    x = torch.tensor([[1e4, 0.0, -1e4], [-1e4, -1e4, 1e4]], requires_grad=True)
    t = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])
    extra = (0.1,) if name == "label_smoothing_ce" else ()
    native = CASES[name][1]
    _compare(getattr(generated, name), native, (x, t, *extra), rtol=1e-5, atol=1e-3)


def test_kl_div_is_finite_where_the_target_is_zero(generated):
    x = torch.log_softmax(torch.randn(2, 3, dtype=torch.float64), -1)
    t = torch.tensor([[0.0, 0.3, 0.7], [1.0, 0.0, 0.0]], dtype=torch.float64)
    _compare(generated.kl_div, CASES["kl_div"][1], (x, t))


def test_rms_norm_module(generated):
    m = generated.RMSNorm(6, eps=1e-5)
    native = torch.nn.RMSNorm(6, eps=1e-5)
    assert dict(m.named_parameters()).keys() == {"weight"}
    torch.testing.assert_close(m.weight.detach(), torch.ones(6))
    assert str(m) == "RMSNorm(normalized_shape=6, eps=1e-05)"
    with torch.no_grad():
        m.weight.uniform_()
        native.weight.copy_(m.weight)
    x = torch.randn(2, 3, 6)
    torch.testing.assert_close(m(x), native(x))


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_module(generated, bias):
    m = generated.LayerNorm(6, bias=bias)
    native = torch.nn.LayerNorm(6, bias=bias)
    assert (m.bias is None) == (not bias)
    with torch.no_grad():
        for p, q in zip(m.parameters(), native.parameters(), strict=True):
            torch.testing.assert_close(p, q)  # the same init: ones, zeros
            p.uniform_()
            q.copy_(p)
    x = torch.randn(2, 3, 6, requires_grad=True)
    torch.testing.assert_close(m(x), native(x))
    (got,) = torch.autograd.grad(m(x).sum(), [x])
    (want,) = torch.autograd.grad(native(x).sum(), [x])
    torch.testing.assert_close(got, want)


def test_norm_shapes_are_checked_at_call_time(generated):
    with pytest.raises(ValueError, match="weight"):
        generated.rms_norm(torch.randn(2, 6), torch.ones(5))
    with pytest.raises(ValueError, match="target"):
        generated.cross_entropy(torch.randn(2, 6), torch.ones(2, 5))


def test_docstring_keeps_the_log_softmax_of_a_product_in_parentheses(generated):
    # `target * (input - logsumexp(...))` is computed as a saved log_softmax; the docstring shows it as the spec
    # wrote it, the product's factor in parentheses, and never the residual the code saves.
    doc = generated.cross_entropy.__doc__
    assert "loss = -mean(sum(target*(input - logsumexp(input, dim=-1, keepdim=true)), dim=-1), dim=-1)\n" in doc
    assert "grad_target = -grad*(input - logsumexp(input, dim=-1, keepdim=true))/N\n" in doc
    assert "saved_" not in doc


def _nth_derivatives(fn, args, order):
    """The `order`-th derivatives of a weighted sum of `fn(*args)`, each order weighted anew."""
    leaves = [a.detach().clone().requires_grad_(True) for a in args]
    out = fn(*leaves)
    total = (out * torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)).sum()
    for k in range(order):
        grads = torch.autograd.grad(total, leaves, create_graph=True, allow_unused=True, materialize_grads=True)
        weights = [torch.linspace(-1 + 0.3 * k, 1, g.numel(), dtype=g.dtype).reshape(g.shape) for g in grads]
        total = sum((g * weight).sum() for g, weight in zip(grads, weights, strict=True))
    return grads


@pytest.mark.parametrize("order", [3, 4])
def test_layer_norm_derivatives_of_every_order_are_its_formulas(generated, order):
    """PyTorch's double backward of `native_layer_norm_backward` is not differentiable again (F.layer_norm's
    third derivative is not its formula's): in double backward the generated op takes the gradients'
    formulas instead of the kernel (Note [layer norm under torch.func] in opgen/nodes/layer_norm.py)."""
    g = torch.Generator().manual_seed(3)
    x, w, b = (torch.randn(*s, dtype=torch.float64, generator=g) for s in ((4, 5), (5,), (5,)))

    def formula(x, w, b):
        centered = x - x.mean(-1, keepdim=True)
        return centered / torch.sqrt(x.var(-1, correction=0, keepdim=True) + 1e-5) * w + b

    got = _nth_derivatives(lambda x, w, b: generated.layer_norm(x, w, b, 1e-5), (x, w, b), order)
    want = _nth_derivatives(formula, (x, w, b), order)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e)
    first = torch.autograd.grad(generated.layer_norm(x.requires_grad_(), w, b, 1e-5).sum(), x)[0]
    torch.testing.assert_close(first, torch.autograd.grad(formula(x, w, b).sum(), x)[0])
