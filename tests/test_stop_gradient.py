"""The inline stop-gradient `stop_gradient(e)` / `detach(e)` (Note [stop-gradient] in
opgen/nodes/stop_gradient.py) against the same formulas in plain torch with `.detach()`: values,
first and second derivatives (backward built from differentiable ops, so double backward works),
forward mode, vmap, torch.compile and the custom_op form, in float64."""

from __future__ import annotations

import pytest
import torch
from spec_ops import build_ops

from opgen.errors import Loc, SpecError
from opgen.formula.reader import Scope, read_formula
from opgen.formula.vocabulary import NUM, Value
from opgen.spec.model import Formula

DTYPE = torch.float64

SPECS = {
    "straight_through": """
        name: straight_through
        inputs: {x: Tensor, scale: float = 0.5}
        outputs: {y: x + stop_gradient(scale * round(x / scale) - x)}
    """,
    "stopped_mix": """
        name: stopped_mix
        inputs: {x: Tensor, t: Tensor}
        let: {u: t * x}
        outputs: {y: (x - detach(u))**2 * sin(stop_gradient(x) * t) + exp(stop_gradient(u) * x)}
    """,
    "stopped_target": """
        name: stopped_target
        inputs: {y: Tensor, t: Tensor}
        outputs: {loss: (sigmoid(y) - stop_gradient(sigmoid(t) * y))**2}
        form: custom_op
    """,
}


def _mix(x, t):
    u = t * x
    return (x - u.detach()) ** 2 * torch.sin(x.detach() * t) + torch.exp(u.detach() * x)


PLAIN = {
    "straight_through": (lambda x: x + (0.5 * torch.round(x / 0.5) - x).detach(), 1),
    "stopped_mix": (_mix, 2),
    "stopped_target": (lambda y, t: (torch.sigmoid(y) - (torch.sigmoid(t) * y).detach()) ** 2, 2),
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return build_ops(tmp_path_factory.mktemp("stop"), "stop_ops", SPECS)


def _inputs(count: int, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(6, generator=generator, dtype=DTYPE) * 3 - 1.5 for _ in range(count)]


def _derivatives(f, args):
    """Values, first derivatives along a fixed direction, second derivatives of their weighted sum."""
    args = [a.clone().requires_grad_() for a in args]
    out = f(*args)
    direction = torch.linspace(-1.0, 1.5, out.numel(), dtype=DTYPE)
    first = torch.autograd.grad(out, args, direction, create_graph=True, allow_unused=True, materialize_grads=True)
    total = sum((g * torch.linspace(0.5, 2.0, g.numel(), dtype=DTYPE)).sum() for g in first)
    second = [torch.zeros_like(a) for a in args]
    if total.requires_grad:
        second = list(torch.autograd.grad(total, args, allow_unused=True, materialize_grads=True))
    return [out.detach(), *(g.detach() for g in first), *second]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_derivatives_of_every_order_match_plain_torch(ops, name):
    plain, count = PLAIN[name]
    for seed in range(3):
        args = _inputs(count, seed)
        got = _derivatives(getattr(ops, name), args)
        want = _derivatives(plain, args)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_forward_mode_and_vmap_match_plain_torch(ops, name):
    plain, count = PLAIN[name]
    op = getattr(ops, name)
    args = _inputs(count, 1)
    tangents = tuple(_inputs(count, 2))
    got = torch.func.jvp(op, tuple(args), tangents)
    want = torch.func.jvp(plain, tuple(args), tangents)
    torch.testing.assert_close(got, want)
    batch = [torch.stack([_inputs(count, seed)[k] for seed in range(3)]) for k in range(count)]
    grad = torch.func.vmap(torch.func.grad(lambda *a: op(*a).sum()))(*batch)
    expected = torch.func.vmap(torch.func.grad(lambda *a: plain(*a).sum()))(*batch)
    torch.testing.assert_close(grad, expected)


def test_the_straight_through_estimator_has_the_rounded_value_and_the_identity_gradient(ops):
    x = torch.tensor([0.2, 0.3, -0.7, 1.26], dtype=DTYPE, requires_grad=True)
    y = ops.straight_through(x)
    torch.testing.assert_close(y, 0.5 * torch.round(x.detach() / 0.5))
    (grad,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(grad, torch.ones_like(x))


def test_compiled_without_graph_breaks(ops):
    args = [a.requires_grad_() for a in _inputs(2, 4)]
    compiled = torch.compile(ops.stopped_mix, fullgraph=True, backend="aot_eager")
    out = compiled(*args)
    grads = torch.autograd.grad(out.sum(), args)
    want = torch.autograd.grad(_mix(*args).sum(), args)
    torch.testing.assert_close(out, _mix(*args))
    torch.testing.assert_close(grads, want)


def test_the_custom_op_form_registers_and_passes_opcheck(ops):
    args = _inputs(2, 5)
    torch.library.opcheck(torch.ops.stop_ops.stopped_target, args)


def test_generated_source_detaches_only_the_stopped_parts(ops):
    import inspect

    source = inspect.getsource(ops.ops.straight_through)
    assert "(scale * torch.round(x / scale) - x).detach()" in source


SCOPE = Scope(names={"x": Value(__import__("sympy").Symbol("x"), NUM)}, tensors=frozenset())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("stop_gradient(x, x)", "stop_gradient() takes 1 argument, got 2"),
        ("x.detach()", "write `detach(x)`"),
        ("no_grad(x)", "write `stop_gradient(e)`"),
    ],
)
def test_misuse_is_a_located_error_with_a_fix(text, expected):
    with pytest.raises(SpecError) as error:
        read_formula(Formula(text, Loc("f.yaml", 3, 5)), SCOPE)
    assert expected in error.value.message, error.value.message
    assert error.value.loc.file == "f.yaml"


def test_the_vq_spec_matches_plain_torch_to_the_second_derivative():
    from conftest import ROOT, import_package

    generated = import_package(ROOT, "generated")

    def plain(z, e):
        quantized = z + (e - z).detach()
        loss = (z.detach() - e) ** 2 + 0.25 * (z - e.detach()) ** 2
        return quantized * torch.linspace(-1, 1, z.numel(), dtype=DTYPE) + loss

    def op(z, e):
        quantized, loss = generated.vq_straight_through(z, e)
        return quantized * torch.linspace(-1, 1, z.numel(), dtype=DTYPE) + loss

    args = _inputs(2, 7)
    for g, w in zip(_derivatives(op, args), _derivatives(plain, args), strict=True):
        torch.testing.assert_close(g, w)
