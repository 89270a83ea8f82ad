"""The power rule (Note [power rule] in opgen/derive/powers.py): `g * u**(g - 1)`, never `g * u**g / u`.

SymPy's derivative of `u**g` divides by `u`; at `u = 0` that is 0/0. The multi-class focal
loss `-(1 - p)**gamma * log(p)` at p = 1 must give plain autograd's gradient (0), in backward,
in forward mode and in double backward, whether or not the spec's formulas are rewritten.
"""

from __future__ import annotations

import pytest
import sympy
import torch
import torch.autograd.forward_ad as fwAD
from conftest import import_package

from opgen.cli import main
from opgen.derive.powers import combine_powers

p, g = sympy.symbols("p g", real=True)

FOCAL = """\
name: {name}
inputs:
  p: Tensor
  gamma: float = 2.0
outputs:
  y: -(1 - p)**gamma * log(p)
tests:
  domain: {{p: [0.01, 1]}}
"""


def test_sympys_power_derivative_divides_by_the_base():
    """What the rule is for: SymPy's own form, as `sympy.diff` gives it."""
    assert sympy.diff((1 - p) ** g, p).has(1 / (1 - p))


@pytest.mark.parametrize(
    "expr",
    [
        sympy.diff((1 - p) ** g, p),
        sympy.diff(-((1 - p) ** g) * sympy.log(p), p),
        (1 - p) ** g / (p - 1),  # the divisor with its sign flipped
        (1 - p) ** g * sympy.log(p) / (p - 1) ** 2,
        (p**2 + 1) ** g * p / (p**2 + 1),
    ],
)
def test_powers_of_one_base_combine_to_the_same_value(expr):
    combined = combine_powers(expr)
    assert not any(pw.exp.is_Integer and pw.exp < 0 and not pw.base.is_Symbol for pw in combined.atoms(sympy.Pow))
    for point in ({p: "0.3", g: "2.5"}, {p: "-4", g: "3"}, {p: "0.999", g: "1.5"}):
        values = [sympy.N(e.subs({s: sympy.Float(v, 50) for s, v in point.items()}), 50) for e in (combined, expr)]
        assert abs(values[0] - values[1]) <= 1e-40 * max(1, abs(values[1]))


@pytest.fixture(scope="module")
def focal(tmp_path_factory):
    folder = tmp_path_factory.mktemp("powers")
    specs = folder / "specs"
    specs.mkdir()
    (specs / "focal.yaml").write_text(FOCAL.format(name="focal"))
    (specs / "focal_as_written.yaml").write_text(
        FOCAL.format(name="focal_as_written") + "optimize:\n  rewrite: false\n"
    )
    assert main(["generate", str(specs), "-o", str(folder / "power_ops")]) == 0
    return import_package(folder, "power_ops")


def _naive(x, gamma):
    return -((1 - x) ** gamma) * torch.log(x)


def _grads(f, x, gamma):
    x = x.detach().requires_grad_()
    (first,) = torch.autograd.grad(f(x, gamma).sum(), x, create_graph=True)
    (second,) = torch.autograd.grad(first.sum(), x)
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(f(fwAD.make_dual(x.detach(), torch.ones_like(x)), gamma)).tangent
    return first.detach(), second, tangent


@pytest.mark.parametrize("gamma", [1.0, 2.0, 3.0, 2.5])
@pytest.mark.parametrize("name", ["focal", "focal_as_written"])
def test_focal_loss_at_p_one_has_plain_autograds_gradient(focal, name, gamma):
    x = torch.tensor([1.0, 0.5, 1e-3, 0.999], dtype=torch.float64)
    got, want = _grads(getattr(focal, name), x, gamma), _grads(_naive, x, gamma)
    assert torch.isfinite(got[0]).all() and got[0][0] == 0
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
