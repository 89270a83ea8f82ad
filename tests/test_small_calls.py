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
