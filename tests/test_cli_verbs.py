"""The verbs and flags around generate: `show`, `new`, `--quiet`/`--verbose`, `check --diff`,
and templates that fail at their own line."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import sympy
from conftest import ROOT, SPECS, SWISH
from test_cli import snapshot, write_spec

from opgen.write.ownership import MARKER

TANHSHRINK_LET = "name: op\ninputs:\n  x: Tensor\nlet:\n  t: tanh(x)\noutputs:\n  y: x - t\n"


def _files(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


# -- show ------------------------------------------------------------------------------------------


def _gradient(text: str, name: str) -> sympy.Expr:
    """The gradient `grad_NAME = ...` that `opgen show` printed, read back by SymPy (test side only)."""
    found = re.search(rf"^\s+grad_{name} = (.+)$", text, re.MULTILINE)
    assert found, text
    local = {n: sympy.Symbol(n, real=True) for n in ("x", "beta", "grad", "t")}
    local |= {"sigmoid": lambda u: 1 / (1 + sympy.exp(-u))}
    return sympy.sympify(found[1], locals=local)


def test_show_prints_the_derived_gradient_and_writes_nothing(run_cli, tmp_path):
    spec = write_spec(tmp_path / "specs")
    before = _files(tmp_path)
    status, out, err = run_cli("show", str(spec), cwd=tmp_path)
    assert status == 0, err
    assert _files(tmp_path) == before
    x, beta = sympy.symbols("x beta", real=True)
    expected = sympy.diff(x / (1 + sympy.exp(-beta * x)), x)  # independent of opgen's derivation
    shown = _gradient(out, "x").subs(sympy.Symbol("grad", real=True), 1)
    for point in (-2.5, -0.3, 0.0, 0.7, 3.0):
        values = {x: point, beta: 1.5}
        assert abs(float(shown.subs(values)) - float(expected.subs(values))) < 1e-12
    assert re.search(r"^\s+y = ", out, re.MULTILINE)
    assert "tensors: x" in out and "numbers: beta" in out


def test_show_heads_each_op_with_the_path_given(run_cli, tmp_path):
    """The heading names the spec file as the command line named it (as a problem would), not the
    path relative to the specs folder that the generated header uses."""
    (tmp_path / "mine").mkdir()
    write_spec(tmp_path / "mine")
    status, out, _ = run_cli("show", "mine/swish.yaml", cwd=tmp_path)
    assert status == 0 and out.splitlines()[0] == "swish (mine/swish.yaml)"
    status, out, _ = run_cli("show", str(tmp_path / "mine"))
    assert out.splitlines()[0] == f"swish ({tmp_path / 'mine' / 'swish.yaml'})"


def test_a_reader_that_stops_early_gets_no_traceback():
    """`opgen show specs | head -1`: the pipe closes while opgen writes; it stops without a traceback."""
    command = f"{sys.executable} -m opgen show {SPECS} | head -1"
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.startswith("affine (") and done.stderr == ""


def test_show_names_the_kernels_and_what_backward_saves_as_the_generated_code_does(run_cli, golden):
    status, out, _ = run_cli("show", str(SPECS / "silu.yaml"), str(SPECS / "sigmoid.yaml"))
    assert status == 0
    silu, sigmoid = out.split("\nsigmoid (")
    assert "forward: torch.nn.functional.silu(x)" in silu
    assert "backward: torch.ops.aten.silu_backward(" in silu
    assert "torch.ops.aten.sigmoid_backward(" in sigmoid
    for name, block in (("silu", silu), ("sigmoid", sigmoid)):
        source = golden.files[f"ops/{name}.py"]
        saved = re.search(r"ctx\.save_for_backward\(([^)]*)\)", source)[1]
        assert f"tensors: {saved}" in block, name
        for call in re.findall(r"(torch\.ops\.aten\.\w+|torch\.nn\.functional\.\w+)\(", block):
            assert call in source, (name, call)


def test_show_reads_the_plan_without_deriving_twice(run_cli, tmp_path, monkeypatch):
    from opgen.derive import gradients

    calls = []
    original = gradients.derive
    monkeypatch.setattr(gradients, "derive", lambda *a, **k: calls.append(1) or original(*a, **k))
    spec = write_spec(tmp_path, "name: op\ninputs:\n  x: Tensor\noutputs:\n  y: log(1 + exp(x))\n", "op.yaml")
    assert run_cli("show", str(spec))[0] == 0
    assert len(calls) == 1


def test_show_policy_changes_what_backward_saves(run_cli, tmp_path):
    spec = write_spec(tmp_path, TANHSHRINK_LET, "op.yaml")
    memory = run_cli("show", str(spec), "--policy", "memory")[1]
    speed = run_cli("show", str(spec), "--policy", "speed")[1]
    assert "tensors: x\n" in memory and "tensors: x\n" not in speed


def test_show_latex_of_every_spec(run_cli):
    status, out, err = run_cli("show", "--latex", str(SPECS))
    assert status == 0, err
    assert out.count(r"\frac{\partial L}{\partial") >= 37
    assert "grad_x =" not in out


def test_show_of_a_bad_spec_is_located(run_cli, tmp_path):
    spec = write_spec(tmp_path, SWISH.replace("exp(-beta * x)", "exp(-beta * q)"))
    status, out, err = run_cli("show", str(spec))
    assert status == 2 and out == ""
    assert f"{spec}:6:" in err and "unknown name 'q'" in err and "Traceback" not in err


# -- new -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", [False, True])
def test_new_spec_generates_and_its_tests_pass(run_cli, tmp_path, module):
    args = ["new", "leaky_gate", "-o", "specs"] + (["--module"] if module else [])
    status, out, err = run_cli(*args, cwd=tmp_path)
    assert status == 0, err
    text = (tmp_path / "specs" / "leaky_gate.yaml").read_text()
    assert text.startswith("# leaky_gate") and ("module:" in text) == module
    assert run_cli("generate", "specs", "-o", "ops", cwd=tmp_path)[0] == 0
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:warnings", "-p", "no:cacheprovider", "ops/tests"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert " passed" in tests.stdout


def test_new_never_overwrites(run_cli, tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("# my spec\n")
    status, _, err = run_cli("new", "mine", "-o", str(tmp_path))
    assert status == 2 and "already exists" in err
    assert path.read_text() == "# my spec\n"


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("Bad-Name", "snake_case"),
        ("class", "snake_case"),
        ("test_op", "pytest would collect"),
        ("tests", "package's own module"),
        ("../evil", "snake_case"),
    ],
)
def test_new_validates_name(run_cli, tmp_path, name, why):
    status, _, err = run_cli("new", name, cwd=tmp_path)
    assert status == 2 and why in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


# -- quiet, verbose, check --diff -----------------------------------------------------------------


def test_quiet_and_verbose(run_cli, tmp_path):
    specs = tmp_path / "specs"
    write_spec(specs)
    out = str(tmp_path / "ops")
    status, text, err = run_cli("generate", str(specs), "-o", out, "--quiet")
    assert status == 0 and text == "" and err == ""
    status, text, _ = run_cli("check", str(specs), "-o", out, "-q")
    assert status == 0 and text == ""
    write_spec(specs, SWISH.replace("1.0", "2.0"))
    status, text, _ = run_cli("generate", str(specs), "-o", out, "--verbose")
    assert status == 0
    assert f"{out}/ops/swish.py: written" in text and f"{out}/tests/test_swish.py: written" in text
    assert "1 ops, 2 files changed" in text


def test_check_prints_a_summary_and_the_diff_only_on_request(run_cli, tmp_path):
    specs = tmp_path / "specs"
    spec = write_spec(specs)
    out = str(tmp_path / "ops")
    assert run_cli("generate", str(specs), "-o", out)[0] == 0
    spec.write_text(SWISH.replace("beta: float = 1.0", "beta: float = 2.0"))
    status, text, err = run_cli("check", str(specs), "-o", out)
    assert status == 1 and text == ""
    assert err.count("\n") == 1 and "out of date (2 files differ)" in err and "--diff" in err
    status, text, err = run_cli("check", str(specs), "-o", out, "--diff")
    assert status == 1 and "+def swish(x: torch.Tensor, beta: float = 2.0)" in text
    status, text, err = run_cli("check", str(specs), "-o", out, "--quiet")
    assert status == 1 and text == "" and "out of date" in err  # a failure is never silent


def test_help_of_each_verb():
    for verb, words in (("show", "--latex"), ("new", "--module"), ("check", "--diff"), ("generate", "--quiet")):
        result = subprocess.run(
            [sys.executable, "-m", "opgen", verb, "--help"], cwd=ROOT, capture_output=True, text=True
        )
        assert result.returncode == 0 and words in result.stdout, verb


# -- templates -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("broken", "what"),
    [
        ("{{ module_doc }", "template syntax error"),
        ("{{ module_docs }}", "'module_docs' is undefined"),
        ("{{ 1 // 0 }}", "the template raised ZeroDivisionError"),
    ],
    ids=["syntax", "undefined", "raises"],
)
def test_a_broken_template_is_located_and_writes_nothing(run_cli, tmp_path, broken, what):
    replace = "{{ module_doc }}"
    specs = tmp_path / "specs"
    write_spec(specs)
    templates = tmp_path / "templates"
    templates.mkdir()
    ours = (ROOT / "templates" / "op.py.j2").read_text()
    line = ours.splitlines().index(replace) + 1
    (templates / "op.py.j2").write_text(ours.replace(replace, broken))
    out = tmp_path / "ops"
    assert run_cli("generate", "specs", "-o", "ops", cwd=tmp_path)[0] == 0
    before = snapshot(out)
    status, _, err = run_cli("generate", "specs", "-o", "ops", "--templates", "templates", "--no-cache")
    assert status == 2 and "Traceback" not in err
    assert err.startswith(f"templates/op.py.j2:{line}:1: {what}"), err
    assert snapshot(out) == before


def test_the_generated_header_is_opgens_not_the_templates(run_cli, tmp_path):
    specs = tmp_path / "specs"
    write_spec(specs)
    templates = tmp_path / "templates"
    templates.mkdir()
    for name in ("op.py.j2", "init.py.j2"):
        ours = (ROOT / "templates" / name).read_text()
        (templates / name).write_text("\n".join(line for line in ours.splitlines() if MARKER not in line) + "\n")
    args = ("generate", "specs", "-o", "ops", "--templates", "templates", "--no-cache")
    assert run_cli(*args, cwd=tmp_path)[0] == 0
    assert (tmp_path / "ops" / "ops" / "swish.py").read_text().startswith(f"{MARKER} from specs/swish.yaml")
    assert (tmp_path / "ops" / "__init__.py").read_text().startswith(MARKER)
    write_spec(specs, SWISH.replace("1.0", "2.0"))
    status, _, err = run_cli(*args)
    assert status == 0, err  # the next run still owns its output
    assert "beta: float = 2.0" in (tmp_path / "ops" / "ops" / "swish.py").read_text()


# -- progress ---------------------------------------------------------------------------------------

SOFTSIGN = "name: softsign\ninputs:\n  x: Tensor\noutputs:\n  y: x / (1 + abs(x))\n"


def _two_specs(tmp_path):
    specs = tmp_path / "specs"
    write_spec(specs)
    write_spec(specs, SOFTSIGN, "softsign.yaml")
    return specs


def test_verbose_names_each_spec_as_it_is_generated(run_cli, tmp_path):
    """Not on a terminal (a CI log): a plain line per spec generated, under -v only."""
    specs = _two_specs(tmp_path)
    status, _, err = run_cli("generate", str(specs), "-o", str(tmp_path / "a"), "-v", "--no-cache")
    assert status == 0, err
    lines = [line for line in err.splitlines() if line.startswith("opgen: generated ")]
    assert sorted(lines) == ["opgen: generated softsign (2/2)", "opgen: generated swish (1/2)"] or sorted(lines) == [
        "opgen: generated softsign (1/2)",
        "opgen: generated swish (2/2)",
    ]
    status, _, err = run_cli("generate", str(specs), "-o", str(tmp_path / "b"), "--no-cache")
    assert status == 0 and "opgen: generated" not in err


def test_on_a_terminal_progress_is_one_line_rewritten_then_cleared(run_cli, tmp_path, monkeypatch):
    specs = _two_specs(tmp_path)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    status, out, err = run_cli("generate", str(specs), "-o", str(tmp_path / "a"), "--no-cache")
    assert status == 0 and "2 ops" in out
    assert err.startswith("\r\x1b[Kopgen: generated 1/2 (") and "\r\x1b[Kopgen: generated 2/2 (" in err
    assert err.endswith("\r\x1b[K") and "\n" not in err
    status, _, err = run_cli("generate", str(specs), "-o", str(tmp_path / "b"), "--no-cache", "-q")
    assert status == 0 and err == ""
