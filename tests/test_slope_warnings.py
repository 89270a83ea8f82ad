"""Float32 gradients at extreme inputs: stable where an exact form exists, warned of where none does.

Ops users write whose slope as SymPy derives it is inf * 0 or inf / inf in float32 at x = ±100
or ±1e4 (Note [decaying factors] in opgen/optimize/product_rules.py): each generated op's float32
value and gradient there must be finite wherever float64 plain autograd of the formula is, and
agree with it, and opgen gives no warning. Where opgen knows no such form, it warns at generate
time (Note [float32 slopes] in opgen/plan/slopes.py), and the warning's claim is checked
against the generated op itself.
"""

from __future__ import annotations

import re
import textwrap

import pytest
import torch
from conftest import import_package

from opgen.emit.render import Renderer
from opgen.pipeline import build
from opgen.write.files import apply, changes

POINTS = (-1e4, -100.0, -30.0, -3.0, 0.5, 30.0, 100.0, 1e4)
WARNING = re.compile(r"^(?P<loc>[^\n]*?):(?P<line>\d+):\d+: warning: (?P<text>.*)$", re.M)

# name: (formula, the same in torch)
STABLE = {
    "mish_written": ("x * tanh(log(1 + exp(x)))", lambda x: x * torch.tanh(torch.log(1 + torch.exp(x)))),
    "mish_softplus": ("x * tanh(softplus(x))", lambda x: x * torch.tanh(torch.nn.functional.softplus(x))),
    "mish_scaled": ("x * tanh(softplus(2*x))", lambda x: x * torch.tanh(torch.nn.functional.softplus(2 * x))),
    "tanhexp": ("x * tanh(exp(x))", lambda x: x * torch.tanh(torch.exp(x))),
    "tanh_of_exp": ("tanh(exp(x))", lambda x: torch.tanh(torch.exp(x))),
    "tanh_of_exp_plus": ("tanh(exp(x) + 1)", lambda x: torch.tanh(torch.exp(x) + 1)),
    "tanh_of_square": ("tanh(x**2 + 1)", lambda x: torch.tanh(x**2 + 1)),
    "x_tanh_abs": ("x * tanh(abs(x))", lambda x: x * torch.tanh(torch.abs(x))),
    "sigmoid_of_exp": ("sigmoid(exp(x))", lambda x: torch.sigmoid(torch.exp(x))),
    "sigmoid_of_exp_written": ("1/(1 + exp(-exp(x)))", lambda x: 1 / (1 + torch.exp(-torch.exp(x)))),
    "softplus_of_exp": ("log(1 + exp(exp(x)))", lambda x: torch.log(1 + torch.exp(torch.exp(x)))),
    "x_sigmoid_square": ("x * sigmoid(x**2)", lambda x: x * torch.sigmoid(x**2)),
    "gumbel_cdf": ("exp(-exp(-x))", lambda x: torch.exp(-torch.exp(-x))),
    "sigmoid_squared": ("1/(1 + exp(-x))**2", lambda x: 1 / (1 + torch.exp(-x)) ** 2),
    "sech_of_exp": ("1/cosh(exp(x))", lambda x: 1 / torch.cosh(torch.exp(x))),
    "sech_squared": ("1/cosh(x**2)**2", lambda x: 1 / torch.cosh(x**2) ** 2),
    # (1 - 2 exp(x)) exp(x - 2 exp(x)) in its slope was -inf * 0, warned of; the sum is multiplied in
    # (Note [sums beside a decaying exponential] in opgen/optimize/product_rules.py).
    "exp_over_square": ("exp(x) / (1 + exp(exp(x)))**2", lambda x: torch.exp(x) / (1 + torch.exp(torch.exp(x))) ** 2),
}
# Formulas with a finite value and slope at some row whose slope opgen computes as inf * 0.
WARNED = {
    "tanh_of_sinh": ("tanh(sinh(x))", lambda x: torch.tanh(torch.sinh(x))),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slopes")
    (folder / "specs").mkdir()
    for name, (formula, _) in {**STABLE, **WARNED}.items():
        text = f"name: {name}\ninputs:\n  x: Tensor\noutputs:\n  y: {formula}\n"
        (folder / "specs" / f"{name}.yaml").write_text(textwrap.dedent(text))
    result = build([str(folder / "specs")], Renderer())
    assert not result.problems, result.problems.report()
    apply(folder / "slope_ops", changes(folder / "slope_ops", result.files))
    warnings: dict[str, list[re.Match[str]]] = {}
    for warning in WARNING.finditer("\n".join(result.warnings)):
        warnings.setdefault(warning["loc"].rsplit("/", 1)[-1].removesuffix(".yaml"), []).append(warning)
    return import_package(folder, "slope_ops"), warnings


def _float32_and_float64(op, reference, point: float):
    x32 = torch.tensor([point], dtype=torch.float32, requires_grad=True)
    x64 = torch.tensor([point], dtype=torch.float64, requires_grad=True)
    got, want = op(x32), reference(x64)
    (got_grad,) = torch.autograd.grad(got.sum(), x32)
    (want_grad,) = torch.autograd.grad(want.sum(), x64)
    return got, got_grad, want, want_grad


@pytest.mark.parametrize("name", sorted(STABLE))
def test_float32_value_and_slope_are_finite_where_float64_is(built, name):
    ops, warnings = built
    assert name not in warnings, [w["text"] for w in warnings[name]]
    for point in POINTS:
        got, got_grad, want, want_grad = _float32_and_float64(getattr(ops, name), STABLE[name][1], point)
        for mine, theirs, what in ((got, want, "value"), (got_grad, want_grad, "slope")):
            if torch.isfinite(theirs).all():
                assert torch.isfinite(mine).all(), f"{what} at x = {point}: {mine.item()}"
                torch.testing.assert_close(mine.double(), theirs, rtol=1e-4, atol=1e-5, msg=f"{what} at {point}")


@pytest.mark.parametrize("name", sorted(WARNED))
def test_a_slope_with_no_finite_form_is_warned_of_at_its_row(built, name):
    ops, warnings = built
    found = [w for w in warnings.get(name, []) if "the gradient of `y` in `x`" in w["text"]]
    assert len(found) == 1, warnings.get(name)
    assert found[0]["line"] == "5", "located at the output's formula"
    point = float(re.search(r" at x = (\S+), a row", found[0]["text"])[1])  # type: ignore[index]
    got, got_grad, want, want_grad = _float32_and_float64(getattr(ops, name), WARNED[name][1], point)
    assert torch.isfinite(got).all(), "the value is fine: only the slope is warned of"
    assert not torch.isfinite(got_grad).all(), f"the op's float32 slope at x = {point} is finite: {got_grad.item()}"
