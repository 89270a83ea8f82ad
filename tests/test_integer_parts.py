"""`trunc`, `frac`, `a % b` (torch.remainder), `fmod(a, b)` and `polygamma(n, x)` (Note [integer parts] in
opgen/nodes/integer_parts.py) against PyTorch's own ops in float64: values, gradients of the first three
orders, gradcheck and gradgradcheck with forward mode, vmap, torch.compile, the custom_op form, plain
numbers; and their misuse as located errors."""

from __future__ import annotations

import pytest
import sympy
import torch
from spec_ops import build_ops

from opgen.errors import Loc, SpecError
from opgen.formula.reader import Scope, read_formula
from opgen.formula.vocabulary import NUM, Value
from opgen.spec.model import Formula

DTYPE = torch.float64
TWO = "inputs: {a: Tensor, b: Tensor}\n"
SPECS = {
    "trunc_op": "name: trunc_op\ninputs: {x: Tensor}\noutputs: {y: trunc(x) * x}\n",
    "frac_op": "name: frac_op\ninputs: {x: Tensor}\noutputs: {y: frac(x)}\n",
    "remainder_op": f"name: remainder_op\n{TWO}outputs: {{y: a % b}}\n",
    "remainder_word": f"name: remainder_word\n{TWO}outputs: {{y: remainder(a, b)}}\n",
    "fmod_op": f"name: fmod_op\n{TWO}outputs: {{y: fmod(a, b)}}\n",
    "of_numbers": (
        "name: of_numbers\ninputs: {x: Tensor, c: float = 2.5}\n"
        "outputs: {y: x % c + fmod(c, x) + (7 % x) * trunc(c) + x * polygamma(1, c) + fmod(-c, 2)}\n"
    ),
    **{
        f"polygamma{n}": f"name: polygamma{n}\ninputs: {{x: Tensor}}\noutputs: {{y: polygamma({n}, x)}}\n"
        for n in range(4)
    },
    "trigamma_op": "name: trigamma_op\ninputs: {x: Tensor}\noutputs: {y: trigamma(x) - digamma(x)}\n",
    "fmod_custom": f"name: fmod_custom\n{TWO}outputs: {{y: fmod(a, b) * a}}\nform: custom_op\n",
    "polygamma_custom": "name: polygamma_custom\ninputs: {x: Tensor}\noutputs: {y: polygamma(2, x)}\nform: custom_op\n",
}
# Quotients a / b away from whole numbers: the remainders' finite differences see no jump.
A = torch.tensor([-5.3, -2.2, -0.4, 0.7, 3.1, 6.6], dtype=DTYPE)
B = torch.tensor([1.7, -1.3, 2.9, -0.9, 1.1, 2.3], dtype=DTYPE)
X = torch.tensor([-4.6, -2.7, -0.3, 0.2, 0.9, 1.5, 3.4, 7.8], dtype=DTYPE)  # no integers, for trunc and frac
POSITIVE = torch.tensor([0.05, 0.4, 1.0, 2.5, 7.0, 31.0], dtype=DTYPE)
BINARY = {"remainder_op": torch.remainder, "remainder_word": torch.remainder, "fmod_op": torch.fmod}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return build_ops(tmp_path_factory.mktemp("integer_parts"), "integer_parts_ops", SPECS)


def _grads(f, args, order):
    """The gradients of sum(f) of every order up to `order`, as autograd takes them."""
    out, found = f(*args).sum(), []
    for _ in range(order):
        grads = torch.autograd.grad(out, args, create_graph=True, allow_unused=True, materialize_grads=True)
        found.append([g.detach() for g in grads])
        out = sum(g.sum() for g in grads)
    return found


@pytest.mark.parametrize("name", sorted(BINARY))
def test_remainders_match_torch(ops, name):
    op, native = getattr(ops, name), BINARY[name]
    args = [A.clone().requires_grad_(), B.clone().requires_grad_()]
    torch.testing.assert_close(op(*args), native(*args))
    for got, want in zip(_grads(op, args, 2), _grads(native, args, 2), strict=True):
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
    quotient = A / B
    step = torch.floor(quotient) if native is torch.remainder else torch.trunc(quotient)
    (_, grad_b), _ = _grads(op, args, 2)
    torch.testing.assert_close(grad_b, -step)  # PyTorch's formula, not only its value here
    assert torch.autograd.gradcheck(op, tuple(args), check_forward_ad=True, check_batched_grad=True)
    assert torch.autograd.gradgradcheck(op, tuple(args), check_fwd_over_rev=True)


def test_the_signs_of_the_two_remainders(ops):
    a = torch.tensor([-7.0, 7.0, -7.0, 7.0], dtype=DTYPE)
    b = torch.tensor([2.0, -2.0, -2.0, 2.0], dtype=DTYPE)
    torch.testing.assert_close(ops.remainder_op(a, b), torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=DTYPE))
    torch.testing.assert_close(ops.fmod_op(a, b), torch.tensor([-1.0, 1.0, -1.0, 1.0], dtype=DTYPE))


@pytest.mark.parametrize(("name", "native"), [("trunc_op", lambda x: torch.trunc(x) * x), ("frac_op", torch.frac)])
def test_trunc_and_frac_match_torch(ops, name, native):
    op = getattr(ops, name)
    x = X.clone().requires_grad_()
    torch.testing.assert_close(op(x), native(x))
    (got,), (want,) = _grads(op, [x], 1)[0:1], _grads(native, [x], 1)[0:1]
    torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(op, (x,), check_forward_ad=True, check_batched_grad=True)
    assert torch.autograd.gradgradcheck(op, (x,), check_fwd_over_rev=True)


def test_trunc_rounds_toward_zero_where_floor_does_not(ops):
    x = torch.tensor([-2.5, -0.5, 0.5, 2.5], dtype=DTYPE)
    torch.testing.assert_close(ops.trunc_op(x), torch.tensor([2 * 2.5, 0.0, 0.0, 2 * 2.5], dtype=DTYPE))
    torch.testing.assert_close(ops.frac_op(x), torch.tensor([-0.5, -0.5, 0.5, 0.5], dtype=DTYPE))


@pytest.mark.parametrize("n", range(4))
def test_polygamma_and_its_derivatives_of_three_orders(ops, n):
    op = getattr(ops, f"polygamma{n}")
    x = POSITIVE.clone().requires_grad_()
    torch.testing.assert_close(op(x), torch.polygamma(n, x))
    for order, (grad,) in enumerate(_grads(op, [x], 3), start=1):
        torch.testing.assert_close(grad, torch.polygamma(n + order, POSITIVE), rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(op, (x,), check_forward_ad=True, check_batched_grad=True)
    assert torch.autograd.gradgradcheck(op, (x,), check_fwd_over_rev=True)


def test_trigamma_and_digamma_keep_one_derivative_chain(ops):
    x = POSITIVE.clone().requires_grad_()
    torch.testing.assert_close(ops.trigamma_op(x), torch.polygamma(1, x) - torch.digamma(x))
    (grad,), (again,) = _grads(ops.trigamma_op, [x], 2)
    torch.testing.assert_close(grad, torch.polygamma(2, POSITIVE) - torch.polygamma(1, POSITIVE))
    torch.testing.assert_close(again, torch.polygamma(3, POSITIVE) - torch.polygamma(2, POSITIVE))


def test_jvp_and_vmap_against_torch(ops):
    t = torch.linspace(-1, 1, A.numel(), dtype=DTYPE)
    for name, native in BINARY.items():
        op = getattr(ops, name)
        torch.testing.assert_close(torch.func.jvp(op, (A, B), (t, -t)), torch.func.jvp(native, (A, B), (t, -t)))
        grad = torch.func.grad(lambda a, b, f=op: f(a, b).sum(), argnums=(0, 1))
        want = torch.func.grad(lambda a, b, f=native: f(a, b).sum(), argnums=(0, 1))
        torch.testing.assert_close(
            torch.func.vmap(grad)(A.reshape(2, 3), B.reshape(2, 3)),
            torch.func.vmap(want)(A.reshape(2, 3), B.reshape(2, 3)),
        )
    s = torch.linspace(0.5, 1, POSITIVE.numel(), dtype=DTYPE)
    torch.testing.assert_close(
        torch.func.jvp(ops.polygamma2, (POSITIVE,), (s,)),
        torch.func.jvp(lambda v: torch.polygamma(2, v), (POSITIVE,), (s,)),
    )
    torch.testing.assert_close(
        torch.func.vmap(ops.frac_op)(X.reshape(2, 4)), torch.func.vmap(torch.frac)(X.reshape(2, 4))
    )


def test_of_plain_numbers(ops):
    x = X.abs() + 0.1
    c = torch.tensor(2.5, dtype=DTYPE)
    want = (
        torch.remainder(x, 2.5)
        + torch.fmod(c, x)
        + torch.remainder(7.0, x) * 2
        + x * torch.polygamma(1, c)
        + torch.fmod(-c, 2)
    )
    torch.testing.assert_close(ops.of_numbers(x, 2.5), want)


def test_compiled_and_custom_op(ops):
    a = A.clone().requires_grad_()
    compiled = torch.compile(ops.remainder_op, fullgraph=True, backend="aot_eager")
    (got,) = torch.autograd.grad(compiled(a, B).sum(), a)
    (want,) = torch.autograd.grad(torch.remainder(a, B).sum(), a)
    torch.testing.assert_close(got, want)
    torch.library.opcheck(torch.ops.integer_parts_ops.fmod_custom, (A, B))
    torch.library.opcheck(torch.ops.integer_parts_ops.polygamma_custom, (POSITIVE,))
    args = [A.clone().requires_grad_(), B.clone().requires_grad_()]
    assert torch.autograd.gradgradcheck(ops.fmod_custom, tuple(args))
    torch.testing.assert_close(ops.polygamma_custom(POSITIVE), torch.polygamma(2, POSITIVE))


SCOPE = Scope(names={"x": Value(sympy.Symbol("x"), NUM)}, tensors=frozenset())


@pytest.mark.parametrize(
    ("text", "value"), [("7 % 2", 1), ("-7 % 2", 1), ("7 % -2", -1), ("fmod(-7, 2)", -1), ("fmod(7.5, -2)", 1.5)]
)
def test_remainders_of_numbers_are_exact(text, value):
    assert read_formula(Formula(text, Loc("f.yaml", 2, 7)), SCOPE) == sympy.nsimplify(value)


@pytest.mark.parametrize(
    ("text", "expected", "col"),
    [
        ("polygamma(1.5, x)", "whole-number literal from 0 to 20, not `1.5`", 17),
        ("polygamma(x, x)", "whole-number literal from 0 to 20, not `x`", 17),
        ("polygamma(-1, x)", "not `-1`", 17),
        ("polygamma(21, x)", "not `21`", 17),
        ("polygamma(True, x)", "not `True`", 17),
        ("polygamma(x)", "polygamma() takes 2 arguments, got 1", 7),
        ("x % 0", "remainder by the constant zero", 7),
        ("fmod(x, 0)", "fmod() by the constant zero", 7),
        ("fmod(x)", "fmod() takes 2 arguments, got 1", 7),
        ("trunc(x, 2)", "trunc() takes 1 argument, got 2", 7),
        ("x // 2", "`//` is not allowed", 7),
    ],
)
def test_misuse_is_a_located_error(text, expected, col):
    with pytest.raises(SpecError) as error:
        read_formula(Formula(text, Loc("f.yaml", 2, 7)), SCOPE)
    assert expected in error.value.message, error.value.message
    assert str(error.value.loc) == f"f.yaml:2:{col}"
