"""The branch guard of `where` (Note [double where]): unit tests and the generated ops."""

from __future__ import annotations

import math
import re

import pytest
import sympy
import torch
from spec_ops import build_ops

from opgen.derive.guard import guard_branches, settle_indicators
from opgen.formula import functions as fn

x, y = sympy.Symbol("x", real=True), sympy.Symbol("y", real=True)
TENSORS = frozenset([x, y])


def test_guard_wraps_restricted_arguments_in_each_branch():
    expr = fn.where(x > 0, sympy.log(x), sympy.sqrt(-x))
    assert guard_branches(expr, TENSORS) == fn.where(
        x > 0, sympy.log(fn.where(x > 0, x, 1)), sympy.sqrt(fn.where(x <= 0, -x, 1))
    )


@pytest.mark.parametrize(
    ("function", "safe"),
    [
        (sympy.asin, 0),
        (sympy.acos, 0),
        (sympy.atanh, 0),
        (sympy.erfinv, 0),
        (sympy.acosh, 2),
        (sympy.loggamma, 1),
        (fn.log1p, 0),
    ],
)
def test_guard_uses_a_point_where_the_function_is_finite(function, safe):
    guarded = guard_branches(fn.where(x < 1, function(x), 0), TENSORS)
    assert guarded == fn.where(x < 1, function(fn.where(x < 1, x, safe)), 0)
    value = guarded.args[1].subs(x, 5)  # the branch not taken, where the guard chose `safe`
    assert value.is_finite


def test_guard_leaves_entire_functions_and_whole_powers_alone():
    expr = fn.where(x > 0, sympy.sin(x) + x**2 + sympy.exp(x), 0)
    assert guard_branches(expr, TENSORS) == expr


def test_guard_ignores_arguments_without_tensors():
    a = sympy.Symbol("a", real=True)
    expr = fn.where(x > 0, x * sympy.log(a), 0)
    assert guard_branches(expr, TENSORS) == expr


def test_nested_branches_combine_their_conditions():
    expr = fn.where(x > 0, fn.where(x < 5, sympy.log(x), 0), 0)
    inner = guard_branches(expr, TENSORS).args[1].args[1]
    assert inner == sympy.log(fn.where(sympy.And(x > 0, x < 5), x, 1))


def test_guard_keeps_the_value_where_the_branch_is_taken():
    expr = fn.where(y > 0, sympy.log(y) / x + sympy.sqrt(y), x)
    guarded = guard_branches(expr, TENSORS)
    for xv, yv in [(2.0, 3.0), (-1.5, 0.25)]:
        a = expr.args[1].subs({x: xv, y: yv})
        b = guarded.args[1].subs({x: xv, y: yv})
        assert float(a) == pytest.approx(float(b.evalf()))


def test_settle_indicators_drops_known_indicators_but_keeps_guards():
    guard = fn.where(x > 0, x, 1)
    expr = fn.where(x > 0, fn.indicator(x > 0) / guard, fn.indicator(x > 0))
    assert settle_indicators(expr) == fn.where(x > 0, 1 / guard, 0)


WHERE_SPECS = {
    "root": "name: root\ninputs:\n  x: Tensor\noutputs:\n  y: where(x > 0, sqrt(x), 0)\n",
    "sinc1": "name: sinc1\ninputs:\n  x: Tensor\noutputs:\n  y: where(x != 0, sin(x) / x, 1)\n",
    "logpos": "name: logpos\ninputs:\n  x: Tensor\noutputs:\n  y: where(x > 0, log(x), 0)\n",
}
# Plain torch autograd of the formulas as written: NaN where a branch not taken is undefined.
NAIVE = {
    "root": lambda t: torch.where(t > 0, torch.sqrt(t), 0.0),
    "sinc1": lambda t: torch.where(t != 0, torch.sin(t) / t, 1.0),
    "logpos": lambda t: torch.where(t > 0, torch.log(t), 0.0),
}
# First and second derivatives, away from the kink, written out by hand.
EXACT = {
    "root": lambda v: (0.5 / math.sqrt(v), -0.25 * v**-1.5) if v > 0 else (0.0, 0.0),
    "sinc1": lambda v: (
        (math.cos(v) / v - math.sin(v) / v**2, -math.sin(v) / v - 2 * math.cos(v) / v**2 + 2 * math.sin(v) / v**3)
        if v != 0
        else (0.0, 0.0)
    ),
    "logpos": lambda v: (1 / v, -1 / v**2) if v > 0 else (0.0, 0.0),
}
# Where the branch not taken is undefined, and either side of it. (sin(x)/x itself overflows
# its derivative at x = 1e-300: the sinc spec uses a Taylor branch near 0 for that.)
POINTS = {
    "root": [-3.0, -1.0, -1e-300, 0.0, 1e-300, 0.5, 2.0],
    "sinc1": [-3.0, -1.0, 0.0, 0.5, 2.0],
    "logpos": [-3.0, -1.0, -1e-300, 0.0, 1e-300, 0.5, 2.0],
}


@pytest.fixture(scope="module")
def where_ops(tmp_path_factory):
    return build_ops(tmp_path_factory.mktemp("where"), "where_ops", WHERE_SPECS)


def derivatives(f, values):
    t = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    (first,) = torch.autograd.grad(f(t).sum(), t, create_graph=True)
    (second,) = torch.autograd.grad(first.sum(), t)
    return first.detach(), second


@pytest.mark.parametrize("name", sorted(WHERE_SPECS))
def test_naive_formula_is_nan_at_the_bad_points(name):
    first, second = derivatives(NAIVE[name], POINTS[name])
    assert not (torch.isfinite(first).all() and torch.isfinite(second).all())


@pytest.mark.parametrize("name", sorted(WHERE_SPECS))
def test_first_and_second_derivatives_are_finite_and_right(where_ops, name):
    first, second = derivatives(getattr(where_ops, name), POINTS[name])
    finite = torch.isfinite(first) & torch.isfinite(second)
    if name != "sinc1":
        # At x = 1e-300, sqrt and log really have derivatives that overflow.
        finite |= torch.tensor([v == 1e-300 for v in POINTS[name]])
    assert finite.all(), (first, second)
    for k, v in enumerate(POINTS[name]):
        if abs(v) < 1e-100:
            continue  # the kink itself, or overflowing
        want1, want2 = EXACT[name](v)
        assert first[k].item() == pytest.approx(want1, rel=1e-9), v
        assert second[k].item() == pytest.approx(want2, rel=1e-9), v


def test_generated_backward_guards_the_argument(where_ops):
    import inspect

    source = inspect.getsource(where_ops.LogposFunction.backward)
    # The condition computed once for the guard and the branch (Note [conditions computed once]).
    assert re.search(r"(tmp\d+) = x > 0\n.*torch\.where\(\1, x, 1\)", source, re.S), source


MORE = {
    "g_atanh": ("where(abs(x) < 1, atanh(x), 0)", lambda t: torch.where(t.abs() < 1, torch.atanh(t), 0.0)),
    "g_asin": ("where(abs(x) < 1, asin(x), 0)", lambda t: torch.where(t.abs() < 1, torch.asin(t), 0.0)),
    "g_acosh": ("where(x > 1, acosh(x), 0)", lambda t: torch.where(t > 1, torch.acosh(t), 0.0)),
    "g_log1p": ("where(x > -1, log1p(x), 0)", lambda t: torch.where(t > -1, torch.log1p(t), 0.0)),
    "g_gamma": (
        "where(x > 0, lgamma(x) + digamma(x), 0)",
        lambda t: torch.where(t > 0, torch.lgamma(t) + torch.digamma(t), 0.0),
    ),
    "g_erfinv": ("where(abs(x) < 1, erfinv(x), 0)", lambda t: torch.where(t.abs() < 1, torch.erfinv(t), 0.0)),
    "g_rsqrt": ("where(x > 0, rsqrt(x), x)", lambda t: torch.where(t > 0, torch.rsqrt(t), t)),
    "g_nested": ("where(x > 0, where(x < 2, log(2 - x) * sqrt(x), 0), 0)", None),
}
BAD = [-3.0, -1.0, 0.0, 1.0, 2.0, 3.0]
GOOD = [-0.5, 0.25, 0.75, 1.25, 1.5]


@pytest.fixture(scope="module")
def more_ops(tmp_path_factory):
    specs = {name: f"name: {name}\ninputs:\n  x: Tensor\noutputs:\n  y: {f}\n" for name, (f, _) in MORE.items()}
    return build_ops(tmp_path_factory.mktemp("guards"), "guard_ops", specs)


@pytest.mark.parametrize("name", sorted(MORE))
def test_every_restricted_function_is_guarded(more_ops, name):
    first, second = derivatives(getattr(more_ops, name), BAD + GOOD)
    assert torch.isfinite(first).all() and torch.isfinite(second).all(), (MORE[name][0], first, second)
    naive = MORE[name][1]
    if naive is not None:  # where the plain formula is finite, it is the reference
        want_first, want_second = derivatives(naive, BAD + GOOD)
        valid = torch.isfinite(want_first) & torch.isfinite(want_second)
        assert valid[len(BAD) :].sum() >= 2
        torch.testing.assert_close(first[valid], want_first[valid])
        torch.testing.assert_close(second[valid], want_second[valid])


def test_guard_skips_bases_sympy_proves_positive():
    expr = fn.where(x > 0, 1 / (1 + x**2) + sympy.sqrt(1 + sympy.exp(-x)) + sympy.log(1 + x**2), 0)
    assert guard_branches(expr, TENSORS) == expr
