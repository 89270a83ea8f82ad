"""Exact finite forms of formulas that overflow or give NaN as written (Note [logs of exponentials],
Note [ratios of exponentials] in opgen/optimize/rewrite.py; Note [powers at a zero base] in
opgen/optimize/product_rules.py; Note [whose NaN] in opgen/plan/digits.py).

Each rule is checked as an exact identity at 50 digits with its derivative; each generated op is run
in float32 at the points where the formula as written overflows or is NaN, its value and its first
and second derivatives against PyTorch's native op or the formula in float64 where that is finite.
"""

from __future__ import annotations

import math

import mpmath
import pytest
import sympy
import torch
from spec_ops import build_ops

from opgen.formula import functions as fn
from opgen.nodes import special
from opgen.optimize import rewrite as rw
from opgen.plan import digits

x, y, s, m, a, b, t, p = sympy.symbols("x y s m a b t p", real=True)
E = sympy.exp
PREC = 50

# (formula as written, a function the rewrite must introduce (None: the formula must lose every exp), points)
RULES = [
    (sympy.log(2 * E(x)), None, [{x: v} for v in ("-1e4", "0.5", "100")]),
    (sympy.log(y**2 * E(3 * x) / 7), None, [{x: v, y: "2"} for v in ("-1e4", "0.5", "100")]),
    (sympy.log(2**x), None, [{x: v} for v in ("-300", "0.5", "300")]),
    (sympy.log(E(x) / 2 + sympy.Rational(1, 2)), fn.softplus, [{x: v} for v in ("-100", "0", "100")]),
    (sympy.log(3 * E(x) + 2), rw.logaddexp, [{x: v} for v in ("-100", "0", "100")]),
    (sympy.log(2**x + 2**y) / sympy.log(2), rw.logaddexp, [{x: "1e4", y: "3"}, {x: "-0.5", y: "-1e4"}]),
    ((E(x) - E(-x)) / (E(x) + E(-x)), sympy.tanh, [{x: v} for v in ("-1e4", "-0.3", "2", "100")]),
    ((E(2 * x) - 1) / (E(2 * x) + 1), sympy.tanh, [{x: v} for v in ("-100", "1e-8", "100")]),
    (3 * (1 - E(-x)) / (1 + E(-x)), sympy.tanh, [{x: v} for v in ("-100", "1e-8", "100")]),
    (2 * E(y) / (3 * E(x) + 3 * E(y)), fn.sigmoid, [{x: "100", y: "-100"}, {x: "0.5", y: "1"}]),
    ((m**2 + E(x)) / E(y), None, [{x: "100", y: "100", m: "2"}, {x: "-100", y: "-100", m: "0.5"}]),
    (sympy.log(x + sympy.sqrt(x**2 + 1)), sympy.asinh, [{x: v} for v in ("-1e3", "-0.5", "1e-8", "1e20")]),
    (sympy.log(x + sympy.sqrt(x**2 - 1)), sympy.acosh, [{x: v} for v in ("1.0001", "1.5", "1e20")]),
    (x**2 / (x**2 + 4), fn.where, [{x: v} for v in ("-1e20", "-1e-20", "0.5", "3", "1e20")]),
    (3 * x / (x - 1), fn.where, [{x: v} for v in ("-1e20", "1e-20", "0.5", "3", "1e20")]),
    (E(x**2) * sympy.erfc(x), special.erfcx, [{x: v} for v in ("-3", "0.5", "30", "1e4")]),
    (3 * E(x**2 + x) * sympy.erfc(x), special.erfcx, [{x: v} for v in ("-3", "0.5", "30")]),
    (sympy.log(sympy.erfc(-x / sympy.sqrt(2)) / 2), special.log_ndtr, [{x: v} for v in ("-1e4", "-30", "0.5", "30")]),
    (sympy.log(3 * sympy.erfc(x)), special.log_ndtr, [{x: v} for v in ("-3", "0.5", "100")]),
    (sympy.sqrt(2) * sympy.erfinv(2 * x - 1), special.ndtri, [{x: v} for v in ("1e-30", "0.3", "0.999")]),
    (t * sympy.log(t / p), fn.xlogy, [{t: v, p: "0.3"} for v in ("1e-30", "0.5", "2")]),
    (-3 * x * sympy.log(x * y), fn.xlogy, [{x: v, y: "4"} for v in ("1e-30", "0.5")]),
    (sympy.diff(sympy.Max(x, 0) ** y, y), fn.where, [{x: v, y: "1.5"} for v in ("1e-30", "0.5", "3")]),
]


def _value(expr: sympy.Expr, point: dict[sympy.Symbol, str]) -> sympy.Float:
    return sympy.N(expr.subs({k: sympy.Float(v, PREC) for k, v in point.items()}), PREC)


def _close(u: sympy.Expr, v: sympy.Expr) -> bool:
    return bool(abs(u - v) <= sympy.Float(10) ** -(PREC - 10) * max(1, abs(u), abs(v)))


@pytest.mark.parametrize("formula, function, points", RULES, ids=[str(r[0]) for r in RULES])
def test_rule_is_an_exact_identity_with_the_same_derivative(formula, function, points):
    rewritten = rw.rewrite(formula)
    if function is None:
        assert not rewritten.has(sympy.log) or not rewritten.has(E), rewritten
        assert rewritten != formula
    else:
        assert rewritten.atoms(function), f"{formula} was not rewritten with {function.__name__}: {rewritten}"
    moving = sorted(formula.free_symbols, key=str)[0]
    derivative = rw.rewrite(sympy.diff(rewritten, moving))
    for point in points:
        assert _close(_value(rewritten, point), _value(formula, point)), point
        assert _close(_value(derivative, point), _value(sympy.diff(formula, moving), point)), point


def test_a_log_of_a_sum_without_exponentials_keeps_its_other_rules():
    """The rules of products under a log do not take a log that has another stable form."""
    assert rw.rewrite(sympy.log(1 + x**2)) == fn.log1p(x**2)
    assert rw.rewrite(sympy.log(x**2)) == sympy.log(x**2)
    assert rw.rewrite(sympy.log(E(x) + x)) == sympy.log(E(x) + x)


def test_x_log_x_of_a_positive_factor_stays_as_written():
    """`t log(t / p)` with t > 0 has nothing to gain from xlogy (its derivative would carry a select)."""
    tp = sympy.Symbol("tp", positive=True)
    assert rw.rewrite(tp * sympy.log(tp / p)) == tp * sympy.log(tp / p)


def _orders(op, inputs, moving):
    """op's value and its first and second derivative (summed) in input `moving`, float32."""
    leaves = [torch.tensor(v, dtype=torch.float32, requires_grad=True) for v in inputs]
    out = op(*leaves)
    (first,) = torch.autograd.grad(out.sum(), leaves[moving], create_graph=True)
    if not first.requires_grad:  # a constant slope
        return out.detach().double(), first.double(), torch.zeros_like(first, dtype=torch.float64)
    (second,) = torch.autograd.grad(first.sum(), leaves[moving])
    return out.detach().double(), first.detach().double(), second.double()


def _reference(function, inputs, moving):
    leaves = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in inputs]
    out = function(*leaves)
    (first,) = torch.autograd.grad(out.sum(), leaves[moving], create_graph=True)
    if not first.requires_grad:  # a constant slope
        return out.detach(), first, torch.zeros_like(first)
    (second,) = torch.autograd.grad(first.sum(), leaves[moving], allow_unused=True)
    return out.detach(), first.detach(), torch.zeros_like(first) if second is None else second


LN2 = math.log(2)
# name: (spec outputs line, inputs, float64 reference (PyTorch's native op or the formula where float64 holds it),
#        points (one list per input), inputs to differentiate in)
OPS = {
    "log_two_exp": ("log(2 * exp(s))", "s", lambda s: s + LN2, [[-1e4, -100.0, 0.5, 100.0, 1e4]], [0]),
    "log_half_exp": (
        "log(0.5 * exp(x) + 0.5)",
        "x",
        lambda x: torch.nn.functional.softplus(x) - LN2,  # torch.logaddexp's second derivative is NaN at -1e4
        [[-1e4, -100.0, 0.0, 0.5, 100.0, 1e4]],
        [0],
    ),
    "tanh_written": (
        "(exp(x) - exp(-x)) / (exp(x) + exp(-x))",
        "x",
        torch.tanh,
        [[-1e4, -100.0, -0.3, 0.0, 2.0, 100.0, 1e4]],
        [0],
    ),
    "logaddexp2_written": (
        "log2(2**a + 2**b)",
        "a, b",
        lambda a, b: torch.maximum(a, b) + torch.log1p(torch.exp2(-(a - b).abs())) / LN2,  # no ties among the points
        [[1e4, -1e4, 3.0, 200.0, -200.0], [3.0, 2.0, 1e4, 199.0, 0.5]],
        [0, 1],
    ),
    "exp_ratio": (
        "(m**2 + exp(a)) / exp(b)",
        "m, a, b",
        lambda m, a, b: (m**2 + torch.exp(a)) / torch.exp(b),  # float64 holds exp(100)
        [[2.0, 0.5, -1.0, 1.5], [100.0, -120.0, 50.0, 0.0], [100.0, -80.0, 60.0, 0.0]],
        [0, 1, 2],
    ),
    "share_of_sum": (
        "x**2 / (x**2 + 4)",
        "x",
        lambda x: x**2 / (x**2 + 4),  # float64 holds x**2 at 1e20
        [[-3e19, -1e10, -2.0, -1e-20, 0.0, 0.5, 2.5, 1e4, 1e20]],
        [0],
    ),
    "asinh_written": (
        "log(x + sqrt(x**2 + 1))",
        "x",
        torch.asinh,
        [[-1e20, -1e4, -0.5, 0.0, 1e-8, 3.0, 1e4, 1e20]],
        [0],
    ),
    "erfcx_written": (
        "exp(x**2) * erfc(x)",
        "x",
        torch.special.erfcx,
        [[-3.0, -0.5, 0.0, 1.0, 30.0, 100.0, 1e4]],
        [0],
    ),
    "erfcx_word": ("erfcx(x)", "x", torch.special.erfcx, [[-3.0, 0.0, 30.0, 1e4]], [0]),
    "log_ndtr_written": (
        "log(0.5 * erfc(-x / sqrt(2)))",
        "x",
        torch.special.log_ndtr,
        [[-1e4, -100.0, -30.0, -1.0, 0.0, 2.0, 30.0]],
        [0],
    ),
    "log_ndtr_word": (
        "log_ndtr(x) - log_ndtr(-x)",
        "x",
        lambda x: torch.special.log_ndtr(x) - torch.special.log_ndtr(-x),
        [[-1e4, -30.0, 0.5, 100.0]],
        [0],
    ),
    "ndtri_written": (
        "sqrt(2) * erfinv(2*p - 1)",
        "p",
        torch.special.ndtri,
        [[1e-30, 1e-10, 0.01, 0.5, 0.75, 0.998046875]],
        [0],
    ),
    "kl_term": (
        "t * log(t / p)",
        "t, p",
        lambda t, p: torch.nn.functional.kl_div(torch.log(p), t, reduction="none"),
        [[0.0, 0.0, 0.25, 1.0], [0.5, 1e-3, 0.5, 0.9]],
        [1],
    ),
}


# Second derivatives are checked up to these sizes: past them the where's branch not taken (the formula
# as written, inf / inf there) is NaN under autograd of backward, which 0 * NaN does not mask.
# erfcx's second derivative, 2 erfcx + 2u (2u erfcx - 2/sqrt(pi)), cancels at large u as torch's own does.
# log_ndtr's, through erfcx's derivative, from |u| = 30 on.
FIRST_ORDER_ONLY = {
    "share_of_sum": 1e4,
    "erfcx_written": 100.0,
    "erfcx_word": 100.0,
    "log_ndtr_written": 2.0,
    "log_ndtr_word": 2.0,
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_generated_op_is_finite_where_the_written_formula_overflows(tmp_path, name):
    formula, names, reference, points, moving = OPS[name]
    inputs = "\n".join(f"  {n}: Tensor" for n in names.split(", "))
    text = f"name: {name}\ninputs:\n{inputs}\noutputs:\n  y: {formula}\n"
    op = getattr(build_ops(tmp_path, f"{name}_ops", {name: text}), name)
    for k in moving:
        got = _orders(op, points, k)
        expected = _reference(reference, points, k)
        for order, (g, e) in enumerate(zip(got, expected, strict=True)):
            if order == 2 and name in FIRST_ORDER_ONLY:
                keep = [j for j, v in enumerate(points[k]) if abs(v) <= FIRST_ORDER_ONLY[name]]
                g, e = g[keep], e[keep]
            e = e.float().double()  # a value past float32's range is inf in float32, as it should be
            where = f"{name}: derivative {order} in input {k}"
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, msg=lambda msg, where=where: f"{where}: {msg}")


def test_kl_term_gradient_in_t_is_finite_where_t_is_not_zero(tmp_path):
    text = "name: kl_t\ninputs:\n  t: Tensor\n  p: Tensor\noutputs:\n  y: t * log(t / p)\n"
    op = build_ops(tmp_path, "kl_t_ops", {"kl_t": text}).kl_t
    values = [[0.0, 1e-30, 0.25, 1.0], [0.5, 1e-3, 0.5, 0.9]]
    out, first, _ = _orders(op, values, 0)
    assert out[0] == 0.0  # the limit, where `0 * log(0)` is NaN as written
    t64, p64 = (torch.tensor(v, dtype=torch.float64) for v in values)
    torch.testing.assert_close(first[1:], (torch.log(t64 / p64) + 1)[1:], rtol=1e-5, atol=1e-5)


POW = "name: pow_learn\ninputs:\n  x: Tensor\n  p: Tensor\noutputs:\n  y: max(x, 0)**p\n"


def test_power_with_a_tensor_exponent_follows_torch_pow_at_a_zero_base(tmp_path):
    """`relu(x)**p` with a learnable p: p.grad is 0 from a zero base, as torch.pow gives (NaN as written,
    in float64 too), and its second derivative in p too."""
    op = build_ops(tmp_path, "pow_ops", {"pow_learn": POW}).pow_learn
    xs = [-1.0, 0.0, 0.0, 0.5, 3.0, 0.0]
    ps = [0.5, 1.5, 0.5, 2.5, 0.5, 3.0]
    value, first, second = _orders(op, [xs, ps], 1)
    expected = _reference(lambda u, q: torch.pow(torch.relu(u), q), [xs, ps], 1)
    torch.testing.assert_close(value, expected[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(first, expected[1], rtol=1e-5, atol=1e-6)
    positive = [k for k, u in enumerate(xs) if u > 0]  # torch.pow's own second derivative is NaN at a zero base
    torch.testing.assert_close(second[positive], expected[2][positive], rtol=1e-5, atol=1e-6)
    assert (second[[k for k, u in enumerate(xs) if u <= 0]] == 0).all()  # the limit: 0**p is 0 for p > 0
    # in x: `p relu(x)**(p - 1) (x > 0)` is inf * 0 at x <= 0 for p < 1 as written; selected, 0 (Note
    # [masked products] in opgen/optimize/rewrite.py), as torch.pow's and relu's backward give
    value, first, second = _orders(op, [xs, ps], 0)
    expected = _reference(lambda u, q: torch.pow(torch.relu(u), q), [xs, ps], 0)
    torch.testing.assert_close(first, expected[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(second, expected[2], rtol=1e-5, atol=1e-6)


def test_masked_slope_is_selected_not_multiplied():
    """`q * where(c, 1, 0)` is `where(c, q, 0)` with q's powers guarded; a plain input times a mask stays."""
    slope = rw.rewrite(sympy.diff(fn.maximum(x, 0, 0) ** y, x))
    assert isinstance(slope, fn.where) and not slope.has(sympy.Mul(fn.where(x > 0, 1, 0), y))
    assert _value(slope, {x: "-1", y: "0.5"}) == 0
    assert _close(_value(slope, {x: "2", y: "0.5"}), _value(sympy.Rational(1, 2) / sympy.sqrt(2), {}))
    assert rw.rewrite(y * fn.where(x > 0, 1, 0)) == y * fn.where(x > 0, 1, 0)


def _float32_function(source: str, **names):
    namespace = dict(names)
    exec(source, namespace)  # a test's own fixed text, not a spec's
    return digits.in_float32(namespace["f"])


def test_a_nan_of_the_form_is_not_blamed_on_float32():
    """`u**g * log(u)` at u = 0 is 0 * -inf at any precision: the warning says so (Note [whose NaN]); a log of
    an exponential that underflows in float32 alone is float32's."""
    form = _float32_function("def f(u, g):\n    return power(u, g) * log(u)\n", power=mpmath.power, log=mpmath.log)
    at_zero = [mpmath.mpf(0), mpmath.mpf(2)]
    assert digits.float32_value(form, at_zero) is not None
    assert isinstance(digits._in_float32(form, at_zero, digits.FLOAT64), str)  # float64's NaN too: not float32's
    underflow = _float32_function("def f(u):\n    return log(exp(-u))\n", exp=mpmath.exp, log=mpmath.log)
    assert digits.float32_value(underflow, [mpmath.mpf(200)]) == "is not a finite number in float32"
    assert not isinstance(digits._in_float32(underflow, [mpmath.mpf(200)], digits.FLOAT64), str)
    assert digits.float32_value(underflow, [mpmath.mpf(2)]) is None


CELU = (
    "name: celu_written\ninputs:\n  x: Tensor\n  alpha: float = 1.0\n"
    "outputs:\n  y: max(0, x) + min(0, alpha*(exp(x/alpha) - 1))\n"
)


@pytest.mark.parametrize("alpha", [1.0, 2.5, 0.5])
def test_branches_that_join_take_the_slope_where_they_agree(tmp_path, alpha):
    """CELU written with max and min has slope 1 at x = 0 (Note [branches that join] in
    opgen/optimize/rewrite.py), as F.celu, not the 0 of its two kinks' conventions."""
    op = build_ops(tmp_path, "celu_ops", {"celu_written": CELU}).celu_written
    points = [[-1e4, -100.0, -1.0, -1e-30, 0.0, 1e-30, 0.5, 100.0, 1e4]]
    got = _orders(lambda u: op(u, alpha), points, 0)
    expected = _reference(lambda u: torch.nn.functional.celu(u, alpha), points, 0)
    away = [k for k, v in enumerate(points[0]) if v != 0]  # the second derivative jumps at 0: F.celu's takes 0
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g[away], e[away], rtol=1e-5, atol=1e-6)
    assert got[0][4] == 0.0 and got[1][4] == 1.0


def test_branches_of_other_signs_keep_their_kinks():
    """`max(0, x) + min(0, x - 1)` is not one function of x's sign: left as written."""
    written = fn.maximum(0, x, 0) + fn.minimum(0, x - 1, 0)
    assert rw.rewrite(written) == written
    assert rw.rewrite(fn.maximum(0, x, 0) + fn.minimum(0, -x, 0)) == fn.maximum(0, x, 0) + fn.minimum(0, -x, 0)


KL_SOFTMAX = """\
name: kl_softmax
inputs:
  a: Tensor[N, C]
  m: Tensor[N, C]
let:
  p: softmax(a, dim=-1)
outputs:
  y: sum(p * log(p / m), dim=-1)
"""


def test_kl_of_softmax_probabilities_is_finite_where_one_underflows(tmp_path):
    """`p log(p / m)` is `xlogy(p, p / m)`: 0 where a softmax probability underflows to 0 in float32 (exp(-200)),
    where the formula as written is 0 * -inf; value and gradient against the log-space form in float64."""
    op = build_ops(tmp_path, "kl_softmax_ops", {"kl_softmax": KL_SOFTMAX}).kl_softmax
    a = torch.tensor([[0.0, -200.0, 1.0], [50.0, -50.0, 0.0], [1e4, -1e4, 0.0]], requires_grad=True)
    m = torch.tensor([[0.3, 0.5, 0.2], [0.1, 0.2, 0.7], [0.25, 0.25, 0.5]])
    y = op(a, m)
    (grad,) = torch.autograd.grad(y.sum(), a)
    a64 = a.detach().double().requires_grad_()
    log_p = torch.log_softmax(a64, -1)
    expected = (log_p.exp() * (log_p - m.double().log())).sum(-1)
    (expected_grad,) = torch.autograd.grad(expected.sum(), a64)
    torch.testing.assert_close(y.detach().double(), expected.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-5, atol=1e-6)
    naive = torch.softmax(a.detach(), -1)
    assert torch.isnan((naive * torch.log(naive / m)).sum(-1)).any()  # as written
