"""TorchScript and the generated ops (Note [TorchScript] in opgen/emit/op.py).

`torch.jit.trace` records every op of the library with its own gradient. `torch.jit.script` of a
functional raises an error that says what works instead; scripted code that calls an op (a scripted
module, a scripted function of the user's) runs it as a Python call, with its gradient, which
`torch.jit.save` refuses. Scripting a functional had failed on the first line TorchScript cannot read
("annotated assignments without assigned value aren't supported"), and so had every generated module."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch
from conftest import SPECS

from generated import sign_ste

NAMES = sorted(p.stem for p in SPECS.glob("*.yaml"))


def _tests(name: str):
    return importlib.import_module(f"generated.tests.test_{name}")


def _grads(outs, tensors, seeds):
    differentiable = [(o, s) for o, s in zip(outs, seeds, strict=True) if o.requires_grad]
    return torch.autograd.grad(
        [o for o, _ in differentiable],
        tensors,
        [s for _, s in differentiable],
        allow_unused=True,
        materialize_grads=True,
    )


@pytest.mark.parametrize("name", NAMES)
def test_trace_records_every_op_with_its_gradient(name):
    t = _tests(name)
    op = t.OP
    args = t.sample_inputs()
    present = [k for k in op.tensor_inputs if args[k] is not None]
    tensors = [args[k].detach().requires_grad_() for k in present]

    def call(*given):
        full = list(args)
        for k, tensor in zip(present, given, strict=True):
            full[k] = tensor
        return tuple(op(*full))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings: the traced graph is for these shapes
        traced = torch.jit.trace(call, tuple(tensors), check_trace=False)
    got, want = traced(*tensors), call(*tensors)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)
    seeds = [torch.randn_like(w) for w in want]
    for a, b in zip(_grads(got, tensors, seeds), _grads(want, tensors, seeds), strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)


@pytest.mark.parametrize("name", NAMES)
def test_scripting_a_functional_says_what_to_use_instead(name):
    says = f"TorchScript error: {name} runs a torch.autograd.Function, .* torch.compile, torch.export or torch.jit"
    with pytest.raises(RuntimeError, match=says):
        torch.jit.script(_tests(name).OP.functional)


def test_scripted_code_calls_an_op_with_its_gradient():
    @torch.jit.script
    def user(x: torch.Tensor) -> torch.Tensor:
        return sign_ste(x) * 2

    x = torch.linspace(-2, 2, 9, requires_grad=True)
    (got,) = torch.autograd.grad(user(x).sum(), x)
    torch.testing.assert_close(got, 2 * (x.abs() <= 1).float())  # the override, not sign's zero gradient


class _Calls(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sign_ste(x)


def test_saving_scripted_code_that_calls_an_op_is_refused(tmp_path):
    scripted = torch.jit.script(_Calls())
    x = torch.linspace(-2, 2, 9)
    torch.testing.assert_close(scripted(x), torch.sign(x))
    with pytest.raises(RuntimeError, match="Could not export Python function call 'sign_ste'"):
        torch.jit.save(scripted, str(tmp_path / "m.pt"))


MODULES = [n for n in NAMES if hasattr(_tests(n), "test_module_matches_functional")]


@pytest.mark.parametrize("name", MODULES)
def test_a_scripted_module_equals_the_module(name, monkeypatch):
    """Each module as its generated test builds it, scripted: same outputs and gradients."""
    t = _tests(name)
    checked = []

    def check_scripted(module, op, forward_args, full_args):
        scripted = torch.jit.script(module)
        got, want = scripted(*forward_args), module(*forward_args)
        got, want = (g if isinstance(g, tuple) else (g,) for g in (got, want))
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
        params = list(module.parameters())
        seeds = [torch.randn_like(w) for w in want]
        for a, b in zip(_grads(got, params, seeds), _grads(want, params, seeds), strict=True):
            torch.testing.assert_close(a, b)
        checked.append(name)

    monkeypatch.setattr(t.harness, "check_module", check_scripted)
    t.test_module_matches_functional()
    assert checked == [name]
