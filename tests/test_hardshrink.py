"""hardshrink as users write it (specs/hardshrink.yaml): lowered to PyTorch's kernels (opgen.nodes.clips),
and exactly torch.nn.functional.hardshrink, values, gradients, second order and tangents, at its jumps too.
"""

from __future__ import annotations

import pytest
import sympy
import torch
import torch.nn.functional as F
from conftest import ROOT, import_package

from opgen.formula import functions as fn
from opgen.nodes.clips import hardshrink
from opgen.optimize import lower as lw


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    from opgen.cli import main

    out = tmp_path_factory.mktemp("shrink")
    assert main(["generate", str(ROOT / "specs" / "hardshrink.yaml"), "-o", str(out / "shrink_ops")]) == 0
    return import_package(out, "shrink_ops")


@pytest.fixture(params=["function", "small call"])
def op(ops, request, monkeypatch):
    """The functional through its autograd Function, and through the PyTorch ops it runs for small inputs."""
    if request.param == "function":
        monkeypatch.setattr(ops.ops.hardshrink.HardshrinkFunction, "native_below", 0)
    return ops.hardshrink


def _points(lambd: float, dtype: torch.dtype) -> torch.Tensor:
    jumps = [lambd, -lambd, 0.0, 1e-6, -1e-6, lambd * (1 + 1e-6), -lambd * (1 - 1e-6)]
    extreme = [-1e30, 1e30, 3e38 if dtype == torch.float32 else 1e300]
    return torch.tensor([*torch.linspace(-3, 3, 61).tolist(), *jumps, *extreme], dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lambd", [0.5, 0.0, 2.0, -0.5])
def test_values_and_gradients_are_pytorchs(op, lambd, dtype):
    x = _points(lambd, dtype).requires_grad_()
    got, want = op(x, lambd), F.hardshrink(x, lambd)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    g = torch.linspace(-2, 2, x.numel(), dtype=dtype)
    (got_grad,) = torch.autograd.grad(got, x, g)
    (want_grad,) = torch.autograd.grad(want, x, g)
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=0)  # 0 at the jumps +-lambd, as PyTorch's


def test_second_order_and_tangents_are_pytorchs(op):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, dtype=torch.float64, generator=generator) * 2
    x = x[(x.abs() - 0.5).abs() > 1e-3].requires_grad_()  # off the jumps, where differences are no slopes
    assert torch.autograd.gradcheck(lambda t: op(t, 0.5), (x,))
    assert torch.autograd.gradgradcheck(lambda t: op(t, 0.5), (x,))
    (g,) = torch.autograd.grad(op(x, 0.5).sum(), x, create_graph=True)
    (w,) = torch.autograd.grad(F.hardshrink(x, 0.5).sum(), x, create_graph=True)
    torch.testing.assert_close(g, w)
    (second,) = torch.autograd.grad(w.sum(), x)  # 0: PyTorch's kernel ties its gradient to x by a zero derivative
    if g.requires_grad:  # the small call: PyTorch's kernel
        torch.testing.assert_close(torch.autograd.grad(g.sum(), x)[0], second)
    else:  # the Function reads a saved mask, not x (Note [saved masks] in opgen/nodes/kernels.py), as plain
        # autograd of the formula `where(abs(x) > 0.5, x, 0)` does: the gradient is constant in x
        assert not torch.autograd.grad(torch.where(x.abs() > 0.5, x, 0).sum(), x, create_graph=True)[0].requires_grad
        assert not second.any()
    t = torch.randn_like(x)
    _, got = torch.func.jvp(lambda v: op(v, 0.5), (x.detach(),), (t,))
    _, want = torch.func.jvp(lambda v: F.hardshrink(v, 0.5), (x.detach(),), (t,))
    torch.testing.assert_close(got, want)


def test_the_op_calls_pytorchs_kernels():
    source = (ROOT / "generated" / "ops" / "hardshrink.py").read_text(encoding="utf-8")
    forward, backward = source.split("def forward")[1].split("def setup_context")[0], source.split("def backward")[1]
    assert "torch.nn.functional.hardshrink(x, lambd)" in forward and "where" not in forward
    # `g` where the saved mask `abs(x) > lambd` holds (Note [saved masks] in opgen/nodes/kernels.py); not
    # hardshrink_backward: it has no implementation for symbolic shapes, which torch.compile and the
    # custom_op form's opcheck trace
    assert "saved_mask = torch.abs(x) > lambd" in forward
    assert "torch.ops.aten.threshold_backward(grad_y, saved_mask, 0)" in backward


x, lambd = sympy.Symbol("x", real=True), sympy.Symbol("lambd", real=True)


@pytest.mark.parametrize(
    "formula",
    [
        fn.where(sympy.Abs(x) > lambd, x, 0),
        fn.where(sympy.Abs(x) <= lambd, 0, x),
        fn.where(lambd < sympy.Abs(x), x, 0),
        fn.where(sympy.Abs(x) > sympy.Rational(1, 2), x, 0),
    ],
)
def test_hardshrink_is_found(formula):
    assert lw.lower(formula, frozenset({lambd})).atoms(hardshrink)


@pytest.mark.parametrize(
    "formula",
    [
        fn.where(sympy.Abs(x) >= lambd, x, 0),  # x at +-lambd, where the kernel gives 0
        fn.where(sympy.Abs(x) < lambd, 0, x),  # the same
        fn.where(sympy.Abs(x) > lambd, 2 * x, 0),  # not the kernel's function
        fn.where(sympy.Abs(x) > lambd, x, 1),
    ],
)
def test_near_misses_stay_formulas(formula):
    assert not lw.lower(formula, frozenset({lambd})).atoms(hardshrink)


def test_a_bound_that_holds_a_tensor_stays_a_formula():
    y = sympy.Symbol("y", real=True)
    assert not lw.lower(fn.where(sympy.Abs(x) > y, x, 0), frozenset({lambd})).atoms(hardshrink)
