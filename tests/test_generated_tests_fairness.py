"""The generated tests fail only on a wrong op: a correct op a user writes from a paper passes them.

Each test here is a way the generated tests once failed a correct op: a condition used as a number
in the plain-torch reference, a NaN that one check accepted and another did not.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch
from conftest import ROOT, generated_tests, import_package, run_generated_tests

from opgen.cli import main

WINNER_SHARE = """\
name: winner_share
inputs:
  x: Tensor[N, D]
outputs:
  share: mean(x >= amax(x, dim=-1, keepdim=true), dim=0)
  scaled: x * sum(x > 0, dim=-1, keepdim=true)
"""


def test_a_condition_used_as_a_number_is_a_number_in_the_reference(tmp_path: Path):
    """`mean` and `sum` of a condition: torch.mean refuses a bool tensor, so the reference casts it."""
    tests = generated_tests(tmp_path, "winner_share", WINNER_SHARE)
    x = torch.tensor([[1.0, 3.0, 2.0], [4.0, 0.0, -1.0]], dtype=torch.float64, requires_grad=True)
    values = tests.reference(x)
    torch.testing.assert_close(values["share"], torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    torch.testing.assert_close(values["scaled"], x * torch.tensor([[3.0], [1.0]], dtype=torch.float64))
    run_generated_tests(tests)


def test_every_check_takes_the_same_nan_as_agreement():
    """vmap of an op that is NaN where a loop is NaN too passes, as the check of forward values does; a
    different value still fails."""
    import_package(ROOT, "generated")
    harness = importlib.import_module("generated.tests.harness")
    op = harness.OpUnderTest(torch.sqrt, ["x"], ["y"], tensor_inputs=[0], checked=[0], differentiable=[0])
    samples = [[(torch.linspace(-1.0, 1.0, 5, dtype=torch.float64) + k).requires_grad_()] for k in range(3)]
    harness.check_vmap(op, samples)
    harness.close(op(*samples[0])[0], torch.sqrt(samples[0][0]))  # the comparison every check goes through
    calls: list[int] = []

    def counting(x: torch.Tensor) -> torch.Tensor:  # one call under vmap, one per sample in the loop
        calls.append(0)
        return torch.sqrt(x) + len(calls)

    wrong = harness.OpUnderTest(counting, ["x"], ["y"], tensor_inputs=[0], checked=[0], differentiable=[0])
    with pytest.raises(AssertionError, match="vmap of y"):
        harness.check_vmap(wrong, samples)


# -- ops users write from papers, with the `tests: domain` kinds ------------------------------

PAPER_OPS = {
    "bce_as_written": """\
name: bce_as_written
inputs:
  p: Tensor
  y: Tensor
outputs:
  loss: -(y * log(p) + (1 - y) * log(1 - p))
tests:
  domain: {p: [0.01, 0.99], y: binary}
""",
    "dice": """\
name: dice
inputs:
  p: Tensor[N, D]
  mask: Tensor[N, D]
outputs:
  loss: 1 - (2 * sum(p * mask, dim=-1) + 1) / (sum(p, dim=-1) + sum(mask, dim=-1) + 1)
tests:
  domain: {p: [0, 1], mask: binary}
""",
    "poisson_nll": """\
name: poisson_nll
inputs:
  log_rate: Tensor
  counts: Tensor
outputs:
  nll: exp(log_rate) - counts * log_rate + lgamma(counts + 1)
tests:
  domain: {counts: {integer: [0, 20]}}
""",
    "gaussian_nll": """\
name: gaussian_nll
inputs:
  mu: Tensor
  y: Tensor
  var: Tensor
outputs:
  nll: 0.5 * (log(var) + (y - mu) ** 2 / var)
tests:
  domain: {var: positive}
""",
    "log_beta": """\
name: log_beta
inputs:
  a: Tensor
  b: Tensor
outputs:
  y: lgamma(a) + lgamma(b) - lgamma(a + b)
tests:
  domain: {a: positive, b: positive}
""",
    "kl_rows": """\
name: kl_rows
inputs:
  p: Tensor[N, D]
  q: Tensor[N, D]
outputs:
  kl: sum(p * log(p / q), dim=-1)
tests:
  domain: {p: probability, q: probability}
""",
    "quadratic_form": """\
name: quadratic_form
inputs:
  s: Tensor[N, N]
  v: Tensor[N, K]
outputs:
  q: sum(v * (s @ v), dim=0)
tests:
  domain: {s: spd}
""",
}


@pytest.mark.parametrize("name", sorted(PAPER_OPS))
def test_correct_ops_from_papers_pass_their_generated_tests(tmp_path: Path, name: str):
    tests = generated_tests(tmp_path, name, PAPER_OPS[name])
    assert "test_gradcheck" in run_generated_tests(tests)


def test_samples_keep_to_their_domain_kind(tmp_path: Path):
    """Masks are 0/1, counts whole numbers in their range, probability rows on the simplex, spd
    matrices symmetric with positive eigenvalues, positive inputs positive."""
    for name, checks in {
        "dice": lambda args: set(args[1].unique().tolist()) == {0.0, 1.0},
        "poisson_nll": lambda args: bool(
            (args[1] == args[1].round()).all() and args[1].min() >= 0 and args[1].max() <= 20
        ),
        "kl_rows": lambda args: (
            torch.allclose(args[0].sum(-1), torch.ones(args[0].shape[0], dtype=torch.float64))
            and bool((args[0] > 0).all())
        ),
        "quadratic_form": lambda args: (
            torch.equal(args[0], args[0].mT) and bool((torch.linalg.eigvalsh(args[0]) > 0).all())
        ),
        "gaussian_nll": lambda args: bool((args[2] > 0).all()),
    }.items():
        tests = generated_tests(tmp_path / name, name, PAPER_OPS[name])
        for seed in range(3):
            assert checks(tests.sample_inputs(seed=seed)), name


def test_a_discrete_input_is_left_out_of_gradcheck_but_checked_against_autograd(tmp_path: Path):
    tests = generated_tests(tmp_path, "dice", PAPER_OPS["dice"])
    assert tests.GRADCHECKED == [0]
    real = tests.OP.functional

    def scaled_mask_gradient(p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The op, with the gradient in `mask` doubled."""
        return real(p, mask) + (mask - mask.detach()).sum(-1)

    wrong = type(tests.OP)(**{**vars(tests.OP), "functional": scaled_mask_gradient})
    with pytest.raises(AssertionError, match="gradient of mask"):
        tests.harness.check_against_reference(wrong, tests.sample_inputs(), tests.reference)


def test_extremes_keep_inside_the_declared_domain(tmp_path: Path):
    """A target in [0, 1], a mask of 0/1, counts in [0, 20] and a positive variance are never tested
    outside; an input without a declared domain still is, at ±1e4."""
    bce = generated_tests(tmp_path / "a", "bce_as_written", PAPER_OPS["bce_as_written"])
    assert {point for name, point, *_ in bce.EXTREMES if name == "y"} == {0.0, 1.0}
    assert {round(point, 6) for name, point, *_ in bce.EXTREMES if name == "p"} == {0.01, 0.99}  # float32 edges
    poisson = generated_tests(tmp_path / "b", "poisson_nll", PAPER_OPS["poisson_nll"])
    counts = {point for name, point, *_ in poisson.EXTREMES if name == "counts"}
    assert counts and all(point == int(point) and 0 <= point <= 20 for point in counts)
    assert {-1e4, 30.0} <= {point for name, point, *_ in poisson.EXTREMES if name == "log_rate"}
    nll = generated_tests(tmp_path / "c", "gaussian_nll", PAPER_OPS["gaussian_nll"])
    variances = {point for name, point, *_ in nll.EXTREMES if name == "var"}
    assert 1e4 in variances and all(point > 0 for point in variances)


SAMPLED_HERE = """\
name: sampled_here
inputs:
  x: Tensor
  y: Tensor
outputs:
  out: softplus(x) * y
tests:
  domain: {x: {real: [-5, 5]}, y: [0.5, 2]}
"""


def test_a_real_domain_is_where_samples_are_drawn_and_extremes_go_everywhere(tmp_path: Path):
    """`{real: [low, high]}` draws samples from the interval but keeps the sweep at ±1e4 that a plain
    interval gives up; the generated tests pass on the op and fail when it is wrong past the interval."""
    tests = generated_tests(tmp_path, "sampled_here", SAMPLED_HERE)
    assert {-1e4, -100.0, 100.0, 1e4} <= {point for name, point, *_ in tests.EXTREMES if name == "x"}
    assert all(0.5 <= point <= 2 for name, point, *_ in tests.EXTREMES if name == "y")
    samples = [x for x, _ in (tests.sample_inputs() for _ in range(3))]
    assert all(-5 <= float(x.min()) and float(x.max()) <= 5 for x in samples)
    run_generated_tests(tests)
    real = tests.OP.functional
    clipped = type(tests.OP)(**{**vars(tests.OP), "functional": lambda x, y: real(x.clamp(-50, 50), y)})
    with pytest.raises(AssertionError, match="at x = 100.0"):
        tests.harness.check_extremes(clipped, tests.sample_inputs(), tests.EXTREMES, tests.PLACES, tests.reference)


def test_the_accuracy_tolerance_is_that_of_the_formula_as_written(tmp_path: Path):
    """A difference of lgammas at 1e4 loses 3e-3 in float32 as written, and so may the op; an op that
    loses more than twice that fails."""
    tests = generated_tests(tmp_path, "log_beta", PAPER_OPS["log_beta"])
    assert any(point == 1e4 for _, point, *_ in tests.EXTREMES)
    tests.test_float32_at_extreme_inputs()
    real = tests.OP.functional
    worse = type(tests.OP)(**{**vars(tests.OP), "functional": lambda a, b: real(a, b) * (1 + 1e-3)})
    with pytest.raises(AssertionError, match="output 0 at a = 10000.0"):
        tests.harness.check_extremes(worse, tests.sample_inputs(), tests.EXTREMES, tests.PLACES, tests.reference)


LOG1P_RATIO = """\
name: log1p_ratio
inputs:
  x: Tensor
outputs:
  y: log1p(x) / x
tests:
  domain: {x: positive}
"""


def test_an_op_computed_in_a_worse_form_than_written_fails_the_accuracy_test(tmp_path: Path):
    """`log(1 + x) / x` in float32 at x = 1e-6 misses by 5%, where the formula as written (`log1p`)
    keeps every digit: the written form's accuracy is no excuse for the op's."""
    tests = generated_tests(tmp_path, "log1p_ratio", LOG1P_RATIO)
    tests.test_float32_at_extreme_inputs()
    worse = type(tests.OP)(**{**vars(tests.OP), "functional": lambda x: torch.log(1 + x) / x})
    with pytest.raises(AssertionError, match="at x = 9.99999997"):
        tests.harness.check_extremes(worse, tests.sample_inputs(), tests.EXTREMES, tests.PLACES, tests.reference)


@pytest.mark.parametrize(
    ("domain", "message"),
    [
        ("{y: binry}", r"op.yaml:8:15: tests.domain.y: unknown domain kind 'binry'; did you mean 'binary'\?"),
        ("{x: spd}", r"op.yaml:8:15: tests.domain.x: spd matrices are square over the last two dimensions, but 'x'"),
        ("{y: {integer: [0.5, 3]}}", r"op.yaml:8:25: tests.domain.y: integer bounds must be whole numbers"),
        ("{y: {integer: 3}}", r"op.yaml:8:25: tests.domain.y must be \[low, high\], one of binary, integer"),
        ("{y: {real: [2, -2]}}", r"op.yaml:8:22: tests.domain.y: low \(2.0\) must be below high \(-2.0\)"),
        ("{y: {reel: [0, 1]}}", r"op.yaml:8:15: tests.domain.y must be \[low, high\], .*or \{real: \[low, high\]\}"),
        ("{y: [1, 1]}", r"op.yaml:8:15: tests.domain.y: low \(1.0\) must be below high \(1.0\)"),
    ],
)
def test_a_bad_domain_declaration_is_a_located_error(tmp_path: Path, capsys, domain: str, message: str):
    spec = tmp_path / "op.yaml"
    text = f"name: op\ninputs:\n  x: Tensor\n  y: Tensor\noutputs:\n  z: x * y\ntests:\n  domain: {domain}\n"
    spec.write_text(text)
    assert main(["generate", str(spec), "-o", str(tmp_path / "pkg")]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert "Traceback" not in err


FOCAL_AS_WRITTEN = """\
name: focal
inputs:
  logit: Tensor
  target: Tensor
  gamma: float = 2.0
let:
  p: sigmoid(logit)
  pt: target * p + (1 - target) * (1 - p)
outputs:
  loss: -(1 - pt) ** gamma * log(pt)
tests:
  domain: {target: binary}
"""


def test_a_test_bound_to_fail_is_told_at_generate_time_without_blaming_float32_for_float64s_nan(tmp_path, capsys):
    """Focal loss as written is log(0) at logit = -1e4 in float64 as in float32: the warning says so, with
    the ways out; `log(1 + exp(x) + exp(-x))` at ±100 overflows float32 alone, and is told so."""
    spec = tmp_path / "focal.yaml"
    spec.write_text(FOCAL_AS_WRITTEN)
    assert main(["generate", str(spec), "-o", str(tmp_path / "pkg")]) == 0
    err = capsys.readouterr().err
    assert f"{spec}:10:9: warning: `loss` is not a finite number in float32 nor in float64 as written" in err, err
    assert "at logit = -10000" in err and "the test leaves such rows out" in err and "tests: domain: {logit:" in err
    import_package(tmp_path, "pkg")
    tests = importlib.import_module("pkg.tests.test_focal")  # the row left out, the others kept: passes
    at = {place for n, p, *_, place in tests.EXTREMES if n == "logit" and p == -1e4}
    assert at < set(tests.PLACES), at  # where the target makes log(pt) = log(0)
    assert {-100.0, 100.0, 1e4} <= {p for n, p, *_ in tests.EXTREMES if n == "logit"}
    run_generated_tests(tests)
    cosh = tmp_path / "cosh.yaml"
    text = "name: lcosh\ninputs:\n  x: Tensor\noutputs:\n  y: log(1 + exp(x) + exp(-x))\n"
    cosh.write_text(text + "tests:\n  domain: {x: [-100, 100]}\n")
    assert main(["generate", str(cosh), "-o", str(tmp_path / "pkg2")]) == 0
    err = capsys.readouterr().err
    assert f"{cosh}:5:6: warning: `y` overflows float32 inside the formula, where" in err, err
    assert "float64" not in err


CANCELLING = """\
name: half_root_sum
inputs:
  x: Tensor
outputs:
  y: (x + sqrt(x * x + 1)) / 2
"""


def test_a_formula_as_written_that_keeps_no_digit_is_no_excuse_for_the_op(tmp_path: Path):
    """`(x + sqrt(x * x + 1)) / 2` at x = -1e4 is 0 in float32 as written, for an exact 5e-5: an op
    computing it so fails the accuracy test however inaccurate the written form is."""
    tests = generated_tests(tmp_path, "half_root_sum", CANCELLING)
    written = type(tests.OP)(**{**vars(tests.OP), "functional": lambda x: (x + torch.sqrt(x * x + 1)) / 2})
    with pytest.raises(AssertionError, match="output 0 at x = -10000.0"):
        tests.harness.check_extremes(written, tests.sample_inputs(), tests.EXTREMES, tests.PLACES, tests.reference)


def test_every_domain_kind_prints_back_as_written():
    from test_spec_yaml import assert_round_trip

    for text in PAPER_OPS.values():
        assert_round_trip(text)
