"""Generated op code a reviewer accepts: `ruff format` and `ruff check` leave it as it is, and
the printer writes Python's own precedence (a fraction as exponent, a negated power).

Values are checked against plain torch autograd of the same formula, in float64.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sympy
import torch
from conftest import GENERATED, ROOT, generate_op, import_package

from opgen.printer import TorchPrinter


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
