"""The stable rewrites (Note [stable rewrites] in opgen/optimize/rewrite.py): exact, and what they fix.

Every rule is checked at 50 significant digits against the formula it replaces, value and
derivative, at points where the naive float formula overflows or cancels; then the
generated ops are run in float32 where the naive formulas give inf or NaN.
"""

from __future__ import annotations

import math

import pytest
import sympy
import torch
from conftest import ROOT, generate_op, import_package
from spec_ops import build_ops

from opgen.emit.render import Renderer
from opgen.formula import functions as fn
from opgen.optimize import rewrite as rw
from opgen.optimize.product_rules import sinc
from opgen.pipeline import build

x, y, beta = sympy.symbols("x y beta", real=True)
E = sympy.exp
PREC = 50

# (formula as written, the function the rewrite must introduce, sample points {symbol: value})
RULES = [
    (sympy.log(1 + x), fn.log1p, [{x: v} for v in ("1e-30", "0.5", "-0.999", "1e6")]),
    (E(x) - 1, fn.expm1, [{x: v} for v in ("1e-30", "-3", "2", "40")]),
    (2 * (E(x) - 1), fn.expm1, [{x: v} for v in ("1e-25", "5")]),
    (sympy.log(1 + E(beta * x)) / beta, fn.softplus, [{x: v, beta: "1.5"} for v in ("-100", "0", "30", "100")]),
    (1 / (1 + E(-x)), fn.sigmoid, [{x: v} for v in ("-100", "-1", "0", "1", "100")]),
    (x / (1 + E(-beta * x)), fn.sigmoid, [{x: v, beta: "2"} for v in ("-100", "0.25", "100")]),
    (E(x) / (1 + E(x)), fn.sigmoid, [{x: v} for v in ("-100", "3", "100")]),
    (-sympy.log(1 + E(-x)), rw.logsigmoid, [{x: v} for v in ("-100", "0", "100")]),
    (sympy.log(1 / (1 + E(-x))), rw.logsigmoid, [{x: v} for v in ("-100", "0.5", "100")]),
    (sympy.log(fn.sigmoid(x)), rw.logsigmoid, [{x: v} for v in ("-50", "2")]),
    (sympy.log(1 - fn.sigmoid(x)), rw.logsigmoid, [{x: v} for v in ("-50", "0", "2", "5")]),
    (sympy.log(1 - 1 / (1 + E(-beta * x))), rw.logsigmoid, [{x: v, beta: "1.5"} for v in ("-50", "0.5", "3")]),
    (sympy.log(E(x) + E(y)), rw.logaddexp, [{x: "100", y: "100"}, {x: "-3", y: "200"}, {x: "1e-9", y: "-1e-9"}]),
    (sympy.log(2 * E(x) + 3 * E(y)), rw.logaddexp, [{x: "100", y: "100"}, {x: "-3", y: "200"}, {x: "1", y: "-1"}]),
    (sympy.log(E(x) / 4 + E(y) / 4), rw.logaddexp, [{x: "100", y: "90"}, {x: "-3", y: "200"}]),
    (
        sympy.log((1 + E(beta * x)) / (1 + E(beta * (x - 1)))),
        fn.softplus,
        [{x: v, beta: "5"} for v in ("-100", "0.5", "100")],
    ),
    (sympy.log(2 * fn.sigmoid(x) / (1 + E(y))), rw.logsigmoid, [{x: "-200", y: "150"}, {x: "1", y: "-2"}]),
    (x * E(x) * (1 - sympy.tanh(E(x)) ** 2), fn.sigmoid, [{x: v} for v in ("-30", "0.5", "3")]),
    (E(x) * fn.sigmoid(-E(x)) ** 2, fn.sigmoid, [{x: v} for v in ("-30", "0.5", "3")]),
    # Note [decaying factors]: arguments SymPy knows non-negative, and 1 - sigmoid(u), 1/cosh(u)**k
    (E(x) * (1 - sympy.tanh(fn.softplus(x)) ** 2), fn.sigmoid, [{x: v} for v in ("-30", "0.5", "3")]),
    (E(x) * (1 - sympy.tanh(x**2 + 1) ** 2), fn.sigmoid, [{x: v} for v in ("-3", "0.5", "2")]),
    (E(x) * (1 - sympy.tanh(E(x) + 1) ** 2), fn.sigmoid, [{x: v} for v in ("-30", "0.5", "3")]),
    (E(x) * (1 - sympy.tanh(sympy.Abs(x)) ** 2), fn.sigmoid, [{x: v} for v in ("-30", "0.5", "3")]),
    (E(x) * fn.sigmoid(E(x)) * (1 - fn.sigmoid(E(x))), fn.sigmoid, [{x: v} for v in ("-30", "0.5", "3")]),
    (E(x) * (1 - fn.sigmoid(x**2)) ** 2, fn.sigmoid, [{x: v} for v in ("-3", "0.5", "4")]),
    (E(x) / sympy.cosh(E(x)), fn.sigmoid, [{x: v} for v in ("-30", "0.5", "3")]),
    (x * E(x) / sympy.cosh(x**2) ** 3, fn.sigmoid, [{x: v} for v in ("-3", "0.5", "2")]),
    # Note [sums beside a decaying exponential]: the sum's growing term joins the exponential
    ((1 - 2 * E(x)) * E(x - 2 * E(x)), E, [{x: v} for v in ("-30", "-0.7", "0.5", "3")]),
    (sympy.sinh(x**2) / sympy.cosh(x**2) ** 3, sympy.tanh, [{x: v} for v in ("-3", "0.5", "2")]),
    (x * sympy.sinh(x) / sympy.cosh(x), sympy.tanh, [{x: v} for v in ("-30", "0.5", "3")]),
    (sympy.log((E(x) + E(-x)) / 2), rw.logcosh, [{x: v} for v in ("-200", "1e-3", "0.5", "200")]),
    (sympy.log(1 - E(-x)), rw.log1mexp, [{x: v} for v in ("1e-8", "1e-3", "0.6", "0.75", "40", "200")]),
    (fn.log1p(-E(x * y)), rw.log1mexp, [{x: v, y: "-2"} for v in ("1e-9", "0.3", "30")]),
    ((1 + x**2 / sympy.Abs(y - 2)) ** (y / 2) - 1, fn.expm1, [{x: v, y: "1e-6"} for v in ("1e-8", "0.5", "1e4")]),
    (3 * (E(x) + 1) ** beta - 3, fn.expm1, [{x: v, beta: "1e-7"} for v in ("-40", "0.5", "30")]),
    (sympy.sqrt(x**2 + y**2), rw.hypot, [{x: "1e30", y: "3e29"}, {x: "3", y: "-4"}, {x: "1e-30", y: "2e-30"}]),
    ((1 - x) * sympy.log(1 - x), fn.xlog1py, [{x: v} for v in ("1e-30", "0.5", "-3", "0.999999")]),
    (-(1 - x) * sympy.log(1 - x) * y, fn.xlog1py, [{x: v, y: "3"} for v in ("1e-20", "0.25")]),
    (sympy.sin(sympy.pi * x) / (sympy.pi * x), sinc, [{x: v} for v in ("1e-5", "0.5", "-2.5", "30.25")]),
    (x * sympy.log(x), fn.xlogy, [{x: v} for v in ("1e-30", "0.5", "3")]),
    (-beta * x * sympy.log(x), fn.xlogy, [{x: v, beta: "2"} for v in ("1e-20", "0.25")]),
    (sympy.sin(x) * sympy.log(sympy.sin(x)), fn.xlogy, [{x: v} for v in ("1e-20", "0.5", "3")]),
    (-sympy.sin(x) * sympy.log(sympy.sin(x)) * y, fn.xlogy, [{x: v, y: "3"} for v in ("1e-20", "1.5")]),
    ((sympy.sin(x) - x) * sympy.log(x - sympy.sin(x)), fn.xlogy, [{x: v} for v in ("1e-5", "2")]),
]


def test_a_sum_beside_a_decaying_exponential_is_multiplied_in():
    """`(1 - 2 exp(x)) exp(x - 2 exp(x))` is -inf * 0 in float32 at x = 100; multiplied out, 0."""
    rewritten = rw.rewrite((1 - 2 * E(x)) * E(x - 2 * E(x)))
    assert rewritten == E(x - 2 * E(x)) - 2 * E(2 * x - 2 * E(x))
    value = sympy.lambdify(x, rewritten, "math")
    assert value(100.0) == 0.0 and value(-30.0) != 0.0
    # Any exponential beside a sum that holds one is multiplied in (Note [ratios of exponentials] in
    # opgen/optimize/rewrite.py): as written this is -inf * 0 at x = 100 too.
    square = rw.rewrite((1 - 2 * E(x)) * E(x - 2 * x**2))
    assert square == E(x - 2 * x**2) - 2 * E(2 * x - 2 * x**2)
    assert sympy.lambdify(x, square, "math")(100.0) == 0.0


def test_powers_of_one_base_combine():
    """`g * u**g / u`, SymPy's derivative of `u**g`, is 0/0 at u = 0; `g * u**(g - 1)` is not."""
    u = 1 - x * fn.sigmoid(x)
    written = sympy.diff(u**beta, x)
    assert written.has(1 / u)  # SymPy's form, which this rule exists for
    rewritten = rw.rewrite(written)
    assert not rewritten.has(1 / u) and rewritten.has(u ** (beta - 1))
    for point in ({x: "0.3", beta: "2.5"}, {x: "-4", beta: "0.5"}):
        assert _close(_value(rewritten, point), _value(written, point))


def _value(expr: sympy.Expr, point: dict[sympy.Symbol, str]) -> sympy.Float:
    return sympy.N(expr.subs({s: sympy.Float(v, PREC) for s, v in point.items()}), PREC)


def _close(a: sympy.Expr, b: sympy.Expr) -> bool:
    return abs(a - b) <= sympy.Float(10) ** -(PREC - 8) * max(1, abs(a), abs(b))


@pytest.mark.parametrize("formula, function, points", RULES, ids=[str(r[0]) for r in RULES])
def test_rule_is_an_exact_identity_with_the_same_derivative(formula, function, points):
    rewritten = rw.rewrite(formula)
    assert rewritten.atoms(function), f"{formula} was not rewritten with {function.__name__}: {rewritten}"
    derivative = rw.rewrite(sympy.diff(rewritten, x))
    for point in points:
        assert _close(_value(rewritten, point), _value(formula, point)), point
        assert _close(_value(derivative, point), _value(sympy.diff(formula, x), point)), point


def test_double_angle_is_one_sine():
    u = beta * x
    rewritten = rw.rewrite(3 * y * sympy.sin(u) * sympy.cos(u))
    assert rewritten == 3 * y * sympy.sin(2 * u) / 2
    for point in ({x: "0.3", y: "2", beta: "1.7"}, {x: "-40", y: "1e-3", beta: "3"}):
        assert _close(_value(rewritten, point), _value(3 * y * sympy.sin(u) * sympy.cos(u), point))


def test_sinc_stays_only_where_it_keeps_a_sum_finite():
    """Note [sinc that buys nothing]: snake's slope in `a` divides by `a` in its other term."""
    a = beta
    snake = x + sympy.sin(a * x) ** 2 / a
    slope = rw._rewritten(sympy.diff(rw.rewrite(snake), a), {})
    assert not slope.has(sinc) and not slope.has(sympy.cos), slope
    for point in ({x: "0.3", a: "1.7"}, {x: "-40", a: "1e-3"}, {x: "1e-20", a: "2"}):
        assert _close(_value(slope, point), _value(sympy.diff(snake, a), point)), point
    alone = rw._rewritten(sympy.diff(sympy.sin(a * x) / a, x), {})  # finite at a = 0 only through sinc
    assert rw._rewritten(sympy.sin(a * x) / a + x, {}).has(sinc) and alone == sympy.cos(a * x)


def test_formulas_without_a_pattern_stay_as_written():
    # x**beta - 1 with a negative x and a whole beta is a number, its log NaN: not rewritten (Note [powers less one])
    for formula in (
        2 * y * sympy.sin(x),
        sympy.log(2 + x),
        E(x) - 2,
        sympy.sqrt(x**2 + 1),
        x * sympy.tanh(x),
        x**beta - 1,
    ):
        assert rw.rewrite(formula) == formula


def test_sinc_gradient_at_zero_is_torch_sinc_gradient():
    derivative = sympy.diff(sinc(x), x)
    assert derivative.subs(x, 0) == 0
    t = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(torch.sinc(t).sum(), t)
    assert grad.item() == 0


def _float32_grad(op, values, *args):
    t = torch.tensor(values, dtype=torch.float32, requires_grad=True)
    out = op(t, *args)
    (grad,) = torch.autograd.grad(out.sum(), t)
    return out, grad


def test_swish_gradient_is_finite_at_large_inputs():
    swish = import_package(ROOT, "generated").swish
    values = [-100.0, -30.0, 30.0, 100.0]
    out, grad = _float32_grad(swish, values, 1.0)
    assert torch.isfinite(out).all() and torch.isfinite(grad).all()
    # The derivative of x / (1 + exp(-x)) at 50 digits, rounded to float32.
    exact = [float(_value(sympy.diff(x / (1 + E(-x)), x), {x: repr(v)})) for v in values]
    torch.testing.assert_close(grad, torch.tensor(exact, dtype=torch.float32))
    # What the formula as written gives in float32: the reason for the rewrite.
    naive_t = torch.tensor(values, requires_grad=True)
    (naive,) = torch.autograd.grad((naive_t / (1 + torch.exp(-naive_t))).sum(), naive_t)
    assert not torch.isfinite(naive).all()


@pytest.mark.parametrize(
    "name, values", [("softplus", [-100.0, 100.0]), ("logsigmoid", [-100.0, 100.0]), ("sigmoid", [-100.0, 100.0])]
)
def test_rewritten_spec_library_ops_are_finite_in_float32(name, values):
    op = getattr(import_package(ROOT, "generated"), name)
    out, grad = _float32_grad(op, values)
    assert torch.isfinite(out).all() and torch.isfinite(grad).all(), (out, grad)


SWISH = "name: op\ninputs:\n  x: Tensor\noutputs:\n  y: x / (1 + exp(-x))\n"


def test_optimize_rewrite_false_keeps_the_formula_as_written(tmp_path):
    assert "torch.sigmoid(x)" in generate_op(tmp_path, SWISH)
    kept = generate_op(tmp_path, SWISH + "optimize:\n  rewrite: false\n")
    assert "torch.sigmoid" not in kept and "torch.exp(-x)" in kept


def test_optimize_section_errors_are_located(tmp_path):
    (tmp_path / "op.yaml").write_text(SWISH + "optimize:\n  rewrite: maybe\n  rewirte: true\n")
    result = build([str(tmp_path / "op.yaml")], Renderer())
    report = "\n".join(result.problems.report())
    assert "op.yaml:8:3: unknown key 'rewirte' in optimize; did you mean 'rewrite'?" in report
    assert "op.yaml:7:12: optimize.rewrite must be true or false" in report


def test_hypot_and_logaddexp_print_as_torch_calls(tmp_path):
    text = "name: op\ninputs:\n  a: Tensor\n  b: Tensor\noutputs:\n  y: log(exp(a) + exp(b)) + sqrt(a**2 + b**2)\n"
    source = generate_op(tmp_path, text)
    assert "torch.logaddexp(a, b)" in source and "torch.hypot(a, b)" in source
    assert math.isfinite(torch.logaddexp(torch.tensor(100.0), torch.tensor(100.0)).item())


def test_gradients_are_put_over_a_common_denominator_when_shorter():
    t = sympy.Abs(x) + 1
    assert rw._shorter(rw.rewrite(1 / t - x * fn.sign(x) / t**2)) == 1 / t**2
    kept = fn.sigmoid(x) + x
    assert rw._shorter(kept) == kept


BCE = """\
name: bce
inputs:
  input: Tensor
  target: Tensor
outputs:
  loss: -(target * log(sigmoid(input)) + (1 - target) * log(1 - sigmoid(input)))
"""


def test_textbook_bce_of_sigmoid_is_finite_where_native_bce_is(tmp_path):
    """`log(1 - sigmoid(u))` is `logsigmoid(-u)`: in float32, `1 - sigmoid(30)` is 0 and its log -inf."""
    bce = build_ops(tmp_path, "bce_ops", {"bce": BCE}).bce
    values = [-1e4, -100.0, -30.0, -1.0, 0.0, 1.0, 30.0, 100.0, 1e4]
    for target in (0.0, 0.5, 1.0):
        x = torch.tensor(values, requires_grad=True)
        t = torch.full_like(x, target)
        (grad,) = torch.autograd.grad(bce(x, t).sum(), x)
        x64 = x.detach().double().requires_grad_()
        native = torch.nn.functional.binary_cross_entropy_with_logits(x64, t.double(), reduction="none")
        (native_grad,) = torch.autograd.grad(native.sum(), x64)
        torch.testing.assert_close(bce(x, t).detach().double(), native.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad.double(), native_grad, rtol=1e-5, atol=1e-6)


FOCAL_WITH_LETS = """\
name: focal
inputs:
  logits: Tensor
  target: Tensor
  gamma: float = 2.0
let:
  p: sigmoid(logits)
  p_t: p * target + (1 - p) * (1 - target)
  ce: -(target * log(p) + (1 - target) * log(1 - p))
outputs:
  loss: (1 - p_t)**gamma * ce
"""


def test_stable_forms_span_lets_of_elementwise_formulas(tmp_path):
    """`p: sigmoid(logits)` then `log(p)`, `log(1 - p)` in another let are logsigmoids (Note [stable forms
    through lets] in opgen/optimize/passes.py): finite in float32 where torchvision's focal loss is."""
    focal = build_ops(tmp_path, "focal_ops", {"focal": FOCAL_WITH_LETS}).focal
    values = [-1e4, -100.0, -30.0, -1.0, 0.0, 1.0, 30.0, 100.0, 1e4]
    for target in (0.0, 0.25, 1.0):
        x = torch.tensor(values, requires_grad=True)
        t = torch.full_like(x, target)
        out = focal(x, t, 2.0)
        (grad,) = torch.autograd.grad(out.sum(), x)
        x64 = x.detach().double().requires_grad_()
        p = torch.sigmoid(x64)
        p_t = p * target + (1 - p) * (1 - target)
        ce = torch.nn.functional.binary_cross_entropy_with_logits(x64, t.double(), reduction="none")
        expected = (1 - p_t) ** 2 * ce
        (expected_grad,) = torch.autograd.grad(expected.sum(), x64)
        torch.testing.assert_close(out.detach().double(), expected.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-4, atol=1e-6)


def test_cosh_written_with_exponentials_is_finite_in_float32(tmp_path):
    """`log((exp(x) + exp(-x)) / 2)` is log-cosh: exp(100) overflows float32, the loss does not."""
    text = "name: log_cosh_exp\ninputs:\n  x: Tensor\noutputs:\n  y: log((exp(x) + exp(-x)) / 2)\n"
    op = build_ops(tmp_path, "log_cosh_ops", {"log_cosh_exp": text}).log_cosh_exp
    values = [-1e4, -100.0, -30.0, -1.0, 0.0, 0.5, 30.0, 100.0, 1e4]
    out, grad = _float32_grad(op, values)
    x = torch.tensor(values, dtype=torch.float64)
    exact = x.abs() + torch.nn.functional.softplus(-2 * x.abs()) - math.log(2)
    torch.testing.assert_close(out.double(), exact, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad.double(), torch.tanh(x), rtol=1e-6, atol=1e-6)
