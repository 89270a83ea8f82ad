"""Elementwise forms that overflow or cancel: log(cosh(u)) and sums against a square root.

Each rewrite is an exact identity (checked at 50 digits, value and derivative); the generated
ops are checked in float32 against the exact value of the formula *as written* (mpmath) at the
points where the formula as written gives inf or loses every digit.
"""

from __future__ import annotations

import mpmath
import pytest
import sympy
import torch
from conftest import import_package
from full_size import FullSize

from opgen.cli import main
from opgen.formula import functions as fn
from opgen.optimize import rewrite as rw

x, y, b = sympy.symbols("x y b", real=True)
PREC = 50


def _value(expr: sympy.Expr, point: dict[sympy.Symbol, str]) -> sympy.Float:
    return sympy.N(expr.subs({s: sympy.Float(v, PREC) for s, v in point.items()}), PREC)


def _close(a: sympy.Expr, c: sympy.Expr) -> bool:
    return abs(a - c) <= sympy.Float(10) ** -(PREC - 8) * max(1, abs(a), abs(c))


RULES = [
    (sympy.log(sympy.cosh(x)), rw.logcosh, [{x: v} for v in ("-300", "-1e-3", "0.5", "40")]),
    ((x + sympy.sqrt(x**2 + b)) / 2, fn.where, [{x: v, b: "4"} for v in ("-1e4", "-3", "0", "2", "1e4")]),
    (sympy.sqrt(x**2 + 1) - x, fn.where, [{x: v} for v in ("-1e4", "-0.5", "0.5", "1e4")]),
    (2 * x - sympy.sqrt(4 * x**2 + 3 * y), fn.where, [{x: v, y: "0.3"} for v in ("-50", "0.1", "1e5")]),
    (x + rw.hypot(x, y), fn.where, [{x: v, y: "2"} for v in ("-1e4", "1", "1e4")]),
]


@pytest.mark.parametrize("formula, function, points", RULES, ids=[str(r[0]) for r in RULES])
def test_rule_is_an_exact_identity_with_the_same_derivative(formula, function, points):
    rewritten = rw.rewrite(formula)
    assert rewritten.atoms(function), f"{formula} was not rewritten with {function.__name__}: {rewritten}"
    derivative = sympy.diff(rewritten, x)
    for point in points:
        assert _close(_value(rewritten, point), _value(formula, point)), point
        assert _close(_value(derivative, point), _value(sympy.diff(formula, x), point)), point


def test_sums_that_cannot_cancel_or_gain_nothing_stay_as_written():
    for formula in (
        x + sympy.sqrt(y),
        sympy.Abs(x) + sympy.sqrt(x**2 + 1),
        sympy.sqrt(x**2 + 1) + 2,
        x + sympy.sqrt(x),
        x + 2 * fn.sign(x),  # a function of no elementary form is no square root
        x - fn.floor(x),
    ):
        assert rw.rewrite(formula) == formula, formula


def test_a_number_every_term_shares_stays_outside_the_form():
    """`(x + sqrt(x**2 + b)) / 2` is `where(x < 0, b / (sqrt(x**2 + b) + |x|), x + sqrt(x**2 + b)) / 2`: no
    branch halves its terms one by one (squareplus's forward: 11 full-size passes, 14 before)."""
    form = rw.rewrite((x + sympy.sqrt(x**2 + b)) / 2)
    assert form.as_coeff_Mul()[0] == sympy.Rational(1, 2)
    (node,) = form.atoms(fn.where)
    assert node.args[2] == x + sympy.sqrt(x**2 + b)


def test_the_conjugate_form_is_rewritten_once():
    once = rw.rewrite((x + sympy.sqrt(x**2 + b)) / 2)
    assert rw.rewrite(once) == once and len(once.atoms(fn.where)) == 1


SPECS = {
    "log_cosh": ("log(cosh(p - t))", "  p: Tensor\n  t: Tensor\n"),
    "squareplus": ("(x + sqrt(x**2 + b)) / 2", "  x: Tensor\n  b: float = 4.0\n"),
    "asinh_tail": ("sqrt(x**2 + 1) - x", "  x: Tensor\n"),
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cancellation")
    specs = folder / "specs"
    specs.mkdir()
    for name, (formula, inputs) in SPECS.items():
        (specs / f"{name}.yaml").write_text(f"name: {name}\ninputs:\n{inputs}outputs:\n  y: {formula}\n")
    assert main(["generate", str(specs), "-o", str(folder / "cancellation_ops")]) == 0
    return import_package(folder, "cancellation_ops")


def _exact(f, v: float) -> tuple[float, float]:
    with mpmath.workdps(PREC):
        return float(f(mpmath.mpf(v))), float(mpmath.diff(f, mpmath.mpf(v)))


def _float32(op, values, *args):
    t = torch.tensor(values, dtype=torch.float32, requires_grad=True)
    out = op(t, *args)
    (grad,) = torch.autograd.grad(out.sum(), t)
    return out.detach(), grad


POINTS = [-1e4, -100.0, -30.0, -1.0, -1e-3, 0.5, 30.0, 100.0, 1e4]


@pytest.mark.parametrize(
    "name, exact, args",
    [
        ("log_cosh", lambda u: mpmath.log(mpmath.cosh(u)), (torch.zeros(len(POINTS)),)),
        ("squareplus", lambda u: (u + mpmath.sqrt(u**2 + 4)) / 2, (4.0,)),
        ("asinh_tail", lambda u: mpmath.sqrt(u**2 + 1) - u, ()),
    ],
)
def test_float32_values_and_gradients_are_the_exact_ones(ops, name, exact, args):
    out, grad = _float32(getattr(ops, name), POINTS, *args)
    want = [_exact(exact, float(torch.tensor(v, dtype=torch.float32))) for v in POINTS]
    torch.testing.assert_close(out, torch.tensor([w[0] for w in want]), rtol=1e-5, atol=1e-30)
    torch.testing.assert_close(grad, torch.tensor([w[1] for w in want]), rtol=1e-5, atol=1e-30)


def test_the_formulas_as_written_fail_in_float32():
    """What the rewrites are for: inf at a difference of 100, every digit lost at -1e4."""
    u = torch.tensor([100.0, -1e4])
    assert torch.isinf(torch.log(torch.cosh(u[:1]))).all()
    assert ((u[1:] + torch.sqrt(u[1:] ** 2 + 4)) / 2 == 0).all()


def test_log_cosh_kink_convention_is_plain_autograds(ops):
    """The printed form |u| + softplus(-2|u|) - log 2 has a kink at 0; the gradient is tanh(u)."""
    p = torch.tensor([0.0, 0.3, -2.0], dtype=torch.float64, requires_grad=True)
    t = torch.zeros(3, dtype=torch.float64)
    for f in (ops.log_cosh, lambda a, c: torch.log(torch.cosh(a - c))):
        (first,) = torch.autograd.grad(f(p, t).sum(), p, create_graph=True)
        (second,) = torch.autograd.grad(first.sum(), p)
        if f is ops.log_cosh:
            got = (first.detach(), second)
        else:
            want = (first.detach(), second)
    for a, c in zip(got, want, strict=True):
        torch.testing.assert_close(a, c)
    assert got[0][0] == 0 and got[1][0] == 1


PLAIN = {
    # name: (the formula in plain torch, the op's other arguments, its backward's full-size passes)
    "squareplus": (lambda u: (u + torch.sqrt(u**2 + 4)) / 2, (4.0,), 5),
    "asinh_tail": (lambda u: torch.sqrt(u**2 + 1) - u, (), 6),
}


def _backward_passes(function, x: torch.Tensor) -> int:
    y = function(x)
    g = torch.ones_like(y)
    with FullSize(x.numel(), views=False) as mode:
        torch.autograd.grad(y, x, g)
    return mode.count


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_the_conjugate_forms_gradient_reads_the_output(ops, name):
    """Note [derivative of the conjugate form]: the gradient is `(2 r' y - D') / (2 c sqrt(w))` on the saved
    output, `grad * y / sqrt(x**2 + b)` for squareplus (36 full-size passes when each branch of the
    `where` was differentiated and guarded, 5 now, plain autograd's 7); first and second derivatives are
    plain autograd's in float64 on both sides of the branch, and double backward is right."""
    plain, args, passes = PLAIN[name]
    op = getattr(ops, name)
    x = torch.linspace(-3, 3, 61, dtype=torch.float64).requires_grad_()
    g = torch.randn(61, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    (got,) = torch.autograd.grad(op(x, *args), x, g, create_graph=True)
    (want,) = torch.autograd.grad(plain(x), x, g, create_graph=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x), torch.autograd.grad(want.sum(), x))
    assert torch.autograd.gradgradcheck(lambda u: op(u, *args), [x[::7].detach().requires_grad_()])
    assert _backward_passes(lambda u: op(u, *args), x) == passes <= _backward_passes(plain, x)
