"""The logic of benchmarks/gpu.py on the CPU, the device a parameter: an op that matches plain autograd
passes in float32 and under autocast, one that is off by a little or not finite where plain
autograd is fails, and timing runs every variant. Fast: a few ops, small sizes."""

from __future__ import annotations

import dataclasses
import importlib
import types

import pytest
import torch
from conftest import ROOT, import_package

from benchmarks import gpu

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def package():
    import_package(ROOT, "generated")
    return "generated"


def _tests(name: str):
    return importlib.import_module(f"generated.tests.test_{name}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["silu", "kl_div", "linear"])
def test_a_generated_op_passes(package, name, dtype):
    check = gpu.check_op(_tests(name), name, CPU, dtype)
    assert check.ok and check.finite
    assert check.error <= gpu.FACTOR * check.naive_error + gpu.SLACK[dtype]


def _altered(name: str, change) -> types.ModuleType:
    """The generated test module of `name` with its op's functional changed."""
    tests = _tests(name)
    module = types.ModuleType(tests.__name__)
    module.OP = dataclasses.replace(tests.OP, functional=lambda *args: change(tests.OP.functional(*args)))
    module.sample_inputs, module.reference = tests.sample_inputs, tests.reference
    return module


def test_an_op_off_by_a_little_fails(package):
    check = gpu.check_op(_altered("silu", lambda y: y * (1 + 1e-3)), "silu", CPU, "float32")
    assert check.finite and not check.ok
    assert check.error > 1e-4 > check.naive_error


def test_an_op_not_finite_where_plain_autograd_is_fails(package):
    def nan_at_first(y: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros_like(y, dtype=torch.bool).flatten()
        mask[0] = True
        return torch.where(mask.view(y.shape), torch.nan, y)

    check = gpu.check_op(_altered("silu", nan_at_first), "silu", CPU, "float32")
    assert not check.finite and not check.ok


def test_timing_runs_each_variant(package):
    (spec,) = gpu.load_specs(ROOT / "specs", lambda s: s.name == "silu")
    timing = gpu.time_op(package, spec, 4096, CPU, repeats=1, compile=False)
    assert set(timing.seconds) == {"generated", "native"}
    assert all(t > 0 for t in timing.seconds.values())
    (row,) = list(gpu.time_table([timing]))[2:]
    assert row.startswith("| silu | 4,096 |")


def test_without_cuda_it_says_so_and_exits_0(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out
