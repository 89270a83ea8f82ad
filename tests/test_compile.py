"""torch.compile(fullgraph=True) of every generated op, default and `--fuse` output: no graph break
(counted by `torch._dynamo.explain`), and forward values and gradients equal to the eager op's.

The compiled function runs with the `aot_eager` backend: Dynamo captures the forward and AOTAutograd
traces the op's backward as for any backend, without Inductor's code generation (seconds per op,
not tens; `tests/test_forward_mode.py` runs a few ops through Inductor). The fused package is
compared with the default package's eager op: the same formulas, computed without torch.compile.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import GENERATED, ROOT, SPECS, import_package

from opgen.emit.render import Renderer
from opgen.pipeline import build
from opgen.write.files import apply, changes

SPEC_NAMES = sorted(p.stem for p in SPECS.glob("*.yaml"))


def _golden():
    """The committed `generated` package (other tests import packages of that name from elsewhere)."""
    module = sys.modules.get("generated")
    if module is None or Path(module.__file__ or "").resolve().parent != GENERATED:
        module = import_package(ROOT, "generated")
    return module


@pytest.fixture(scope="module")
def fused(tmp_path_factory: pytest.TempPathFactory):
    """`specs/` generated once with `--fuse` (every op's forward and backward math under torch.compile)."""
    result = build([str(SPECS)], Renderer(), fuse=True)
    assert not result.problems, result.problems.report()
    folder = tmp_path_factory.mktemp("fused")
    apply(folder / "compiled_fused_ops", changes(folder / "compiled_fused_ops", result.files))
    return import_package(folder, "compiled_fused_ops")


def _as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


def _outputs_and_grads(op, functional, args):
    outs = _as_tuple(functional(*args))
    present = op.present(args)
    grads = torch.autograd.grad(
        sum(outs[k].sum() for k in op.differentiable),
        [args[k] for k in present],
        allow_unused=True,
        materialize_grads=True,
    )
    return outs, grads


def _check(name: str, functional) -> None:
    _golden()
    tests = importlib.import_module(f"generated.tests.test_{name}")
    op, args = tests.OP, tests.sample_inputs()
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        explained = torch._dynamo.explain(functional)(*args)
        assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
        assert explained.graph_count == 1
        torch._dynamo.reset()
        compiled = torch.compile(functional, fullgraph=True, backend="aot_eager")
        got = _outputs_and_grads(op, compiled, args)
    want = _outputs_and_grads(op, op.functional, args)
    for what, g, w in (("output", got[0], want[0]), ("gradient", got[1], want[1])):
        assert len(g) == len(w)
        for k, (a, b) in enumerate(zip(g, w, strict=True)):
            torch.testing.assert_close(a, b, msg=lambda m, k=k, what=what: f"{name}: {what} {k}: {m}")
    torch._dynamo.reset()


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_compile_fullgraph_of_every_spec_has_no_graph_break(name: str) -> None:
    _golden()
    _check(name, importlib.import_module(f"generated.tests.test_{name}").OP.functional)


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_compile_fullgraph_of_every_fused_spec_has_no_graph_break(fused, name: str) -> None:
    _golden()
    functional = importlib.import_module(f"generated.tests.test_{name}").OP.functional
    _check(name, getattr(fused, functional.__name__))
