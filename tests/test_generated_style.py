"""Generated op code a reviewer accepts: `ruff format` and `ruff check` leave it as it is, and
the printer writes Python's own precedence (a fraction as exponent, a negated power).

Values are checked against plain torch autograd of the same formula, in float64.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sympy
import torch
from conftest import GENERATED, ROOT, generate_op, import_package

from opgen.emit.printer import TorchPrinter


def _ruff() -> list[str]:
    beside = Path(sys.executable).parent / "ruff"
    found = str(beside) if beside.is_file() else shutil.which("ruff")
    assert found, "ruff is missing: install opgen's dev extras (pip install -e .[dev])"
    return [found]


def _op_files(folder: Path) -> list[str]:
    return [str(folder / "__init__.py"), *sorted(str(p) for p in (folder / "ops").glob("*.py"))]


def test_generated_ops_are_ruff_formatted_and_clean():
    """With the project's configuration (line length 120): nothing to reformat, nothing to report."""
    files = _op_files(GENERATED)
    config = ["--config", str(ROOT / "pyproject.toml")]
    formatted = subprocess.run([*_ruff(), "format", *config, "--check", "--diff", *files], capture_output=True)
    assert formatted.returncode == 0, formatted.stdout.decode()[-3000:]
    checked = subprocess.run([*_ruff(), "check", *config, "--no-cache", *files], capture_output=True)
    assert checked.returncode == 0, checked.stdout.decode()[-3000:]


@pytest.mark.parametrize(
    "formula, reference",
    [
        ("(x*x + 1)**(1/3) + x**2.5", lambda x: (x * x + 1) ** (1 / 3) + x**2.5),
        ("(1 + x**2)**(-2/3) - x**2", lambda x: (1 + x**2) ** (-2 / 3) - x**2),
        ("-x**2 - (x + 1)**3", lambda x: -(x**2) - (x + 1) ** 3),
    ],
)
def test_powers_print_with_pythons_precedence(tmp_path, formula, reference):
    """`x**(1/3)` once printed as `x**1/3`, which Python reads as `(x**1)/3`."""
    package = tmp_path / "power_ops"  # one package per case: a fresh import
    (package / "ops").mkdir(parents=True)
    (package / "__init__.py").write_text("from . import ops\n")
    (package / "ops" / "__init__.py").write_text("from . import op\n")
    (package / "ops" / "op.py").write_text(
        generate_op(tmp_path, f"name: op\ninputs:\n  x: Tensor\noutputs:\n  y: {formula}\n")
    )
    op = import_package(tmp_path, "power_ops").ops.op.op
    x = torch.linspace(0.1, 3, 17, dtype=torch.float64, requires_grad=True)
    expected = reference(x)
    got = op(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(expected.sum(), x)[0])


def test_printer_spaces_as_ruff_formats():
    x, y = sympy.symbols("x y", real=True)
    printer = TorchPrinter({x: "x", y: "y"}, frozenset({x, y}))
    assert printer.doprint_expr(x * y / (x + y)) == "x * y / (x + y)"
    assert printer.doprint_expr(-(x**2)) == "-(x**2)"
    assert printer.doprint_expr((x + y) ** 2) == "(x + y) ** 2"
    assert printer.doprint_expr(sympy.exp(x) ** 3) == "torch.exp(3 * x)"
    assert printer.doprint_expr(sympy.sin(x) ** 3) == "torch.sin(x) ** 3"


def _op(tmp_path, name: str, text: str):
    """The source of the op `text` specifies, and the op, from a package generated at `tmp_path/name`."""
    from opgen.emit.render import Renderer
    from opgen.pipeline import build

    (tmp_path / "op.yaml").write_text(text)
    result = build([str(tmp_path / "op.yaml")], Renderer())
    assert not result.problems, result.problems.report()
    for path, content in result.files.items():
        (tmp_path / name / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name / path).write_text(content)
    return result.files["ops/op.py"], import_package(tmp_path, name).op


@pytest.mark.parametrize(
    "formula, reference",
    [
        ("(x + b) * sigmoid(x + b)", lambda x, b: torch.nn.functional.silu(x + b)),
        ("0.5 * (x + b) * (1 + erf((x + b) / sqrt(2)))", lambda x, b: torch.nn.functional.gelu(x + b)),
        (
            "x * tanh(softplus(x + b)) + (x + b)**2",
            lambda x, b: x * torch.tanh(torch.nn.functional.softplus(x + b)) + (x + b) ** 2,
        ),
    ],
)
def test_kernel_arguments_and_derivatives_are_computed_once(tmp_path, formula, reference):
    """A kernel's derivative shared by two gradients goes through the plan's CSE: `b + x` once."""
    source, op = _op(tmp_path, "shared_ops", f"name: op\ninputs:\n  x: Tensor\n  b: Tensor\noutputs:\n  y: {formula}\n")
    backward = source.split("def backward")[1].split("\n\n\n")[0]
    assert len(re.findall(r"(?<!\* )\bb \+ x\b", backward)) == 1, backward  # not `2 * b + x * ...`
    assert backward.count("softplus(") <= 1, backward
    assert backward.count("torch.sigmoid(") <= 1 and backward.count("torch.erf(") <= 1, backward
    x = torch.linspace(-3, 3, 13, dtype=torch.float64, requires_grad=True)
    b = torch.linspace(-1, 2, 13, dtype=torch.float64, requires_grad=True)
    got, want = torch.autograd.grad(op(x, b).sum(), (x, b)), torch.autograd.grad(reference(x, b).sum(), (x, b))
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    "formula, call", [("x * sigmoid(x)", "torch.sigmoid(x)"), ("x * tanh(softplus(x))", "torch.tanh(")]
)
def test_double_backward_branch_computes_each_call_once(tmp_path, formula, call):
    source, op = _op(tmp_path, "recorded_ops", f"name: op\ninputs:\n  x: Tensor\noutputs:\n  y: {formula}\n")
    recorded = re.split(r"\):[^\n]*\n", source.split("torch.is_grad_enabled(")[1], maxsplit=1)[1].split("else:")[0]
    assert recorded.count(call) == 1, recorded
    x = torch.linspace(-4, 4, 17, dtype=torch.float64, requires_grad=True)
    native = torch.nn.functional.silu if "sigmoid" in formula else torch.nn.functional.mish
    (got,) = torch.autograd.grad(op(x).sum(), x, create_graph=True)
    (want,) = torch.autograd.grad(native(x).sum(), x, create_graph=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0])


def test_docstrings_show_decimals_as_written_and_kernels_as_formulas():
    source = (GENERATED / "ops" / "gelu_tanh.py").read_text(encoding="utf-8")
    doc = source.split("def gelu_tanh")[1]
    assert "0.044715*x**3" in doc and "8943" not in doc and "_Prime" not in doc
    assert "0.134145*x**2" in doc  # the derivative's 3 * 0.044715


def test_no_grad_is_a_printer_setting():
    """Forward's in-place forms come from the printer's `no_grad` setting, not a patched copy."""
    from opgen.optimize import kernels

    x = sympy.Symbol("x", real=True)
    plain = TorchPrinter({x: "x"}, frozenset({x}))
    in_place = TorchPrinter({x: "x"}, frozenset({x}), settings={"no_grad": True})
    assert plain.doprint_expr(kernels.mish(x)) == "torch.nn.functional.mish(x)"
    assert ".mul_(" in in_place.doprint_expr(kernels.mish(x))
    assert "no_grad" in TorchPrinter._default_settings
