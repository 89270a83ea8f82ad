"""Generate-time warnings for outputs that keep no float32 digit inside the test domain, as written
and as opgen computes them (Note [float32 digits] in opgen/plan/digits.py).

Each claim is checked against PyTorch itself in float32, with float64 as the reference: where a
warning names a point, the formula as written in float32 has not one correct digit there (or is
not finite); where a formula as written loses its digits but opgen computes it by a stable form,
there is no warning, and the generated op keeps the digits. The library's specs give no warning
at all (tests/test_domain_warnings.py, `test_the_library_specs_give_no_warning`).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mpmath
import pytest
import torch
from conftest import import_package

Formula = Callable[[Any, Any], Any]  # (torch or mpmath, x) -> the formula's value
WARNING = re.compile(r"^(?P<loc>[^\n]*?:\d+:\d+): warning: (?P<text>.*)$", re.M)
GRID = 9  # opgen.plan.domain.GRID: the points checked


def spec(formula: str, domain: str = "") -> str:
    text = f"name: op\ninputs: {{x: Tensor}}\noutputs:\n  y: {formula}\n"
    return text + (f"tests:\n  domain: {{x: [{domain}]}}\n" if domain else "")


def generate(run_cli, folder: Path, text: str) -> list[re.Match[str]]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "op.yaml").write_text(text, encoding="utf-8")
    status, _, err = run_cli("generate", str(folder / "op.yaml"), "-o", str(folder / "out"), "--no-cache")
    assert status == 0 and (folder / "out" / "ops" / "op.py").is_file(), "a warning, not an error"
    return list(WARNING.finditer(err))


def exact(formula: Formula, x: torch.Tensor) -> torch.Tensor:
    """`formula` at each float32 `x`, at 50 significant digits (mpmath), rounded to float64."""
    with mpmath.workdps(50):
        return torch.tensor([float(formula(mpmath, mpmath.mpf(float(v)))) for v in x], dtype=torch.float64)


def relative_error(single: torch.Tensor, formula: Formula, x: torch.Tensor) -> torch.Tensor:
    """Of `single` (float32 values at `x`) against `formula`'s exact values (inf where not finite)."""
    reference = exact(formula, x)
    error = (single.double() - reference).abs() / reference.abs()
    return torch.where(torch.isfinite(single), error, torch.inf)


def grid(low: float, high: float) -> torch.Tensor:
    return torch.tensor([low + (high - low) * (j + 0.5) / GRID for j in range(GRID)], dtype=torch.float32)


@pytest.mark.parametrize(
    ("formula", "domain", "same"),
    [
        ("cosh(10*x) - sinh(10*x)", "", lambda m, x: m.cosh(10 * x) - m.sinh(10 * x)),
        ("1 - tanh(x)", "0, 20", lambda m, x: 1 - m.tanh(x)),
        ("sinh(50*x) / (cosh(50*x) + 1)", "", lambda m, x: m.sinh(50 * x) / (m.cosh(50 * x) + 1)),  # overflow
        # (`exp(60*x) / (exp(60*x) + 2)` has one now: Note [shares of a sum] in opgen/optimize/rewrite.py)
        (
            "exp(60*x) / (exp(60*x) + exp(30*x) + 2)",
            "",
            lambda m, x: m.exp(60 * x) / (m.exp(60 * x) + m.exp(30 * x) + 2),
        ),
    ],
)
def test_a_formula_with_no_stable_form_that_keeps_no_digit_is_warned_of(run_cli, tmp_path, formula, domain, same):
    found = generate(run_cli, tmp_path, spec(formula, domain))
    warnings = [w for w in found if "inside the test domain" in w["text"]]  # not those of the extreme rows
    assert len(warnings) == 1, warnings
    warning = warnings[0]
    assert warning["loc"] == f"{tmp_path / 'op.yaml'}:4:6", "located at the output's formula"
    assert "opgen knows no exact form" in warning["text"]
    point = float(re.search(r" at x = (\S+), inside", warning["text"])[1])  # type: ignore[index]
    x = torch.tensor([point])
    error = relative_error(same(torch, x), same, x)
    assert error.item() > 0.1, f"PyTorch's float32 keeps a digit of {formula} at x = {point}: {error.item()}"


@pytest.mark.parametrize(
    ("formula", "domain", "same"),
    [
        ("log(1 + exp(x))", "-30, 30", lambda m, x: m.log(1 + m.exp(x))),  # softplus
        ("log(1 + exp(40*x)) / 40", "-1, 1", lambda m, x: m.log(1 + m.exp(40 * x)) / 40),  # a native kernel
        ("sqrt(x**2 + 1) - x", "0, 10000", lambda m, x: m.sqrt(x**2 + 1) - x),  # the conjugate form
        ("log(1/(1 + exp(-x)))", "-30, 30", lambda m, x: m.log(1 / (1 + m.exp(-x)))),  # logsigmoid
        ("exp(x) - 1", "-1e-8, 1e-8", lambda m, x: m.exp(x) - 1),  # expm1
        ("log(cosh(x))", "-1e-4, 1e-4", lambda m, x: m.log(m.cosh(x))),  # logcosh
        ("log(1 - exp(-x))", "10, 30", lambda m, x: m.log(1 - m.exp(-x))),  # log1mexp
        ("(1 + x**2)**1e-6 - 1", "1e-3, 1", lambda m, x: (1 + x**2) ** 1e-6 - 1),  # expm1(a log1p(u))
    ],
)
def test_a_formula_that_keeps_no_digit_as_written_but_opgen_computes_stably_is_not_warned_of(
    run_cli, tmp_path, formula, domain, same
):
    low, high = (float(v) for v in domain.split(","))
    points = grid(low, high)
    lost = relative_error(same(torch, points), same, points) > 0.1
    assert lost.any(), f"{formula} keeps its digits as written: the case shows nothing"
    assert generate(run_cli, tmp_path, spec(formula, domain)) == []
    package = import_package(tmp_path, "out")
    kept = relative_error(package.op(points[lost]), same, points[lost])
    assert (kept < 1e-5).all(), f"the generated op keeps the digits: {kept}"


def test_a_formula_that_overflows_at_the_extreme_rows_is_warned_of(run_cli, tmp_path):
    """`log(1 + exp(x) + exp(-x))` is fine inside the default [-3, 3] but overflows float32 at |x| = 100 and 1e4,
    where its exact value (about |x|) is finite: no form of it opgen knows passes the generated float32
    test at extreme inputs there, and generating says so, located, once per output and input (its slope,
    inf / inf there, gets a warning of its own: tests/test_slope_warnings.py). Those rows leave the test
    (Note [rows no form can pass]), the finite ones stay: the generated tests pass on the op, and fail
    on one that is wrong where the formula is finite."""
    found = generate(run_cli, tmp_path, spec("log(1 + exp(x) + exp(-x))"))  # no domain declared: swept everywhere
    warnings = [w for w in found if not w["text"].startswith("the gradient of")]
    assert len(warnings) == 1 and len(found) == 2, found
    assert warnings[0]["loc"] == f"{tmp_path / 'op.yaml'}:4:6"
    assert "a row of the generated float32 test at extreme inputs" in warnings[0]["text"]
    assert "the test leaves such rows out" in warnings[0]["text"]
    point = float(re.search(r" at x = (\S+), a row", warnings[0]["text"])[1])  # type: ignore[index]
    package = import_package(tmp_path, "out")
    x = torch.tensor([point])
    exact = torch.logaddexp(torch.logaddexp(x.double(), -x.double()), torch.zeros(1, dtype=torch.float64))
    assert torch.isfinite(exact).all() and not torch.isfinite(package.op(x)).all()
    tests = importlib.import_module("out.tests.test_op")
    swept = {p for _, p, *_ in tests.EXTREMES}
    assert point not in swept and {0.0, 30.0, -30.0} <= swept
    tests.test_float32_at_extreme_inputs()
    real = tests.OP.functional
    wrong = type(tests.OP)(**{**vars(tests.OP), "functional": lambda x: real(x) * (1 + 1e-3 * (x.abs() > 10))})
    with pytest.raises(AssertionError, match="at x = "):
        tests.harness.check_extremes(wrong, tests.sample_inputs(), tests.EXTREMES, tests.PLACES, tests.reference)


def test_a_formula_finite_at_the_extreme_rows_is_not_warned_of(run_cli, tmp_path):
    """The same overflow written through `logaddexp`'s own rewrite (log(exp(a) + exp(b))) is finite there."""
    assert generate(run_cli, tmp_path, spec("log(exp(x) + exp(-x))")) == []


@pytest.mark.parametrize("formula", ["exp(-exp(-x))", "x * tanh(exp(x))", "1 / (1 + exp(exp(x)))"])
def test_an_overflow_that_float32_takes_back_is_not_warned_of(run_cli, tmp_path, formula):
    """`exp(-exp(-x))` (the Gumbel CDF) at x = -100: exp(100) is inf in float32, and exp(-inf) = 0 the exact
    value, as tanh(inf) = 1 in TanhExp; the op is finite and right at the extreme rows, so no warning."""
    assert generate(run_cli, tmp_path, spec(formula)) == []
    package = import_package(tmp_path, "out")
    x = torch.tensor([-1e4, -100.0, 100.0, 1e4], requires_grad=True)
    y = package.op(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert torch.isfinite(y).all() and torch.isfinite(grad).all()


def test_a_function_zero_where_the_rounded_constants_are_not_is_not_warned_of(run_cli, tmp_path):
    """Note [constants both ways]: `sqrt(x**2 + eps**2) - eps` is 0 at x = 0, where the exact rows, with
    `eps**2` and `eps` each rounded to float32, make it -4.9e-11; opgen's conjugate form gives 0."""
    text = "name: op\ninputs:\n  x: Tensor\n  eps: float = 1e-3\noutputs:\n  y: sqrt(x**2 + eps**2) - eps\n"
    assert generate(run_cli, tmp_path, text) == []
