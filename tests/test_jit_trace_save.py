"""`torch.jit.trace` + `torch.jit.save` of generated ops (Note [outputs only] in
opgen/runtime/machinery.py): the traced graph holds the op's forward as torch ops, its outputs only,
so it saves and loads; an op whose gradient the forward formula would lose keeps its Function (in-process
training keeps the override; saving it says so: export it to ONNX for inference)."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT, import_package


@pytest.fixture(scope="module")
def ops():
    return import_package(ROOT, "generated")


def test_traced_ops_save_load_and_train_with_their_gradient(ops, tmp_path):
    x = torch.linspace(-3, 3, 20000, dtype=torch.float64)  # above native_below: the Function's path
    weight = torch.rand(7, dtype=torch.float64) + 0.5
    rows = x[:14].reshape(2, 7)
    for name, fn, args in [("mish", ops.mish, (x,)), ("rms_norm", ops.rms_norm, (rows, weight))]:
        traced = torch.jit.trace(fn, args)
        path = tmp_path / f"{name}.pt"
        torch.jit.save(traced, str(path))
        loaded = torch.jit.load(str(path))
        torch.testing.assert_close(loaded(*args), fn(*args))  # the output, not a residual (rms_norm's rstd)
        leaf = args[0].detach().requires_grad_()
        loaded(leaf, *args[1:]).sum().backward()
        expected = args[0].detach().requires_grad_()
        fn(expected, *args[1:]).sum().backward()
        torch.testing.assert_close(leaf.grad, expected.grad)


def test_an_override_traces_with_its_gradient_and_saving_says_so(ops, tmp_path):
    x = torch.linspace(-2, 2, 9, dtype=torch.float64, requires_grad=True)
    traced = torch.jit.trace(ops.sign_ste, (x,))
    traced(x).sum().backward()
    torch.testing.assert_close(x.grad, (x.detach().abs() <= 1).double())  # the override, not sign's zero
    with pytest.raises(RuntimeError, match="Could not export Python function"):
        torch.jit.save(traced, str(tmp_path / "sign_ste.pt"))
