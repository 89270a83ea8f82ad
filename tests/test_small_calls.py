"""The per-call cost of a generated op: `apply` skips `Function.apply`'s signature binding
outside torch.func transforms (a third of a small call's time on torch 2.13), and behaves as
`Function.apply` everywhere: plain calls, under vmap/grad/jvp, on tensors escaped from a transform."""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import ROOT, SPECS, import_package

SPEC_NAMES = sorted(p.stem for p in SPECS.glob("*.yaml"))


@pytest.fixture(scope="module")
def ops():
    return import_package(ROOT, "generated")


def _function(ops, name):
    module = getattr(ops.ops, name)
    return next(v for k, v in vars(module).items() if k.endswith("Function") and not k.startswith("_"))


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_a_plain_call_binds_no_signature(ops, name, monkeypatch):
    """Outside transforms, `apply` never calls `inspect.signature` (what makes `Function.apply` slow)."""
    tests = __import__(f"generated.tests.test_{name}", fromlist=["OP"])
    args = tests.sample_inputs(seed=0)
    want = tests.OP(*args)
    calls = []
    real = inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda *a, **k: calls.append(a) or real(*a, **k))
    got = tests.OP(*args)
    assert calls == [], f"{name}: Function.apply bound forward's signature"
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_the_fast_apply_is_a_functions_apply(ops):
    silu = _function(ops, "silu")
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    y = silu.apply(x)
    assert type(y.grad_fn).__name__ == "SiluFunctionBackward"
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    torch.testing.assert_close(g, torch.func.grad(lambda t: torch.nn.functional.silu(t).sum())(x.detach()))
    # Under transforms the standard path: vmap, grad and jvp agree with PyTorch's op.
    batch = torch.randn(3, 5, dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(silu.apply)(batch), torch.nn.functional.silu(batch))
    _, tangent = torch.func.jvp(silu.apply, (batch,), (torch.ones_like(batch),))
    _, want = torch.func.jvp(torch.nn.functional.silu, (batch,), (torch.ones_like(batch),))
    torch.testing.assert_close(tangent, want)


def test_a_tensor_escaped_from_a_transform_is_taken_as_function_apply_takes_it(ops):
    """A tensor that leaks out of `grad` (a dead wrapper) gives what `Function.apply` gives."""
    silu = _function(ops, "silu")
    leaked = []
    torch.func.grad(lambda t: (leaked.append(t) or t).sum())(torch.randn(3, 4))
    standard = torch.autograd.Function.apply.__func__(silu, leaked[0])  # the apply it replaces
    torch.testing.assert_close(silu.apply(leaked[0]), standard)


# -- Note [small calls]: an op that is one PyTorch op calls it for small inputs -------------------

ONE_OP = {
    "silu": (lambda x: torch.nn.functional.silu(x), ()),
    "sigmoid": (torch.sigmoid, ()),
    "softplus": (lambda x, beta: torch.nn.functional.softplus(x, beta), (0.5,)),
    "gelu_tanh": (lambda x: torch.nn.functional.gelu(x, approximate="tanh"), ()),
    "mish": (torch.nn.functional.mish, ()),
    "relu6": (torch.nn.functional.relu6, ()),
}


@pytest.mark.parametrize("name", sorted(ONE_OP))
@pytest.mark.parametrize("size", [5, 20000])
def test_an_op_that_is_one_pytorch_op_matches_it_below_and_above_the_threshold(ops, name, size):
    """Below `native_below` elements the functional calls PyTorch's op (no Python autograd node),
    above it the Function; both give PyTorch's values, gradients, second derivatives and tangents."""
    function = _function(ops, name)
    native, extra = ONE_OP[name]
    op = getattr(ops, name)
    assert function.native_below == 16384
    x = torch.linspace(-8, 8, size, dtype=torch.float64).requires_grad_()
    y = op(x, *extra)
    assert isinstance(y.grad_fn, function._backward_cls) == (size >= function.native_below)
    want = native(x, *extra)
    torch.testing.assert_close(y, want)
    v = torch.cos(torch.arange(size, dtype=torch.float64))
    (g,) = torch.autograd.grad(y, x, v, create_graph=True)
    (w,) = torch.autograd.grad(want, x, v, create_graph=True)
    torch.testing.assert_close(g, w)
    torch.testing.assert_close(torch.autograd.grad(g.sum(), x)[0], torch.autograd.grad(w.sum(), x)[0])
    _, tangent = torch.func.jvp(lambda t: op(t, *extra), (x.detach(),), (v,))
    torch.testing.assert_close(tangent, torch.func.jvp(lambda t: native(t, *extra), (x.detach(),), (v,))[1])


@pytest.mark.parametrize("name", ["silu", "softplus", "relu6"])
def test_small_calls_keep_the_call_time_errors(ops, name):
    op = getattr(ops, name)
    extra = ONE_OP[name][1]
    with pytest.raises(TypeError, match=f"{name}\\(\\): argument 'x' must be a real floating-point Tensor"):
        op(torch.arange(4), *extra)
    with pytest.raises(TypeError, match="must be a real floating-point Tensor"):
        op([1.0, 2.0], *extra)


@pytest.mark.parametrize("name", ["softsign", "tanhshrink", "sign_ste", "huber", "swish", "softmax"])
def test_an_op_that_is_not_one_pytorch_op_always_calls_its_function(ops, name):
    """Composed formulas, gradient overrides, two tensor inputs, named dimensions: the Function."""
    assert not hasattr(_function(ops, name), "native_below")
    assert "native_below" not in (ROOT / "generated" / "ops" / f"{name}.py").read_text()
