"""The derivative of a native kernel's primitive (`Prime.elementary`, opgen/nodes/kernels.py):
the derivative of the primitive's formula at the argument, differentiated once per primitive
and parameters however many docstrings, tangents and double backwards show it."""

from __future__ import annotations

import pytest
import sympy

from opgen.nodes import activations, kernels
from opgen.optimize.rewrite import rewrite

x = sympy.Symbol("x", real=True)
beta = sympy.Symbol("beta", real=True, positive=True)
CASES = [
    (activations.silu, ()),
    (activations.mish, ()),
    (activations.gelu, ()),
    (activations.gelu_tanh, ()),
    (activations.softplus_beta, (beta,)),
]


@pytest.mark.parametrize(("primitive", "rest"), CASES, ids=[c[0].__name__ for c in CASES])
def test_a_prime_is_the_derivative_of_its_primitive_formula(primitive, rest):
    u = sympy.Symbol("u", real=True)
    expected = rewrite(sympy.diff(primitive(u, *rest).elementary(), u)).xreplace({u: x**2 + 1})
    got = kernels.Prime(primitive.__name__, x**2 + 1, *rest).elementary()
    assert sympy.simplify(got - expected) == 0
    for point in (-3.0, -0.5, 0.0, 0.7, 4.0):  # and numerically, as the op would compute it
        values = {x: point, beta: 1.5}
        assert float(got.evalf(30, subs=values)) == pytest.approx(float(expected.evalf(30, subs=values)), rel=1e-12)


def test_a_prime_is_differentiated_once_per_primitive_and_parameters(monkeypatch):
    calls: list[sympy.Basic] = []
    original = sympy.diff

    def counting(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(sympy, "diff", counting)
    kernels.prime_formula.cache_clear()
    gamma = sympy.Symbol("gamma", real=True, positive=True)
    shown = [kernels.Prime("softplus_beta", arg, gamma).elementary() for arg in (x, x + 1, 2 * x, x)]
    assert len(calls) == 1
    assert shown[0] == shown[3] and shown[1] == shown[0].xreplace({x: x + 1})
    kernels.Prime("softplus_beta", x, 2 * gamma).elementary()  # other parameters: another derivative
    assert len(calls) == 2
