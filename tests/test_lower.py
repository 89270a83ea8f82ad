"""Lowering to PyTorch's native kernels (opgen/optimize/lower.py, the primitives of opgen/nodes/).

Each primitive's SymPy formula must be the function PyTorch's kernel computes, and its
derivative PyTorch's backward kernel: both are checked against torch in float64. The
matcher must find the primitives in formulas as people write them, and only there.
"""

from __future__ import annotations

import pytest
import sympy
import torch
import torch.nn.functional as F
from conftest import generate_op, import_package

from opgen.formula import functions as fn
from opgen.nodes.activations import elu, gelu, gelu_tanh, leaky_relu, mish, silu, softplus_beta
from opgen.nodes.clips import hardsigmoid, hardswish, hardtanh
from opgen.nodes.kernels import Primitive
from opgen.nodes.losses import huber, smooth_l1
from opgen.optimize import lower as lw
from opgen.optimize.rewrite import rewrite

x, y, beta, alpha = sympy.symbols("x y beta alpha", real=True)
NUMBERS = frozenset({beta, alpha})
HALF = sympy.Rational(1, 2)

# primitive, its arguments after x, PyTorch's op with the same arguments
NATIVE = [
    (silu, (), F.silu),
    (mish, (), F.mish),
    (gelu, (), F.gelu),
    (gelu_tanh, (), lambda t: F.gelu(t, approximate="tanh")),
    (softplus_beta, (1.5,), lambda t: F.softplus(t, 1.5)),
    (elu, (0.7,), lambda t: F.elu(t, 0.7)),
    (leaky_relu, (0.1,), lambda t: F.leaky_relu(t, 0.1)),  # the points include the kink 0
    (hardtanh, (-1.5, 6), lambda t: F.hardtanh(t, -1.5, 6.0)),  # and both bounds
    (huber, (1.5,), lambda t: F.huber_loss(t, torch.zeros_like(t), reduction="none", delta=1.5)),
    (smooth_l1, (1.5,), lambda t: F.smooth_l1_loss(t, torch.zeros_like(t), reduction="none", beta=1.5)),
    (hardsigmoid, (), F.hardsigmoid),  # the points include the kinks -3 and 3
    (hardswish, (), F.hardswish),
]


@pytest.mark.parametrize("primitive, params, native", NATIVE, ids=[p[0].__name__ for p in NATIVE])
def test_primitive_formula_and_derivative_are_pytorchs(primitive, params, native):
    points = torch.linspace(-12, 12, 97, dtype=torch.float64, requires_grad=True)
    expected = native(points)
    (expected_grad,) = torch.autograd.grad(expected.sum(), points)
    call = primitive(x, *params)
    derivative = sympy.diff(call, x)
    value_fn = _lambdify(call.elementary(), modules=_MODULES)
    grad_fn = _lambdify(derivative.elementary(), modules=_MODULES)
    torch.testing.assert_close(value_fn(points.detach()), expected.detach())
    torch.testing.assert_close(_f64(grad_fn(points.detach())), expected_grad)  # (where(c, 1, 0) is int)
    # The form fused mode compiles is the same function (mish: through sigmoid, not tanh).
    fused_fn = _lambdify(call.fused_form(), modules=_MODULES)
    fused_grad_fn = _lambdify(derivative.fused_form(), modules=_MODULES)
    torch.testing.assert_close(fused_fn(points.detach()), expected.detach())
    torch.testing.assert_close(_f64(fused_grad_fn(points.detach())), expected_grad)


def _lambdify(expr: sympy.Expr, modules: list) -> object:
    """A torch function of x; `sign` as torch.sign (SymPy's math printer writes it inline for floats)."""
    tsign = sympy.Function("tsign")
    return sympy.lambdify(x, expr.replace(sympy.sign, lambda a: tsign(a)), modules=[{"tsign": torch.sign}, *modules])


def _f64(value):
    return torch.as_tensor(value, dtype=torch.float64)


_MODULES = [
    {
        "sigmoid": torch.sigmoid,
        "softplus": F.softplus,
        "expm1": torch.expm1,
        "where": torch.where,
        "erf": torch.erf,
        "exp": torch.exp,
        "tanh": torch.tanh,
        "sqrt": lambda v: torch.sqrt(torch.as_tensor(v, dtype=torch.float64)),
        "maximum": lambda a, b, _: torch.maximum(_f64(a), _f64(b)),
        "Abs": torch.abs,
        "minimum": lambda a, b, _: torch.minimum(_f64(a), _f64(b)),
    },
    "math",
]


@pytest.mark.parametrize(
    "formula, expected",
    [
        (x * fn.sigmoid(x), silu(x)),
        (x / (1 + sympy.exp(-x)), silu(x)),
        (x * sympy.tanh(fn.softplus(x)), mish(x)),
        (x * sympy.tanh(sympy.log(1 + sympy.exp(x))), mish(x)),
        (sympy.Rational(1, 2) * x * (1 + sympy.erf(x / sympy.sqrt(2))), gelu(x)),
        (
            sympy.Rational(1, 2)
            * x
            * (1 + sympy.tanh(sympy.sqrt(2 / sympy.pi) * (x + sympy.Rational("0.044715") * x**3))),
            gelu_tanh(x),
        ),
        (sympy.log(1 + sympy.exp(beta * x)) / beta, softplus_beta(x, beta)),
        (fn.where(x > 0, x, alpha * (sympy.exp(x) - 1)), elu(x, alpha)),
        (3 + x * fn.sigmoid(x), 3 + silu(x)),
        (fn.where(x > 0, x, alpha * x), leaky_relu(x, alpha)),
        (fn.maximum(fn.minimum(x, 6, 0), 0, 0), hardtanh(x, 0, 6)),
        (fn.minimum(fn.maximum(x, alpha, 0), beta, 0), hardtanh(x, sympy.Min(alpha, beta), beta)),
        (fn.maximum(fn.minimum(x, alpha, 0), 0, 0), hardtanh(x, 0, sympy.Max(0, alpha))),
        (
            fn.where(sympy.Abs(x - y) < beta, (x - y) ** 2 / 2, beta * (sympy.Abs(x - y) - beta / 2)),
            huber(x - y, beta),
        ),
        (  # `<=`: the branches meet with the same value and slope (Note [kinks of lowered primitives])
            fn.where(sympy.Abs(x) <= beta, x**2 / (2 * beta), sympy.Abs(x) - beta / 2),
            smooth_l1(x, beta),
        ),
        (fn.where(sympy.Abs(x) >= 2, sympy.Abs(x) - 1, x**2 / 4), smooth_l1(x, 2)),
        (fn.where(sympy.Abs(x) < HALF, x**2, sympy.Abs(x) - HALF / 2), smooth_l1(x, HALF)),
        (x * fn.minimum(fn.maximum(x + 3, 0, 0), 6, 0) / 6, hardswish(x)),
        (x * fn.maximum(fn.minimum(x + 3, 6, 0), 0, 0) / 6, hardswish(x)),
        (x * fn.maximum(fn.minimum(x / 6 + HALF, 1, 0), 0, 0), hardswish(x)),
        (2 * x * fn.minimum(fn.maximum(2 * x + 3, 0, 0), 6, 0) / 6, hardswish(2 * x)),
        (y * x * fn.minimum(fn.maximum(x + 3, 0, 0), 6, 0), 6 * y * hardswish(x)),
        (fn.minimum(fn.maximum(x + 3, 0, 0), 6, 0) / 6, hardsigmoid(x)),
        (fn.maximum(fn.minimum(x / 6 + HALF, 1, 0), 0, 0), hardsigmoid(x)),
    ],
)
def test_formulas_as_written_lower_to_the_primitive(formula, expected):
    assert lw.lower(rewrite(formula), NUMBERS) == expected


@pytest.mark.parametrize(
    "formula",
    [
        x * fn.sigmoid(2 * x),  # silu(2x)/2 would be exact only for a nonzero factor
        2 * x * fn.sigmoid(x) * x,
        sympy.Rational(1, 3) * x * (1 + sympy.erf(x / sympy.sqrt(2))),
        fn.softplus(x * x) / x,  # the "beta" holds a tensor
        fn.where(x > 0, x, x * fn.expm1(x)),  # alpha must be a number
        fn.where(x > 1, x, alpha * fn.expm1(x)),
        fn.where(x > 0, x, x * x),  # the slope must be a number
        fn.maximum(fn.minimum(x, 0, 0), 6, 0),  # bounds the wrong way round: the constant 6
        fn.maximum(fn.minimum(x, 6, 0), x, 0),  # a bound holding a tensor
        fn.where(sympy.Abs(x) < -1, x**2 / 2, -(sympy.Abs(x) + sympy.Rational(1, 2))),  # delta <= 0
        fn.where(sympy.Abs(x) < 1, x**2, sympy.Abs(x) - sympy.Rational(1, 2)),  # not halved
        fn.where(sympy.Abs(x) < 2, x**2 / 4, sympy.Abs(x) - 2),  # the branches do not meet
        x * fn.clamp(x + 3, 0, 6) / 6,  # clamp passes the gradient at -3 and 3: F.hardswish does not
        fn.clamp(x / 6 + HALF, 0, 1),
    ],
)
def test_near_misses_are_not_lowered(formula):
    lowered = lw.lower(formula, NUMBERS)
    assert not lowered.atoms(Primitive), lowered


@pytest.mark.parametrize(
    "formula",
    [
        x * fn.minimum(fn.maximum(x + 3, 0, 0), alpha, 0) / 6,  # a bound given as an input
        fn.maximum(fn.minimum(x, 1, 0), 0, 0),  # hardsigmoid(6x - 3) costs more than the clip
        fn.minimum(fn.maximum(x + 3, 0, 0), 6, 0),  # 6 * hardsigmoid(x): no cheaper
    ],
)
def test_clips_that_are_not_hardsigmoid_stay_clips(formula):
    lowered = lw.lower(formula, NUMBERS)
    assert not lowered.atoms(hardswish, hardsigmoid) and lowered.atoms(hardtanh), lowered


def test_hardswish_with_a_factor_keeps_it():
    assert lw.lower(x * fn.minimum(fn.maximum(x + 3, 0, 0), 6, 0) / 5, NUMBERS) == hardswish(x) * 6 / 5


SILU = "name: op\ninputs:\n  x: Tensor\noutputs:\n  y: x * sigmoid(x)\n"
SIGMOID = "name: op\ninputs:\n  x: Tensor\noutputs:\n  y: sigmoid(x)\n"


def test_backward_kernel_without_derivative_is_skipped_under_create_graph(tmp_path):
    source = generate_op(tmp_path, SILU)
    assert "torch.nn.functional.silu(x)" in source
    assert "torch.is_grad_enabled()" in source and "torch.ops.aten.silu_backward(grad_y, x)" in source


def test_gradient_in_terms_of_the_output_saves_the_output(tmp_path):
    source = generate_op(tmp_path, SIGMOID)
    assert "ctx.save_for_backward(y)" in source and "sigmoid_backward(grad_y, y)" in source


def test_optimize_lower_false_keeps_plain_torch(tmp_path):
    source = generate_op(tmp_path, SILU + "optimize:\n  lower: false\n")
    assert "functional.silu" not in source and "aten" not in source and "x * torch.sigmoid(x)" in source
    source = generate_op(tmp_path, SIGMOID + "optimize:\n  lower: false\n")
    assert "aten" not in source and "grad_y * y * (1 - y)" in source


def test_forward_may_work_in_place_backward_never(tmp_path):
    source = generate_op(tmp_path, "name: op\ninputs:\n  x: Tensor\noutputs:\n  y: x * tanh(softplus(x))\n")
    forward, backward = source.split("def setup_context")[0], source.split("def backward")[1]
    assert ".mul_(x)" in forward and "torch.sigmoid(x)" in forward
    branches = backward.split("if torch.is_grad_enabled():")[1].split("return")[0]  # recorded first
    recorded, not_recorded = branches.split("else:")
    assert "_(" not in recorded.replace("needs_input_grad", "")  # create_graph=True: differentiable ops
    assert "torch.ops.aten.mish_backward(grad_y, x)" in not_recorded  # opgen.nodes.activations.mish


@pytest.mark.parametrize(
    "formula, native",
    [
        ("x * tanh(softplus(x))", F.mish),
        ("0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))", lambda t: F.gelu(t, approximate="tanh")),
    ],
)
def test_in_place_code_is_pytorchs_op(tmp_path, run_cli, formula, native):
    """Forward and the unrecorded backward work in place (Note [forward in place]); values are PyTorch's."""
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "op.yaml").write_text(f"name: op\ninputs:\n  x: Tensor\noutputs:\n  y: {formula}\n")
    assert run_cli("generate", str(specs), "-o", str(tmp_path / "in_place_ops"))[0] == 0
    op = import_package(tmp_path, "in_place_ops").op
    for dtype in (torch.float32, torch.float64):
        x = torch.cat([torch.linspace(-40, 40, 321), torch.tensor([-1e4, -1e-6, 0.0, 1e-6, 1e4])]).to(dtype)
        x.requires_grad_()
        (got,) = torch.autograd.grad(op(x).sum(), x)
        (want,) = torch.autograd.grad(native(x).sum(), x)
        torch.testing.assert_close(op(x), native(x))
        torch.testing.assert_close(got, want)


CLIPS = (
    "name: clips\ninputs:\n  x: Tensor\n  a: float\n  b: float\n"
    "outputs:\n  low: max(0, min(x, a))\n  high: min(max(x, a), b)\n"
)


@pytest.mark.parametrize("a, b", [(-1.0, 2.0), (0.0, 0.0), (0.5, 0.5), (1.5, -0.5), (0.0, -1.0), (2.0, 3.0)])
def test_clips_with_parameter_bounds_mean_the_formula_for_every_value(tmp_path, run_cli, a, b):
    """F.hardtanh refuses min_val > max_val; bounds that are inputs may be either way round, where
    the formula is a constant with a zero gradient (Note [parameters of lowered primitives])."""
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "clips.yaml").write_text(CLIPS)
    assert run_cli("generate", str(specs), "-o", str(tmp_path / "clip_ops"))[0] == 0
    op = import_package(tmp_path, "clip_ops").clips
    x = torch.linspace(-3, 3, 25, dtype=torch.float64, requires_grad=True)
    for k, want in enumerate((_clip(x, None, a, 0.0), _clip(x, a, b))):
        got = op(x, a, b)[k]
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(*(torch.autograd.grad(v.sum(), x)[0] for v in (got, want)))


def _clip(x, lo, hi, low=None):
    """max(min(x, hi), low) or min(max(x, lo), hi) by torch's ops, with the formula's zero slope where
    a value meets a bound (the tie goes to the number)."""
    if lo is None:
        inner = torch.where(x < hi, x, torch.full_like(x, hi))
        return torch.where(inner > low, inner, torch.full_like(x, low))
    inner = torch.where(x > lo, x, torch.full_like(x, lo))
    return torch.where(inner < hi, inner, torch.full_like(x, hi))
