"""The modified Bessel functions `i0`, `i0e`, `i1`, `i1e` (Note [modified Bessel functions] in
opgen/nodes/bessel.py) against torch.special's in float64: values, first derivatives (with the
limits at 0), second and third derivatives against mpmath, gradcheck and gradgradcheck, forward
mode, vmap, torch.compile, the custom_op form; and `specs/von_mises_nll.yaml` against the
likelihood written with torch.special.i0."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch
from conftest import ROOT, import_package
from spec_ops import build_ops

from opgen.errors import Loc, SpecError
from opgen.formula.reader import Scope, read_formula
from opgen.formula.vocabulary import NUM, Value
from opgen.spec.model import Formula

DTYPE = torch.float64
NAMES = ("i0", "i0e", "i1", "i1e")
SPECS = {name: f"name: {name}_op\ninputs: {{x: Tensor}}\noutputs: {{y: {name}(x)}}\n" for name in NAMES} | {
    "of_numbers": "name: of_numbers\ninputs: {x: Tensor, a: float = 0.5}\noutputs: {y: x * i1(a) + i0e(a * 2)}\n",
    "i1e_custom": "name: i1e_custom\ninputs: {x: Tensor}\noutputs: {y: i1e(x) * x}\nform: custom_op\n",
}
POINTS = torch.tensor([-30.0, -4.5, -1.0, -0.3, 0.2, 0.7, 2.0, 6.5, 40.0], dtype=DTYPE)


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return build_ops(tmp_path_factory.mktemp("bessel"), "bessel_ops", SPECS)


def _exact(name: str, x: float, order: int) -> float:
    """The `order`-th derivative of the function at x, at 50 digits."""
    scaled = name.endswith("e")
    nu = int(name[1])

    def f(t):
        value = mpmath.besseli(nu, t)
        return value * mpmath.exp(-abs(t)) if scaled else value

    with mpmath.workdps(50):
        return float(mpmath.diff(f, mpmath.mpf(x), order))


@pytest.mark.parametrize("name", NAMES)
def test_values_and_gradients_match_torch_special(ops, name):
    op, native = getattr(ops, f"{name}_op"), getattr(torch.special, name)
    x = POINTS.clone().requires_grad_()
    y = op(x)
    torch.testing.assert_close(y, native(x))
    (got,) = torch.autograd.grad(y.sum(), x)
    (want,) = torch.autograd.grad(native(x).sum(), x)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", NAMES)
def test_derivatives_of_order_one_to_three_are_exact(ops, name):
    op = getattr(ops, f"{name}_op")
    x = POINTS.clone().requires_grad_()
    grads = []
    out = op(x).sum()
    for _ in range(3):
        (out,) = torch.autograd.grad(out, x, create_graph=True)
        grads.append(out.detach())
        out = out.sum()
    for order, grad in enumerate(grads, start=1):
        want = torch.tensor([_exact(name, float(p), order) for p in POINTS], dtype=DTYPE)
        torch.testing.assert_close(grad, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    ("name", "first", "second"), [("i0", 0.0, 0.5), ("i1", 0.5, 0.0), ("i0e", 0.0, None), ("i1e", 0.5, None)]
)
def test_the_limits_at_zero(ops, name, first, second):
    """i1' = i0 - i1/x and i1e' = i0e - i1e (sign(x) + 1/x) are 0/0 at 0: their limits, and finite second
    derivatives (i0e and i1e have a kink at 0 through |x|: torch's sign(0) = 0 convention)."""
    x = torch.zeros(3, dtype=DTYPE, requires_grad=True)
    (grad,) = torch.autograd.grad(getattr(ops, f"{name}_op")(x).sum(), x, create_graph=True)
    torch.testing.assert_close(grad, torch.full_like(grad, first))
    (again,) = torch.autograd.grad(grad.sum(), x)
    assert torch.isfinite(again).all()
    if second is not None:
        torch.testing.assert_close(again, torch.full_like(again, second))
    (native,) = torch.autograd.grad(getattr(torch.special, name)(x).sum(), x)
    torch.testing.assert_close(grad.detach(), native)


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_gradgradcheck_jvp_vmap(ops, name):
    op, native = getattr(ops, f"{name}_op"), getattr(torch.special, name)
    x = (POINTS / 3).clone().requires_grad_()
    assert torch.autograd.gradcheck(op, (x,), check_forward_ad=True, check_batched_grad=True)
    assert torch.autograd.gradgradcheck(op, (x,), check_fwd_over_rev=True)
    t = torch.linspace(-1, 1, x.numel(), dtype=DTYPE)
    torch.testing.assert_close(torch.func.jvp(op, (x.detach(),), (t,)), torch.func.jvp(native, (x.detach(),), (t,)))
    batch = x.detach().reshape(3, 3)
    torch.testing.assert_close(
        torch.func.vmap(torch.func.grad(lambda v: op(v).sum()))(batch),
        torch.func.vmap(torch.func.grad(lambda v: native(v).sum()))(batch),
    )


def test_of_plain_numbers(ops):
    x = torch.tensor([1.0, -2.0], dtype=DTYPE)
    want = x * torch.special.i1(torch.tensor(0.3, dtype=DTYPE)) + torch.special.i0e(torch.tensor(0.6, dtype=DTYPE))
    torch.testing.assert_close(ops.of_numbers(x, 0.3), want)


def test_compiled_and_custom_op(ops):
    x = (POINTS / 4).clone().requires_grad_()
    compiled = torch.compile(ops.i1_op, fullgraph=True, backend="aot_eager")
    (got,) = torch.autograd.grad(compiled(x).sum(), x)
    (want,) = torch.autograd.grad(torch.special.i1(x).sum(), x)
    torch.testing.assert_close(got, want)
    torch.library.opcheck(torch.ops.bessel_ops.i1e_custom, (x.detach(),))
    torch.testing.assert_close(ops.i1e_custom(x), torch.special.i1e(x) * x)


def test_the_von_mises_spec_matches_the_likelihood_in_plain_torch():
    generated = import_package(ROOT, "generated")
    g = torch.Generator().manual_seed(0)
    x, mu = (torch.rand(7, generator=g, dtype=DTYPE) * 6 - 3 for _ in range(2))
    kappa = torch.rand(7, generator=g, dtype=DTYPE) * 20 + 0.1
    args = [t.requires_grad_() for t in (x, mu, kappa)]

    def plain(x, mu, kappa):
        return -kappa * torch.cos(x - mu) + torch.log(2 * math.pi * torch.special.i0(kappa))

    got, want = generated.von_mises_nll(*args), plain(*args)
    torch.testing.assert_close(got, want)
    for g1, w1 in zip(torch.autograd.grad(got.sum(), args), torch.autograd.grad(want.sum(), args), strict=True):
        torch.testing.assert_close(g1, w1)
    assert torch.autograd.gradgradcheck(generated.von_mises_nll, args)
    big = torch.tensor([200.0, 1e4], dtype=torch.float32)  # i0 overflows float32 from 89
    nll = generated.von_mises_nll(torch.zeros(2), torch.zeros(2), big)
    assert torch.isfinite(nll).all()


SCOPE = Scope(names={"x": Value(__import__("sympy").Symbol("x"), NUM)}, tensors=frozenset())


@pytest.mark.parametrize(
    ("text", "expected"), [("i0(x, 2)", "i0() takes 1 argument, got 2"), ("i2(x)", "i0, i0e, i1, i1e")]
)
def test_misuse_is_a_located_error(text, expected):
    with pytest.raises(SpecError) as error:
        read_formula(Formula(text, Loc("f.yaml", 2, 7)), SCOPE)
    assert expected in error.value.message, error.value.message
    assert str(error.value.loc).startswith("f.yaml:2:")


def test_the_mpmath_oracle_keeps_a_scaled_function_whole():
    """The accuracy tests' exact value of `i0e(x)**2` squares exp(-|x|) i0(x), not i0 alone."""
    import sympy

    from opgen.nodes.bessel import i0e
    from opgen.plan import extremes

    x = sympy.Symbol("x")
    code = sympy.lambdify(x, i0e(x) ** 2, modules=[extremes._namespace()], printer=extremes._printer())
    assert float(code(mpmath.mpf(3))) == pytest.approx(float(torch.special.i0e(torch.tensor(3.0, dtype=DTYPE))) ** 2)
