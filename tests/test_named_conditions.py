"""A `bool` input, or a let or output that is a condition, may stand where a condition is wanted
(Note [named conditions] in opgen/formula/read.py): ops built from small specs against plain torch."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
from spec_ops import build_ops

from opgen.emit.render import Renderer
from opgen.pipeline import build

SPECS = {
    # A named mask in a let (Huber's `small`), used bare as where()'s condition.
    "huber_named": """
        name: huber_named
        inputs:
          x: Tensor
          t: Tensor
          delta: float = 1.0
        let:
          small: abs(x - t) < delta
        outputs:
          y: where(small, 0.5 * (x - t) ** 2, delta * (abs(x - t) - 0.5 * delta))
    """,
    # A bool input as a condition, also under `~` and `&`.
    "flagged": """
        name: flagged
        inputs:
          x: Tensor
          flag: bool = true
        outputs:
          y: where(flag, x * x, x)
          z: where(~flag & (x > 0), x, 0.5 * x)
    """,
    # A non-differentiable mask output (through a let that renames a let) read by an override.
    "masked_ste": """
        name: masked_ste
        inputs:
          x: Tensor
        let:
          inside: abs(x) <= 1
          alias: inside
        outputs:
          y: round(x * 4) / 4
          m: {formula: alias, differentiable: false}
        gradients:
          x: where(m, grad, 0)
        tests:
          gradgrad: false
    """,
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return build_ops(tmp_path_factory.mktemp("named_conditions"), "named_conditions_ops", SPECS)


def _grads(f, *args):
    xs = [a.detach().clone().requires_grad_() for a in args]
    out = f(*xs)
    torch.manual_seed(1)
    v = torch.randn_like(out)
    return out.detach(), torch.autograd.grad((out * v).sum(), xs)


def test_a_let_that_is_a_condition_is_a_condition(ops):
    x, t = torch.randn(50, dtype=torch.float64) * 2, torch.randn(50, dtype=torch.float64)
    got = _grads(lambda a, b: ops.huber_named(a, b, 0.7), x, t)
    want = _grads(lambda a, b: torch.nn.functional.huber_loss(a, b, reduction="none", delta=0.7), x, t)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("flag", [True, False])
def test_a_bool_input_is_a_condition(ops, flag):
    x = torch.randn(20, dtype=torch.float64)
    y, z = ops.flagged(x, flag)
    torch.testing.assert_close(y, x * x if flag else x)
    torch.testing.assert_close(z, 0.5 * x if flag else torch.where(x > 0, x, 0.5 * x))
    (g,) = torch.autograd.grad(ops.flagged(x.requires_grad_(), flag)[0].sum(), [x])
    torch.testing.assert_close(g, 2 * x.detach() if flag else torch.ones_like(x))


def test_a_mask_output_is_a_condition_of_an_override(ops):
    x = torch.linspace(-2, 2, 41, dtype=torch.float64, requires_grad=True)
    y, m = ops.masked_ste(x)
    torch.testing.assert_close(m, (x.detach().abs() <= 1).to(x.dtype))
    (g,) = torch.autograd.grad(y, [x], torch.full_like(x, 3.0))
    torch.testing.assert_close(g, torch.where(x.detach().abs() <= 1, 3.0, 0.0).to(x.dtype))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_generated_reference_reads_named_conditions(ops, name):
    """The generated tests' plain-torch reference takes the same conditions (it ran `torch.where`
    on a float tensor before)."""
    sys.path.insert(0, str(__import__("pathlib").Path(ops.__file__).parents[1]))
    try:
        tests = importlib.import_module(f"named_conditions_ops.tests.test_{name}")
    finally:
        sys.path.pop(0)
    x = torch.linspace(-2, 2, 9, dtype=torch.float64)
    args, outputs = {
        "huber_named": ((x, x.flip(0), 1.0), ["y"]),
        "flagged": ((x, False), ["y", "z"]),
        "masked_ste": ((x,), ["y", "m"]),
    }[name]
    want = getattr(ops, name)(*args)
    want = want if isinstance(want, tuple) else (want,)
    got = tests.reference(*args)
    for output, out in zip(outputs, want, strict=True):
        torch.testing.assert_close(torch.as_tensor(got[output], dtype=out.dtype), out)


def test_a_name_holding_a_number_is_still_no_condition(tmp_path):
    (tmp_path / "op.yaml").write_text(
        "name: op\ninputs:\n  x: Tensor\nlet:\n  two: x * 2\noutputs:\n  y: where(two, x, 0)\n"
    )
    result = build([str(tmp_path / "op.yaml")], Renderer())
    report = "\n".join(result.problems.report())
    assert "op.yaml:7:12:" in report and "'two' holds a number" in report
