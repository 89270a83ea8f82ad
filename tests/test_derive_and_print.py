"""Derivation (SymPy gradients, `Tensor?` variants, kink conventions) and the torch printer.

Derived gradients are evaluated with the printer's torch code and compared with plain torch
autograd of the same formula written by hand here.
"""

from __future__ import annotations

import math

import pytest
import sympy
import torch
from conftest import as_written

from opgen.emit.printer import PrintError, TorchPrinter
from opgen.errors import Problems
from opgen.pipeline import run_stages
from opgen.spec.load import load_text
from opgen.spec.parse import parse_spec


def staged(text: str, stop_after: str):
    """The spec `text` as written, through the pipeline up to `stop_after`."""
    problems = Problems()
    spec = parse_spec(load_text(text, "t.yaml"), "specs/t.yaml", problems)
    assert spec is not None and not problems, problems.report()
    stages = run_stages(as_written(spec), problems, stop_after)
    assert stages is not None and not problems, problems.report()
    return stages


def derived_of(text: str):
    return staged(text, "derive").derived


def plan(text: str):
    return staged(text, "plan").planned.plan


def evaluate(derived, expr: sympy.Basic, values: dict[str, object]) -> torch.Tensor:
    """Print `expr` with the torch printer and run the code on `values`."""
    symbols = derived.symbols
    names = {s: n for group in (symbols.inputs, symbols.lets, symbols.outputs) for n, s in group.items()}
    names |= {s: f"grad_{o}" for o, s in symbols.grads.items()}
    printer = TorchPrinter(names, symbols.tensors)
    code = printer.doprint_expr(expr)
    import math

    return eval(code, {"torch": torch, "math": math}, dict(values))  # test-only: code we printed


def gradient(derived, variant, name: str):
    grad = next(g for g in variant.gradients if g.input == name)
    symbols = derived.symbols
    return sum((symbols.grads[c.output] * c.factor for c in grad.contributions), sympy.S.Zero)


def test_gradient_matches_autograd_of_the_plain_formula():
    derived = derived_of("name: t\ninputs: {x: Tensor, b: float}\noutputs:\n  y: log(1 + x**2) * tanh(b * x)\n")
    x = torch.linspace(-3, 3, 13, dtype=torch.float64, requires_grad=True)
    g = torch.rand(13, dtype=torch.float64)
    (expected,) = torch.autograd.grad(torch.log(1 + x**2) * torch.tanh(0.7 * x), x, g)
    got = evaluate(derived, gradient(derived, derived.full, "x"), {"x": x.detach(), "b": 0.7, "grad_y": g})
    torch.testing.assert_close(got, expected)
    assert [g.input for g in derived.full.gradients] == ["x"]  # non-tensor `b` gets none


def test_several_outputs_sum_their_contributions_through_lets():
    derived = derived_of("name: t\ninputs: {x: Tensor}\nlet: {s: sin(x)}\noutputs:\n  y: s * x\n  z: exp(s)\n")
    grad = next(g for g in derived.full.gradients if g.input == "x")
    assert [c.output for c in grad.contributions] == ["y", "z"]
    x = torch.linspace(-2, 2, 9, dtype=torch.float64, requires_grad=True)
    gy, gz = torch.rand(9, dtype=torch.float64), torch.rand(9, dtype=torch.float64)
    (expected,) = torch.autograd.grad([torch.sin(x) * x, torch.exp(torch.sin(x))], x, [gy, gz])
    got = evaluate(derived, gradient(derived, derived.full, "x"), {"x": x.detach(), "grad_y": gy, "grad_z": gz})
    torch.testing.assert_close(got, expected)


def test_optional_input_variants_drop_its_terms():
    derived = derived_of("name: t\ninputs:\n  x: Tensor\n  b: Tensor?\noutputs:\n  y: x * (2 + b) + exp(b)\n")
    absent = next(v for v in derived.variants if v.absent == ("b",))
    assert dict(absent.outputs)["y"] == 2 * derived.symbols.inputs["x"]
    assert [g.input for g in absent.gradients] == ["x"]
    assert [g.input for g in derived.full.gradients] == ["x", "b"]


def test_broadcast_reduction_only_with_several_tensor_inputs():
    one = plan("name: t\ninputs: {x: Tensor, c: float}\noutputs:\n  y: c * x\n")
    two = plan("name: t\ninputs: {x: Tensor, w: Tensor}\noutputs:\n  y: w * x\n")
    assert [g.reduce for g in one.backward[-1].grads] == [False]
    assert [g.reduce for g in two.backward[-1].grads] == [True, True]


def test_saves_only_what_backward_reads():
    # d/dx exp(x) can be written with the output; x*c needs only the constant.
    assert plan("name: t\ninputs: {x: Tensor, c: float}\noutputs:\n  y: c * x\n").saved == ()
    assert plan("name: t\ninputs: {x: Tensor, w: Tensor}\noutputs:\n  y: w * x\n").saved == ("x", "w")


@pytest.mark.parametrize(
    ("formula", "native"),
    [
        ("abs(x)", torch.abs),
        ("max(x, 0)", torch.relu),
        ("clamp(x, -1, 1)", lambda t: torch.clamp(t, -1, 1)),
        ("sign(x) + floor(x) + round(x)", lambda t: torch.sign(t) + torch.floor(t) + torch.round(t)),
    ],
)
def test_kinks_follow_pytorch(formula, native):
    derived = derived_of(f"name: t\ninputs: {{x: Tensor}}\noutputs:\n  y: {formula}\n")
    x = torch.tensor([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    g = torch.ones(7, dtype=torch.float64)
    (expected,) = torch.autograd.grad(native(x), x, g)
    got = evaluate(derived, gradient(derived, derived.full, "x"), {"x": x.detach(), "grad_y": g})
    torch.testing.assert_close(torch.as_tensor(got, dtype=expected.dtype).expand_as(expected), expected)


def test_maximum_of_two_tensors_splits_ties():
    derived = derived_of("name: t\ninputs: {a: Tensor, b: Tensor}\noutputs:\n  y: max(a, b)\n")
    a = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([2.0, 2.0, 1.0], dtype=torch.float64, requires_grad=True)
    g = torch.ones(3, dtype=torch.float64)
    expected = torch.autograd.grad(torch.maximum(a, b), [a, b], g)
    values = {"a": a.detach(), "b": b.detach(), "grad_y": g}
    for name, want in zip(["a", "b"], expected, strict=True):
        torch.testing.assert_close(evaluate(derived, gradient(derived, derived.full, name), values), want)


def test_printer_is_strict():
    x = sympy.Symbol("x", real=True)
    printer = TorchPrinter({x: "x"}, frozenset({x}))
    assert printer.doprint_expr(sympy.exp(x) + sympy.sqrt(x)) == "torch.sqrt(x) + torch.exp(x)"
    with pytest.raises(PrintError):
        printer.doprint_expr(sympy.besselj(0, x))
    with pytest.raises(PrintError):
        printer.doprint_expr(sympy.Symbol("unnamed"))


def test_printer_uses_math_for_plain_numbers():
    x, c = sympy.symbols("x c", real=True)
    printer = TorchPrinter({x: "x", c: "c"}, frozenset({x}), torch="torch_", math="math_")
    assert printer.doprint_expr(sympy.exp(c) * x) == "x * math_.exp(c)"
    assert printer.doprint_expr(sympy.exp(c * x)) == "torch_.exp(c * x)"


@pytest.mark.parametrize(
    ("formula", "plain"),
    [
        ("atan(-1) * (x + sin(x))", lambda x: math.atan(-1) * (x + torch.sin(x))),
        ("-pi / 4 * (x - exp(-x))", lambda x: -math.pi / 4 * (x - torch.exp(-x))),
        ("-sqrt(2) * (x + 1) / (x**2 + 1)", lambda x: -math.sqrt(2) * (x + 1) / (x**2 + 1)),
        ("log(2) * (x + 1) * (x - 3)", lambda x: math.log(2) * (x + 1) * (x - 3)),
    ],
)
def test_a_negative_irrational_coefficient_keeps_its_sum_bracketed(tmp_path, formula, plain):
    """SymPy ranks a negative product as a sum, so `-pi/4 * (x + sin(x))` printed as
    `-math.pi / 4 * x + torch.sin(x)`: wrong values, gradients and tangents. Against plain torch."""
    from spec_ops import build_ops

    op = build_ops(
        tmp_path, "coefficient_ops", {"op": f"name: op\ninputs: {{x: Tensor}}\noutputs:\n  y: {formula}\n"}
    ).op
    x = torch.linspace(-2, 2, 9, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(op(x), plain(x))
    (got,) = torch.autograd.grad(op(x).sum(), x)
    (want,) = torch.autograd.grad(plain(x).sum(), x)
    torch.testing.assert_close(got, want)
    t = torch.rand_like(x)
    torch.testing.assert_close(torch.func.jvp(op, (x.detach(),), (t,)), torch.func.jvp(plain, (x.detach(),), (t,)))
