"""Generate-time warnings for generated tests bound to fail: a test domain that leaves the
formula's domain, or values past float32 inside it (opgen/plan/domain.py).

Each warning's claim is checked against PyTorch itself: the float32 op of the same formula at
the point the warning names is not finite there; and where no warning is given, the generated
tests pass.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT

WARNING = re.compile(r"^(?P<loc>[^\n]*?:\d+:\d+): warning: (?P<text>.*)$", re.M)


def spec(formula: str, tests: str = "", inputs: str = "{x: Tensor}") -> str:
    return f"name: op\ninputs: {inputs}\noutputs:\n  y: {formula}\n" + (f"tests:\n{tests}" if tests else "")


def generate(run_cli, folder: Path, text: str, *extra: str) -> tuple[int, list[re.Match[str]]]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "op.yaml").write_text(text, encoding="utf-8")
    status, _, err = run_cli("generate", str(folder / "op.yaml"), "-o", str(folder / "out"), *extra)
    return status, list(WARNING.finditer(err))


def _point(text: str) -> float:
    found = re.search(r" at x = (\S+), inside", text)
    assert found, text
    return float(found[1])


@pytest.mark.parametrize(
    ("formula", "torch_formula"),
    [
        ("log(x) * 2", lambda x: torch.log(x) * 2),
        ("sqrt(x - 1)", lambda x: torch.sqrt(x - 1)),
        ("acos(x / 2)", lambda x: torch.acos(x / 2)),
        ("exp(40 * x)", lambda x: torch.exp(40 * x)),
        ("1 / (x - 0.5)**0.5", lambda x: 1 / (x - 0.5) ** 0.5),
    ],
)
def test_a_formula_undefined_or_too_large_in_the_default_domain_is_warned_of(run_cli, tmp_path, formula, torch_formula):
    status, warnings = generate(run_cli, tmp_path, spec(formula))
    assert status == 0 and (tmp_path / "out" / "ops" / "op.py").is_file(), "a warning, not an error"
    assert len(warnings) == 1, warnings
    warning = warnings[0]
    assert warning["loc"] == f"{tmp_path / 'op.yaml'}:4:6", "located at the output's formula"
    assert "tests: domain: {x: [LOW, HIGH]}" in warning["text"] and "[-3, 3], the default" in warning["text"]
    value = torch_formula(torch.tensor(_point(warning["text"]), dtype=torch.float32))
    assert not torch.isfinite(value), f"PyTorch finds {formula} finite at the point warned of: {value}"


@pytest.mark.parametrize(
    ("formula", "tests"),
    [
        ("log(x) * 2", "  domain: {x: [0.1, 3]}\n"),
        ("where(x > 0, log(x), 0 * x)", ""),  # a guarded branch is never taken where undefined
        ("exp(40 * x)", "  domain: {x: [-2, 2]}\n"),
        ("sqrt(x**2 + 1)", ""),
    ],
)
def test_a_formula_defined_over_its_test_domain_gets_no_warning_and_its_tests_pass(run_cli, tmp_path, formula, tests):
    status, warnings = generate(run_cli, tmp_path, spec(formula, tests))
    assert status == 0 and warnings == []
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(out / "tests")],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:]


def test_a_domain_set_by_the_spec_is_named_as_the_specs(run_cli, tmp_path):
    _, warnings = generate(run_cli, tmp_path, spec("log(x)", "  domain: {x: [-1, 2]}\n"))
    assert len(warnings) == 1 and "([-1, 2])" in warnings[0]["text"]
    assert -1 <= _point(warnings[0]["text"]) < 0


def test_each_moving_input_is_named(run_cli, tmp_path):
    text = spec("log(a) + sqrt(b)", "  domain: {a: [0.5, 2]}\n", inputs="{a: Tensor, b: Tensor}")
    _, warnings = generate(run_cli, tmp_path, text)
    assert [("test domain of `b`" in w["text"]) for w in warnings] == [True]


def test_a_points_row_outside_the_domain_is_warned_of(run_cli, tmp_path):
    text = spec("log(x)", "  domain: {x: [0.5, 2]}\n  points: {x: [1.0, -1.0]}\n")
    _, warnings = generate(run_cli, tmp_path, text)
    assert len(warnings) == 1 and "`tests: points` row x = -1" in warnings[0]["text"]
    assert torch.isnan(torch.log(torch.tensor(-1.0)))  # what the generated test would meet there


def test_the_library_specs_give_no_warning(golden):
    assert golden.warnings == []


def test_warnings_come_again_from_the_cache(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path / "cache"))
    first = generate(run_cli, tmp_path, spec("log(x)"))[1]
    second = generate(run_cli, tmp_path, spec("log(x)"))[1]
    assert [w[0] for w in first] == [w[0] for w in second] and len(first) == 1
    assert any((tmp_path / "cache").rglob("*.json")), "the second run was served from the cache"


def test_extremes_false_leaves_out_the_float32_extremes_test(run_cli, tmp_path):
    generate(run_cli, tmp_path / "on", spec("log(cosh(x))"))
    generate(run_cli, tmp_path / "off", spec("log(cosh(x))", "  extremes: false\n"))
    with_rows = (tmp_path / "on" / "out" / "tests" / "test_op.py").read_text()
    without = (tmp_path / "off" / "out" / "tests" / "test_op.py").read_text()
    assert "def test_float32_at_extreme_inputs" in with_rows
    assert "def test_float32_at_extreme_inputs" not in without and "EXTREMES" not in without
    assert "def test_gradcheck" in without, "only the extremes test is left out"


def test_extremes_takes_true_or_false_only(run_cli, tmp_path):
    status, _ = generate(run_cli, tmp_path, spec("x * 2", "  extremes: 3\n"))
    assert status == 2
    (tmp_path / "op.yaml").write_text(spec("x * 2", "  extremes: 3\n"))
    _, _, err = run_cli("generate", str(tmp_path / "op.yaml"), "-o", str(tmp_path / "out"))
    assert f"{tmp_path / 'op.yaml'}:6:13: tests.extremes must be true or false" in err
