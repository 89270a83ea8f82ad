"""ONNX export of every op and Module of `specs/`, in both forms, with both of torch's exporters
(`dynamo=True` and the TorchScript-based `dynamo=False`), run in onnxruntime against eager
(Note [outputs only] in opgen/runtime/machinery.py).

Building the exporter's tables costs seconds per `torch.onnx.export` call, so each exporter and
form exports one model that calls every op (and every Module) once; each op's test then compares
its own outputs. A model that fails to export fails every test of its exporter with the error.
"""

from __future__ import annotations

import importlib
import io
import logging
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import ROOT, SPECS, import_package

ort = pytest.importorskip("onnxruntime", reason="the `onnx` extra: pip install -e '.[onnx]'")
pytest.importorskip("onnxscript", reason="the `onnx` extra: pip install -e '.[onnx]'")

# Ops torch's exporters refuse, loudly (never a wrong model): `aten::special_i0e` has no ONNX translation
# in either exporter, nor has `aten::polygamma`; the TorchScript-based one has no `aten::logcumsumexp`.
NOT_EXPORTED = {"von_mises_nll", "gamma_fisher_logdet", "cox_partial_nll"}
SPEC_NAMES = sorted(p.stem for p in SPECS.glob("*.yaml") if p.stem not in NOT_EXPORTED)
EXPORTERS = ["dynamo", "torchscript"]
FORMS = ["function", "custom_op"]


def _float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.detach()
        return value.float() if value.is_floating_point() else value
    return value


def _calls(package: Any) -> list[tuple[str, Callable[..., Any], list[Any]]]:
    """(name, callable, arguments) of every op's functional, and of every Module as its generated test
    builds and calls it, in float32."""
    calls = []
    for name in SPEC_NAMES:
        t = importlib.import_module(f"{package.__name__}.tests.test_{name}")
        calls.append((name, t.OP.functional, [_float32(a) for a in t.sample_inputs()]))
        if hasattr(t, "test_module_matches_functional"):
            recorded: list[tuple[torch.nn.Module, list[Any]]] = []
            check = t.harness.check_module
            t.harness.check_module = lambda module, op, forward_args, full, into=recorded: into.append(
                (module, forward_args)
            )
            try:
                t.test_module_matches_functional()
            finally:
                t.harness.check_module = check
            ((module, forward_args),) = recorded
            calls.append(
                (f"{name}.module", _drawn(module.float().eval(), len(calls)), [_float32(a) for a in forward_args])
            )
    return calls


def _drawn(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """`module` with its parameters drawn at random: a parameter that keeps its `ones` or `zeros` init
    would hide a swapped operand, and two equal ones are merged by the TorchScript-based exporter into
    one initializer that the other's node no longer finds (torch's own LayerNorm beside an RMSNorm too)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(0.5 + torch.rand(parameter.shape, generator=generator))
    return module


class Everything(torch.nn.Module):
    """One model calling every op and Module: its inputs are their Tensor arguments in order, its
    outputs their outputs in order."""

    def __init__(self, calls: list[tuple[str, Callable[..., Any], list[Any]]]) -> None:
        super().__init__()
        self.calls = calls
        self.parts = torch.nn.ModuleList([fn for _, fn, _ in calls if isinstance(fn, torch.nn.Module)])

    def inputs(self) -> tuple[torch.Tensor, ...]:
        return tuple(a for _, _, args in self.calls for a in args if isinstance(a, torch.Tensor))

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(out for outs in self.by_op(tensors).values() for out in outs)

    def by_op(self, tensors: tuple[torch.Tensor, ...]) -> dict[str, list[torch.Tensor]]:
        """The outputs of each op (or `NAME.module`) for the model's inputs `tensors`."""
        given = iter(tensors)
        outputs = {}
        for name, fn, args in self.calls:
            out = fn(*(next(given) if isinstance(a, torch.Tensor) else a for a in args))
            outputs[name] = list(out) if isinstance(out, tuple) else [out]
        return outputs


def _onnx_bytes(model: Everything, exporter: str) -> bytes:
    inputs = model.inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)  # the dynamo exporter's progress lines
        try:
            if exporter == "dynamo":
                program = torch.onnx.export(model, inputs, dynamo=True, optimize=False)
                return program.model_proto.SerializeToString()
            buffer = io.BytesIO()
            torch.onnx.export(model, inputs, buffer, dynamo=False)
            return buffer.getvalue()
        finally:
            logging.disable(logging.NOTSET)


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """The golden package (Function form) and `specs/` generated in the custom_op form."""
    from opgen.cli import main

    root = tmp_path_factory.mktemp("onnx_custom_op")
    assert main(["generate", str(SPECS), "-o", str(root / "onnxops"), "--form", "custom_op", "-q"]) == 0
    return {"function": import_package(ROOT, "generated"), "custom_op": import_package(root, "onnxops")}


@pytest.fixture(scope="module")
def results(packages):
    """(form, exporter) -> (eager outputs, onnxruntime outputs) by op; exported once each, on first use."""
    cache: dict[tuple[str, str], Any] = {}

    def get(form: str, exporter: str) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        if (form, exporter) not in cache:
            cache[form, exporter] = RuntimeError(f"the {exporter} export of the {form} form failed, see its first test")
            model = Everything(_calls(packages[form]))
            session = ort.InferenceSession(_onnx_bytes(model, exporter), providers=["CPUExecutionProvider"])
            inputs = model.inputs()
            feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs, strict=True)}
            with torch.no_grad():
                eager = model.by_op(inputs)
            got = iter(session.run(None, feeds))
            cache[form, exporter] = eager, {name: [next(got) for _ in outs] for name, outs in eager.items()}
        if isinstance(cache[form, exporter], Exception):  # exported once: the first test has its error
            raise cache[form, exporter]
        return cache[form, exporter]

    return get


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", SPEC_NAMES)
def test_onnx_matches_eager(results, name, exporter, form):
    """The exported model computes every output of the op (and of its Module), in spec order, as eager
    does: no residual in place of an output (tanhshrink exported tanh(x), rms_norm its rstd)."""
    eager, onnx = results(form, exporter)
    parts = [key for key in eager if key == name or key == f"{name}.module"]
    for key in parts:
        assert len(onnx[key]) == len(eager[key])
        for got, expected in zip(onnx[key], eager[key], strict=True):
            assert tuple(got.shape) == tuple(expected.shape), key
            torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-4, atol=1e-5, check_dtype=False)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_modules_export_with_a_dynamic_batch(packages, exporter):
    """Exported with a dynamic batch dimension and run at another batch size, the normalizations and
    linear maps match eager: a size read from a parameter stays a constant (LayerNorm read its `D` from
    the input, which the TorchScript-based exporter cannot give `layer_norm` under a dynamic batch)."""
    ops = packages["function"]
    modules = [ops.LayerNorm(8), ops.RMSNorm(8), ops.Linear(8, 3), ops.Bilinear(8, 8, 3)]
    for index, module in enumerate(modules):
        module = _drawn(module.eval(), index)
        count = 2 if isinstance(module, ops.Bilinear) else 1
        names = [f"x{k}" for k in range(count)]
        traced = tuple(torch.randn(4, 8) for _ in names)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                batch = torch.export.Dim("batch")
                shapes = [{0: batch}] * count
                program = torch.onnx.export(module, traced, dynamo=True, dynamic_shapes=shapes, optimize=False)
                data = program.model_proto.SerializeToString()
            else:
                buffer = io.BytesIO()
                axes = {name: {0: "batch"} for name in names}
                torch.onnx.export(module, traced, buffer, dynamo=False, input_names=names, dynamic_axes=axes)
                data = buffer.getvalue()
        session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        other = tuple(torch.randn(7, 8) for _ in names)
        (got,) = session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), other, strict=True)})
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(got), module(*other), rtol=1e-4, atol=1e-5)
