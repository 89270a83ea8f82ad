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


def _ruff_clean(paths: list[Path]) -> None:
    """`ruff format --check` and `ruff check` with the project's configuration (line length 120) pass."""
    config = ["--config", str(ROOT / "pyproject.toml")]
    files = [str(p) for p in paths]
    formatted = subprocess.run([*_ruff(), "format", *config, "--check", "--diff", *files], capture_output=True)
    assert formatted.returncode == 0, formatted.stdout.decode()[-4000:]
    checked = subprocess.run([*_ruff(), "check", *config, "--no-cache", *files], capture_output=True)
    assert checked.returncode == 0, checked.stdout.decode()[-4000:]


def test_generated_package_is_ruff_formatted_and_clean():
    """Every generated file, the tests and shape checks included: nothing to reformat, nothing to report."""
    files = sorted(GENERATED.rglob("*.py"))
    assert len(files) > 70 and any(f.parent.name == "tests" for f in files)
    _ruff_clean(files)


# Specs a user might write that ours do not: long names and formulas, many inputs, constants far
# from 1 and exact constants (`pi`, roots), optional inputs, a gradient override, a module.
UNUSUAL_SPECS = {
    "long_formula": """\
name: long_formula
inputs:
  first_input_tensor: Tensor
  second_input_tensor: Tensor
  alpha_coefficient: float = 0.7
outputs:
  result_output: first_input_tensor * tanh(softplus(second_input_tensor * alpha_coefficient)) + (first_input_tensor
    - second_input_tensor)**2 * sigmoid(first_input_tensor * second_input_tensor + 0.044715 * first_input_tensor**3)
    - log1p(exp(-abs(first_input_tensor + second_input_tensor))) / (1 + first_input_tensor**2 + second_input_tensor**2)
  clipped_output_with_a_long_name: max(min(first_input_tensor * second_input_tensor, alpha_coefficient * 1.5e+3),
    -alpha_coefficient * 2.5E+3) + where(first_input_tensor > second_input_tensor, first_input_tensor,
    second_input_tensor)
""",
    "constants": """\
name: constants
inputs:
  x: Tensor
outputs:
  y: 1.2e16 * x + 1e-20 * x**2 + 3.0e-7 * sin(pi * x) + 2.5E+3 * exp(-x**2 / (2 * pi)) + sqrt(2 / pi) * x
    - (pi * x)**2 / 3 + sqrt(3) / pi * x**3
tests:
  domain: {x: [-1, 1]}
  gradgrad: false  # finite differences of 1.2e16 * x cannot resolve the second derivative
""",
    "many_inputs": """\
name: many_inputs
inputs:
  input_number_one: Tensor
  input_number_two: Tensor
  input_number_three: Tensor
  input_number_four: Tensor
  input_number_five: Tensor
  input_number_six: Tensor
  scale_parameter_one: float = 1.5
  scale_parameter_two: float = 2.5
outputs:
  output_value: input_number_one * input_number_two + input_number_three * scale_parameter_one + input_number_four
    * input_number_five * input_number_six * scale_parameter_two
module:
  name: ManyInputsModule
  args:
    scale_parameter_one: float = 1.5
    scale_parameter_two: float = 2.5
  parameters:
    input_number_six: {shape: [4], init: normal(0, 1)}
""",
    "optional_many": """\
name: optional_many
inputs:
  a_rather_long_input_name: Tensor
  another_rather_long_input_name: Tensor?
  yet_another_long_input_name: Tensor?
outputs:
  first_output_with_long_name: a_rather_long_input_name * another_rather_long_input_name + yet_another_long_input_name
    + a_rather_long_input_name
  second_output_with_long_name: a_rather_long_input_name**2 + yet_another_long_input_name * 1.0e-12
gradients:
  a_rather_long_input_name: grad_first_output_with_long_name * a_rather_long_input_name + 2
    * a_rather_long_input_name * grad_second_output_with_long_name
""",
    # Inputs so long that the functional's target tuple alone fills a line.
    "wide": """\
name: wide
inputs:
  the_first_input_with_a_very_long_name_indeed: Tensor
  the_second_input_with_a_very_long_name_indeed: Tensor
  the_third_input_with_a_very_long_name_indeed: Tensor?
outputs:
  y: the_first_input_with_a_very_long_name_indeed * the_second_input_with_a_very_long_name_indeed
    + the_third_input_with_a_very_long_name_indeed
""",
    # Names of the package's runtime taken by the spec: the op module imports them under other names.
    "capture": """\
name: capture
inputs:
  Function: Tensor
  check_floating: Tensor
  promoted: float = 2.0
let:
  not_scriptable: Function * check_floating
outputs:
  y: sin(not_scriptable) * promoted
""",
}


@pytest.fixture(scope="module")
def unusual_package(tmp_path_factory):
    from opgen.emit.render import Renderer
    from opgen.pipeline import build

    folder = tmp_path_factory.mktemp("unusual")
    for name, text in UNUSUAL_SPECS.items():
        (folder / f"{name}.yaml").write_text(text)
    result = build([str(folder / f"{name}.yaml") for name in UNUSUAL_SPECS], Renderer())
    assert not result.problems, result.problems.report()
    for path, content in result.files.items():
        (folder / "unusual_ops" / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / "unusual_ops" / path).write_text(content)
    return folder / "unusual_ops"


def test_tests_generated_from_unusual_specs_are_ruff_clean(unusual_package):
    """Long reference formulas, signatures, shape tables and native calls are laid out as ruff would."""
    ops = [unusual_package / "ops" / f"{name}.py" for name in ("constants", "capture")]
    _ruff_clean(sorted((unusual_package / "tests").glob("*.py")) + ops)


def test_runtime_calls_of_long_names_are_laid_out_as_ruff_does(unusual_package):
    """The functional's calls of the runtime (capture, argument checks, promotion) with long argument
    names: ruff would change none of their lines."""
    config = ["--config", str(ROOT / "pyproject.toml")]
    for name in UNUSUAL_SPECS:
        path = unusual_package / "ops" / f"{name}.py"
        diff = subprocess.run([*_ruff(), "format", *config, "--diff", str(path)], capture_output=True).stdout.decode()
        changed = [line for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
        runtime = ("capture(", "check_floating(", "promoted(", "not_scriptable", "proxy", ".apply(", "function")
        assert not [line for line in changed if any(word in line for word in runtime)], diff


def test_tests_generated_from_unusual_specs_pass(unusual_package):
    """The laid-out tests (temporaries, wrapped calls) still test the op, and pass."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings", str(unusual_package)],
        capture_output=True,
        cwd=unusual_package.parent,
    )
    assert done.returncode == 0, done.stdout.decode()[-4000:]


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
    (package / "_runtime.py").write_text((ROOT / "opgen" / "runtime" / "machinery.py").read_text())
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
    backward = source.split("def backward")[1].split("def jvp")[0]
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
    if "may_work_in_place(" in source:  # the unrecorded branch works in place; the recorded one follows `else:`
        recorded = source.split("may_work_in_place(")[1].split("else:\n")[1].split("return")[0]
    else:
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
    assert "0.044715*x**3" in doc and "8943" not in doc and "Prime" not in doc
    assert "0.134145*x**2" in doc  # the derivative's 3 * 0.044715


def test_no_grad_is_a_printer_setting():
    """Forward's in-place forms come from the printer's `no_grad` setting, not a patched copy."""
    from opgen.nodes import activations

    x = sympy.Symbol("x", real=True)
    plain = TorchPrinter({x: "x"}, frozenset({x}))
    in_place = TorchPrinter({x: "x"}, frozenset({x}), settings={"no_grad": True})
    assert plain.doprint_expr(activations.mish(x)) == "torch.nn.functional.mish(x)"
    assert ".mul_(" in in_place.doprint_expr(activations.mish(x))
    assert "no_grad" in TorchPrinter._default_settings


@pytest.mark.parametrize(
    "constant, text",
    [
        (-(sympy.pi**2) / 3, "-(math.pi**2) / 3"),
        (2 * sympy.sqrt(2 / sympy.pi), "2 * math.sqrt(2 / math.pi)"),
        (sympy.sqrt(3) / sympy.pi, "math.sqrt(3) / math.pi"),
        (sympy.pi**2 / 6, "math.pi**2 / 6"),
        (sympy.E**2 / 7, "math.exp(2) / 7"),
        (sympy.Rational(3, 2) * sympy.pi, "3 * math.pi / 2"),
    ],
)
def test_exact_constants_print_as_expressions_of_their_value(constant, text):
    """Note [constants as written]: the expression, not its value, and Python's float64 of it
    within one unit in the last place of the exact value."""
    import math

    x = sympy.Symbol("x", real=True)
    printed = TorchPrinter({x: "x"}, frozenset({x})).doprint_expr(constant * x)
    assert printed == f"{text} * x"
    value = eval(text, {"math": math})  # our own printed text, not spec text
    exact = float(constant.evalf(30))
    assert abs(value - exact) <= math.ulp(exact)


def test_sinc_gradient_has_no_dead_branch_and_its_docstring_no_guard():
    source = (GENERATED / "ops" / "sinc.py").read_text(encoding="utf-8")
    backward = source.split("def backward")[1].split("def sinc")[0]
    assert "== 0" not in backward, backward  # `where(w == 0, ...)` of the guarded `w`: never true
    doc = source.split("Gradients:")[1]
    assert doc.count("where(") == 1 and "1.6449" not in source and "3.2898" not in source, doc
    assert "math.pi**2 / 6 * x**2" in source


def test_guarded_equality_folds_only_when_both_branches_agree():
    from opgen.formula import functions as fn
    from opgen.optimize.rewrite import rewrite

    x = sympy.Symbol("x", real=True)
    guarded = fn.where(sympy.Abs(x) >= sympy.Rational(1, 10000), x, 1)
    assert rewrite(fn.where(sympy.Eq(guarded, 0), 0, x)) == x
    assert rewrite(fn.where(sympy.Ne(guarded, 0), x, 0)) == x
    open_guard = fn.where(x > -1, x, 1)  # x == 0 is possible where x > -1
    assert rewrite(fn.where(sympy.Eq(open_guard, 0), 0, x)) != x
    assert rewrite(fn.where(sympy.Eq(fn.where(x > 1, x, 0), 0), 0, x)) != x  # the safe value is 0


def test_sinc_gradients_match_torch_sinc_at_and_near_zero():
    from conftest import import_package  # noqa: F811

    op = import_package(GENERATED.parent, "generated").ops.sinc.sinc
    x = torch.tensor([0.0, 1e-300, 5e-5, -1e-4, 1e-4, 2e-4, 0.5, -2.0], dtype=torch.float64, requires_grad=True)
    (got,) = torch.autograd.grad(op(x).sum(), x, create_graph=True)
    (want,) = torch.autograd.grad(torch.sinc(x).sum(), x, create_graph=True)
    torch.testing.assert_close(got, want)
    second, native = torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0]
    native[:2] = -(torch.pi**2) / 3  # torch.sinc's own second derivative is NaN at 0; its limit
    torch.testing.assert_close(second, native)
