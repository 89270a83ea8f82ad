"""hardswish, hardsigmoid, smooth L1 and Snake as users write them (specs/): PyTorch's kernels, exactly.

The ops generated from the library's specs are compared with PyTorch's own op (values and
gradients, kinks included) in float32 and float64 at typical and extreme inputs, and their
double backward with gradgradcheck; Snake, which has no native op, with plain autograd of its
formula in float64.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, import_package

from opgen.formula import functions as fn
from opgen.nodes.clips import hardswish
from opgen.optimize import lower as lw

OPS = ("hardswish", "hardsigmoid", "smooth_l1", "snake")


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    from opgen.cli import main

    out = tmp_path_factory.mktemp("activations")
    assert main(["generate", *(str(ROOT / "specs" / f"{n}.yaml") for n in OPS), "-o", str(out / "act_ops")]) == 0
    return import_package(out, "act_ops")


def _points(dtype: torch.dtype) -> torch.Tensor:
    kinks = [-3.0, 3.0, -1.5, 0.0, 0.5, -0.5, 1e-6, -1e-6]
    extreme = [-1e30, 1e30, -1e4, 1e4, 3e38 if dtype == torch.float32 else 1e300]
    return torch.tensor([*torch.linspace(-8, 8, 65).tolist(), *kinks, *extreme], dtype=dtype)


NATIVE = {
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "smooth_l1": lambda d, t, beta: F.smooth_l1_loss(d, t, reduction="none", beta=beta),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["hardswish", "hardsigmoid"])
def test_hard_activations_are_pytorchs(ops, name, dtype):
    x = _points(dtype).requires_grad_()
    got, want = getattr(ops, name)(x), NATIVE[name](x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    (got_grad,) = torch.autograd.grad(got.sum(), x)
    (want_grad,) = torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(got_grad, want_grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("beta", [0.5, 1.0, 3.0])
def test_smooth_l1_is_pytorchs(ops, dtype, beta):
    d = _points(dtype)
    inp = d.clone().requires_grad_()
    target = (torch.arange(d.numel(), dtype=dtype) % 3 - 1).requires_grad_()  # at and off the kinks
    got, want = ops.smooth_l1(inp, target, beta), NATIVE["smooth_l1"](inp, target, beta)
    torch.testing.assert_close(got, want)
    grads = torch.autograd.grad(got.sum(), (inp, target))
    want_grads = torch.autograd.grad(want.sum(), (inp, target))
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)


def test_double_backward(ops):
    x = torch.tensor([-4.0, -2.5, -1.0, 0.3, 2.0, 2.9, 5.0], dtype=torch.float64, requires_grad=True)
    t = torch.linspace(-1, 1, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(ops.hardswish, (x,))
    assert torch.autograd.gradgradcheck(ops.hardsigmoid, (x,))
    assert torch.autograd.gradgradcheck(lambda a, b: ops.smooth_l1(a, b, 1.5), (x, t))
    a = torch.linspace(0.3, 2.5, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(ops.snake, (x, a))
    # The second derivative of each kernel is PyTorch's own.
    (g,) = torch.autograd.grad(ops.hardswish(x).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    (w,) = torch.autograd.grad(F.hardswish(x).sum(), x, create_graph=True)
    torch.testing.assert_close(gg, torch.autograd.grad(w.sum(), x)[0])


def _snake(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    return x + torch.sin(a * x) ** 2 / a


@pytest.mark.parametrize("scale", [1.0, 1e-3, 1e3])
def test_snake_is_no_less_accurate_than_its_formula(ops, scale):
    """Against float64 autograd of the formula: the float32 op errs no more than the float32 formula."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=generator) * scale
    a = torch.rand(4096, generator=generator) * 2.8 + 0.2
    exact = _values_and_grads(_snake, x.double(), a.double())
    naive = _values_and_grads(_snake, x, a)
    generated = _values_and_grads(ops.snake, x, a)
    for got, plain, want in zip(generated, naive, exact, strict=True):
        error, plain_error = (got.double() - want).abs(), (plain.double() - want).abs()
        assert error.max() <= 1.5 * plain_error.max() + 1e-6 * want.abs().max(), (scale, error.max(), plain_error.max())
        assert error.mean() <= 1.5 * plain_error.mean() + 1e-7 * want.abs().max()


def _values_and_grads(op, x: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x, a = x.clone().requires_grad_(), a.clone().requires_grad_()
    y = op(x, a)
    return (y.detach(), *torch.autograd.grad(y.sum(), (x, a)))


def test_snake_module_learns_a(ops):
    module = ops.Snake(5)
    assert torch.equal(module.a.detach(), torch.ones(5))
    x = torch.randn(3, 5)
    module(x).sum().backward()
    assert module.a.grad is not None and module.a.grad.shape == (5,)


def test_snake_backward_has_no_sinc_and_one_sine_per_term():
    """Note [sinc that buys nothing]: the slope in `a` divides by `a` in both terms anyway."""
    source = (ROOT / "generated" / "ops" / "snake.py").read_text()
    backward = source.split("def backward")[1].split("def jvp")[0]
    assert "sinc" not in backward and "cos" not in backward and backward.count("torch.sin(") == 2


def test_clamp_spelling_keeps_its_own_gradient_at_the_kinks():
    """`clamp` passes the gradient at -3 and 3 (-1/2, 3/2): not F.hardswish's (0, 1), so not lowered."""
    import sympy

    x = sympy.Symbol("x", real=True)
    lowered = lw.lower(x * fn.clamp(x + 3, 0, 6) / 6, frozenset())
    assert not lowered.atoms(hardswish)
