"""Backward does no work that buys nothing (issue 24): counted on the committed generated ops with
the work benchmark's counter (benchmarks/work.py), and checked against plain autograd of the
spec's formula (the generated test's `reference`) in float64, first and second order."""

from __future__ import annotations

import importlib

import torch
from conftest import ROOT, import_package

from benchmarks import work


def _op(name: str):
    import_package(ROOT, "generated")
    tests = importlib.import_module(f"generated.tests.test_{name}")
    return tests, importlib.import_module(f"generated.ops.{name}")


def _backward_calls(name: str, outputs: int | None = None) -> tuple[str, ...]:
    tests, module = _op(name)
    args = work.scaled_inputs(tests, 2)
    with work.through_functions(module):
        return work.count_work(tests.OP.functional, args, outputs).names


def _derivatives(call, args, inputs, grad):
    """First derivatives along `grad`, and the second along a fixed direction, of the first output."""
    out = call(*args)
    first = torch.autograd.grad(out, inputs, grad, create_graph=True)
    generator = torch.Generator().manual_seed(2)
    directions = [torch.randn(g.shape, generator=generator, dtype=g.dtype) for g in first]
    total = sum((g * d).sum() for g, d in zip(first, directions, strict=True))
    second = torch.autograd.grad(total, inputs, allow_unused=True, materialize_grads=True)
    return [*first, *second]


def _matches_reference(name: str) -> None:
    """Gradients and second derivatives of the generated op equal plain autograd of the formula, float64."""
    tests, module = _op(name)
    args = tests.sample_inputs(getattr(tests, "BATCHED_SHAPES", None) or tests.SHAPES)
    inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    first = tests.OP.outputs[0]

    def mine(*values):
        out = tests.OP.functional(*values)
        return out[0] if isinstance(out, tuple) else out

    grad = torch.randn_like(tests.reference(*args)[first])
    with work.through_functions(module):
        got = _derivatives(mine, args, inputs, grad)
    expected = _derivatives(lambda *v: tests.reference(*v)[first], args, inputs, grad)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)


def test_no_zeros_for_outputs_without_a_gradient():
    # Note [no zeros for outputs without a gradient]: layer_norm's mean and rstd, quantize_ste's code.
    for name in ("layer_norm", "rms_norm", "quantize_ste"):
        assert "zeros" not in _backward_calls(name), name
    assert _backward_calls("layer_norm").count("native_layer_norm_backward") == 1
    _matches_reference("layer_norm")
    _matches_reference("rms_norm")


def test_backward_without_an_incoming_gradient_returns_none():
    tests, module = _op("layer_norm")
    function = module.LayerNormFunction
    args = tests.sample_inputs()
    with work.through_functions(module):
        out = function.apply(*args)
    assert all(g is None for g in out[0].grad_fn.apply(None, None, None))


def test_mish_backward_is_pytorchs_kernel_with_its_digits():
    # opgen.nodes.activations.mish: one call, float32 against float64 no worse than the in-place form
    # it replaces (1.5e-6 relative at worst, outside the zero of mish' near -1.19).
    assert _backward_calls("mish") == ("detach", "mish_backward")
    tests, module = _op("mish")
    x64 = torch.linspace(-30, 30, 60001, dtype=torch.float64, requires_grad=True)
    exact = torch.autograd.grad(tests.reference(x64)["y"].sum(), x64)[0]
    x = x64.detach().float().requires_grad_()
    with work.through_functions(module):
        mine = torch.autograd.grad(module.mish(x).sum(), x)[0].double()
    relative = ((mine - exact).abs() / exact.abs().clamp_min(1e-30))[(x64 > -1) | (x64 < -1.4)]
    assert float(relative.max()) < 1.5e-6
    _matches_reference("mish")
