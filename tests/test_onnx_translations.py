"""The TorchScript-based ONNX exporter (`torch.onnx.export(..., dynamo=False)`) lacks translations of
PyTorch ops that generated forwards call (expm1, asinh, logaddexp, trunc, hypot, ...); the generated package
registers them (`_onnx_translations` in opgen/runtime/machinery.py). Each is checked here through an
op whose forward calls it, in onnxruntime against eager, at ordinary points and at the special ones
(zeros, signed infinities where the op is defined there)."""

from __future__ import annotations

import importlib
import io
import logging
import warnings

import pytest
import torch
from conftest import generate_specs

ort = pytest.importorskip("onnxruntime", reason="the `onnx` extra: pip install -e '.[onnx]'")

# op name: (formula of x and y, the torch call its forward makes)
FORMULAS = {
    "expm1_op": ("exp(x) - 1", "torch.expm1("),
    "erfc_op": ("erfc(x)", "erfc("),
    "sinh_cosh_op": ("sinh(x) * cosh(y)", "torch.cosh("),
    "asinh_op": ("asinh(x)", "torch.asinh("),
    "acosh_op": ("acosh(1 + x**2)", "torch.acosh("),
    "atanh_op": ("atanh(x / 8)", "torch.atanh("),
    "trunc_op": ("trunc(x) * y", "torch.trunc("),
    "frac_op": ("frac(x)", "torch.trunc("),
    "hypot_op": ("sqrt(x**2 + y**2)", "torch.hypot("),
    "logaddexp_op": ("log(exp(x) + exp(y))", "torch.logaddexp("),
    "logaddexp2_op": ("log2(2**x + 2**y)", "torch.logaddexp"),
}
X = torch.tensor([-3.7, -1.5, -0.5, -0.0, 0.0, 0.25, 0.5, 1.5, 2.9, 7.5])
Y = torch.tensor([1.5, -2.0, 0.5, 3.0, -0.25, 0.25, -0.5, 1.5, 2.9, -7.5])


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    specs = {
        name: f"name: {name}\ninputs:\n  x: Tensor\n  y: Tensor\noutputs:\n  out: {formula}\n"
        for name, (formula, _) in FORMULAS.items()
    }
    return generate_specs(tmp_path_factory.mktemp("onnx_translations"), specs, "onnx_translations")


class Call(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x, y):
        return self.op(x, y)


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_the_torchscript_exporter_translates_what_forward_calls(ops, name):
    source = importlib.import_module(f"{ops.__name__}.ops.{name}").__file__
    with open(source, encoding="utf-8") as file:
        assert FORMULAS[name][1] in file.read(), "the forward no longer calls the op this test translates"
    op = getattr(ops, name)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        torch.onnx.export(Call(op), (X, Y), buffer, dynamo=False, input_names=["x", "y"])
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}  # an input the graph never reads is left out
    (got,) = session.run(None, {k: v.numpy() for k, v in (("x", X), ("y", Y)) if k in wanted})
    torch.testing.assert_close(torch.from_numpy(got), op(X, Y), rtol=1e-5, atol=1e-6, equal_nan=True)
