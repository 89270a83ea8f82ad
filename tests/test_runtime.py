"""The generated package's `_runtime.py` (opgen/runtime/machinery.py): the machinery every op shares,
written once. Op files keep their formulas, touch no torch internals and need no `type: ignore`; each
internal the runtime uses has a fallback that gives the same results where a torch release lacks it;
names of a spec that equal a runtime function's do not hide it."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import GENERATED, import_package
from spec_ops import build_ops
from test_generated_style import UNUSUAL_SPECS

import generated  # at collection: a test may later import another package of that name
from generated import _runtime
from generated.ops import swish

OP_FILES = sorted(p for p in (GENERATED / "ops").glob("*.py") if p.name != "__init__.py")
# torch's private modules and functions (`torch._C`, `torch.fx._symbolic_trace`); aten's operators
# (`torch.ops.aten._softmax_backward_data`) are the dispatcher's own names, not private modules.
PRIVATE = re.compile(r"\btorch(\.(?!ops\b)[A-Za-z0-9]+)*\._[A-Za-z]")


def test_op_files_touch_no_torch_internals_and_need_no_type_ignore():
    assert len(OP_FILES) >= 49
    for path in OP_FILES:
        source = path.read_text(encoding="utf-8")
        assert not PRIVATE.search(source), f"{path.name}: {PRIVATE.search(source).group(0)}"
        assert "type: ignore" not in source, path.name
        assert "Note [" not in source, f"{path.name} cites a Note its reader cannot open"


def test_the_runtime_is_the_one_place_with_torch_internals():
    source = (GENERATED / "_runtime.py").read_text(encoding="utf-8")
    internals = set(re.findall(r'"((?:_C|_functorch|fx\._symbolic_trace|onnx\._internal)[A-Za-z_.]*)"', source))
    assert internals == {
        "_C._are_functorch_transforms_active",
        "_functorch.utils.unwrap_dead_wrappers",
        "_C._functorch.is_legacy_batchedtensor",
        "_C._is_any_autocast_enabled",
        "fx._symbolic_trace.is_fx_symbolic_tracing",
        "onnx._internal.torchscript_exporter.registration.registry",  # ONNX translations never over torch's
        "_functorch.pyfunctorch.retrieve_all_functorch_interpreters",  # forward mode inside forward mode
        "_C._functorch.TransformType.Jvp",
    }


def _values_and_gradients(op, *inputs):
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = op(*leaves)
    outputs = out if isinstance(out, tuple) else (out,)
    total = sum(o.sum() for o in outputs)
    wanted = [t for t in leaves if t.requires_grad]
    firsts = torch.autograd.grad(total, wanted, create_graph=True)
    seconds = torch.autograd.grad(sum(g.sum() for g in firsts), wanted, allow_unused=True)
    return [o.detach() for o in outputs], [g.detach() for g in firsts], seconds


CASES = {
    "silu": lambda g: (torch.randn(64, 300, dtype=torch.float64, generator=g, requires_grad=True),),
    "mish": lambda g: (torch.randn(64, 300, dtype=torch.float64, generator=g, requires_grad=True),),
    "logsigmoid": lambda g: (torch.randn(64, 300, dtype=torch.float64, generator=g, requires_grad=True),),
    "glu": lambda g: (torch.randn(8, 6, dtype=torch.float64, generator=g, requires_grad=True),),
    "layer_norm": lambda g: (
        torch.randn(4, 5, dtype=torch.float64, generator=g, requires_grad=True),
        torch.randn(5, dtype=torch.float64, generator=g, requires_grad=True),
        torch.randn(5, dtype=torch.float64, generator=g, requires_grad=True),
    ),
    "linear": lambda g: (
        torch.randn(3, 4, dtype=torch.float64, generator=g, requires_grad=True),
        torch.randn(2, 4, dtype=torch.float64, generator=g, requires_grad=True),
        torch.randn(2, dtype=torch.float64, generator=g, requires_grad=True),
    ),
}
FALLBACKS = [
    "_transforms_active",
    "_unwrap_dead_wrappers",
    "_legacy_batched",
    "_autocast_enabled",
    "_fx_tracing",
    "_jit_tracing",
]


@pytest.mark.parametrize("missing", FALLBACKS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_fallback_gives_what_the_internal_gives(monkeypatch, name, missing):
    """A torch release without one of the internals: the runtime's fallback path (the plain formula,
    PyTorch's own apply, the autocast and FX checks always made) computes the same values, first and
    second derivatives, and vmap and forward mode still work."""
    op = getattr(generated, name)
    inputs = CASES[name](torch.Generator().manual_seed(7))
    expected = _values_and_gradients(op, *inputs)
    monkeypatch.setattr(_runtime, missing, None)
    got = _values_and_gradients(op, *inputs)
    for want, have in zip(expected, got, strict=True):
        for a, b in zip(want, have, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
    plain = [t.detach() for t in inputs]
    tangents = [torch.ones_like(t) for t in plain]
    first = op(*plain)
    _, tangent = torch.func.jvp(lambda *a: op(*a), tuple(plain), tuple(tangents))
    assert tangent.shape == first.shape and torch.isfinite(tangent).all()
    stacked = [torch.stack([t, 2 * t]) for t in plain]
    batched = torch.func.vmap(op)(*stacked)
    torch.testing.assert_close(batched[0], first)


def test_fx_capture_keeps_the_op_one_node_without_the_tracing_internal(monkeypatch):
    monkeypatch.setattr(_runtime, "_fx_tracing", None)

    class Model(torch.nn.Module):
        def forward(self, x):
            return generated.sign_ste(x) * 2

    graph = torch.fx.symbolic_trace(Model())
    targets = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert generated.sign_ste in targets
    x = torch.linspace(-0.9, 0.9, 5, requires_grad=True)
    graph(x).sum().backward()
    eager = x.detach().clone().requires_grad_()
    (generated.sign_ste(eager) * 2).sum().backward()
    torch.testing.assert_close(x.grad, eager.grad)
    assert (x.grad == 2).all()  # the straight-through gradient, not sign's zero


def test_the_twin_without_jvp_shares_everything_but_the_jvp():

    twin = swish._SwishFunctionNoJvp
    assert issubclass(twin, swish.SwishFunction)
    assert twin.jvp is torch.autograd.Function.jvp
    assert swish.SwishFunction.jvp is not torch.autograd.Function.jvp
    assert twin.forward is swish.SwishFunction.forward and twin.backward is swish.SwishFunction.backward
    assert issubclass(swish.SwishFunction, _runtime.Function)


def test_scripting_the_functional_names_what_works():
    with pytest.raises(Exception, match="silu runs a torch.autograd.Function"):
        torch.jit.script(generated.silu)


def test_spec_names_equal_to_runtime_names_do_not_hide_them(tmp_path):
    """Inputs and lets named like the runtime's functions: the module imports those under other names."""
    ops = build_ops(tmp_path, "clash_ops", {"capture": UNUSUAL_SPECS["capture"]})
    source = (tmp_path / "clash_ops" / "ops" / "capture.py").read_text(encoding="utf-8")
    assert "from .._runtime import Function as Function_\n" in source.split("class ")[0]
    a = torch.randn(3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = ops.capture(a, b)
    torch.testing.assert_close(y, torch.sin(a * b) * 2.0)
    assert torch.autograd.gradcheck(ops.capture, (a, b))
    with pytest.raises(TypeError, match=r"capture\(\): argument 'Function' must be a real Tensor"):
        ops.capture(torch.ones(3, dtype=torch.complex64), b)
    imported = import_package(tmp_path, "clash_ops")
    assert imported.capture is not None


def test_arguments_on_two_devices_are_named_with_the_op():
    """torch's own message ("Tensor on device meta is not on the expected device cpu!") names neither
    the op nor the argument; the functional's check does, before any formula runs. A 0-dim CPU tensor
    goes with any device, as in PyTorch's ops. (The meta device stands in for a GPU.)"""
    x, on_meta = torch.randn(4, 3), torch.randn(4, 3, device="meta")
    with pytest.raises(RuntimeError, match=r"^huber\(\): argument 'target' is on meta but 'input' is on cpu; "):
        generated.huber(x, on_meta)
    assert generated.huber(on_meta, torch.tensor(0.5)).device.type == "meta"
    assert generated.huber(x, torch.randn(3)).shape == (4, 3)
