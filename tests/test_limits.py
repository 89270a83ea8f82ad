"""Resource limits and the time budget (opgen/limits.py, Note [yaml limits], Note [spec budget]).

Each pathological spec is refused within seconds, exit 2, with a located message naming the
limit, no traceback and OUT unchanged; the cases that are legal but were slow generate fast
and agree with plain autograd. Runs that used to hang go through a subprocess with a timeout,
so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, SPECS, import_package

from opgen import limits
from opgen.emit.render import Renderer
from opgen.errors import SpecError
from opgen.pipeline import build

SECONDS = 30  # a refusal must come well within this, even on a loaded machine
HEAD = "name: op\ninputs:\n  x: Tensor\n"


def spec_with(output: str, lets: str = "", inputs: str = "") -> str:
    return HEAD + inputs + (f"let:\n{lets}" if lets else "") + f"outputs:\n  y: {output}\n"


def doubling_lets(count: int) -> str:
    """`count` lets, each using the one before twice: the written-out output doubles per let."""
    lines = ["  l0: sin(x) * x\n"] + [f"  l{k}: tanh(l{k - 1}) * x + l{k - 1}\n" for k in range(1, count)]
    return "".join(lines)


def run(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "opgen", *args],
        capture_output=True,
        text=True,
        timeout=SECONDS * 4,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    return result.returncode, result.stdout, result.stderr, time.monotonic() - start


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def existing(tmp_path_factory) -> Path:
    """A package already generated at OUT, which a refused spec must leave as it is."""
    root = tmp_path_factory.mktemp("existing")
    assert run(["generate", str(SPECS / "swish.yaml"), "-o", str(root / "pkg")])[0] == 0
    return root / "pkg"


def refuse(tmp_path: Path, existing: Path, text: str, pattern: str, env: dict[str, str] | None = None) -> str:
    """Generate `text` into a copy of `existing`: exit 2 in seconds, a located first message matching `pattern`."""
    out = tmp_path / "pkg"
    shutil.copytree(existing, out)
    before = snapshot(out)
    spec = tmp_path / "op.yaml"
    spec.write_text(text, encoding="utf-8")
    status, _, err, seconds = run(["generate", str(spec), "-o", str(out)], env)
    assert status == 2, err
    assert "Traceback" not in err
    assert seconds < SECONDS, f"took {seconds:.1f} s"
    first = err.splitlines()[0]
    assert re.match(rf"^{re.escape(str(spec))}:\d+:\d+: ", first), first
    assert re.search(pattern, first), first
    assert snapshot(out) == before
    return first


# -- YAML --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "pattern", "where"),
    [
        ("!!bool maybe", r"'maybe' is not a valid !!bool value; drop the tag or fix the value", ":5:6:"),
        ("!!int many", r"'many' is not a valid !!int value", ":5:6:"),
        ("!!float lots", r"'lots' is not a valid !!float value", ":5:6:"),
        ("!!timestamp x", r"reads as a YAML date; put it in quotes", ":5:6:"),
        ("!!python/name:os.system x", r"the YAML tag !!python/name:os.system is not allowed", ":5:6:"),
        ("!!python/object/apply:os.system [echo]", r"tag !!python/object/apply:os.system is not allowed", ":5:6:"),
        ("!custom x", r"the YAML tag !custom is not allowed", ":5:6:"),
        ("!!binary aGVsbG8=", r"the YAML tag !!binary is not allowed", ":5:6:"),
        ("!!set {x}", r"the YAML tag !!set is not allowed", ":5:6:"),
    ],
)
def test_yaml_tags_are_located_messages(tmp_path, existing, value, pattern, where):
    first = refuse(tmp_path, existing, HEAD + f"outputs:\n  y: {value}\n", pattern)
    assert where in first


def test_a_tag_on_a_key_is_located_at_the_key(tmp_path, existing):
    first = refuse(tmp_path, existing, "name: op\ninputs:\n  !!bool perhaps: Tensor\noutputs:\n  y: x\n", "!!bool")
    assert ":3:3:" in first


def test_plain_aliases_still_work(tmp_path):
    spec = tmp_path / "op.yaml"
    spec.write_text("name: op\ninputs:\n  x: &t Tensor\n  z: *t\noutputs:\n  y: x * z\n")
    assert not build([str(spec)], Renderer()).problems


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("tests: &a [*a]\n", ":6:12:"),
        ("tests: &a {shapes: *a}\n", ":6:20:"),
        ("tests: &a {shapes: {x: [1, *a]}}\n", ":6:28:"),
    ],
)
def test_a_recursive_alias_is_refused_at_the_alias(tmp_path, existing, text, where):
    first = refuse(tmp_path, existing, spec_with("x") + text, r"the alias \*a is inside the node &a it names")
    assert where in first


def test_an_alias_bomb_is_refused_at_the_first_value_over_the_limit(tmp_path, existing):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, 9)]
    text = "name: op\ninputs:\n  x: Tensor\nbomb:\n" + "".join(f"  {line}\n" for line in lines) + "outputs:\n  y: x\n"
    first = refuse(tmp_path, existing, text, r"aliases \(\*name\) expanded is \d+ nodes, over the 'YAML nodes' limit")
    assert ":9:7:" in first  # a4: 9 ** 5 > 10_000


@pytest.mark.parametrize("depth", [33, 1000, 100_000])
def test_deep_yaml_is_refused(tmp_path, existing, depth):
    text = spec_with("x") + "tests: " + "[" * depth + "]" * depth + "\n"
    refuse(tmp_path, existing, text, r"is 33 levels deep, over the 'YAML depth' limit of 32")


def test_yaml_just_inside_the_depth_limit_reads(tmp_path):
    from opgen.spec.load import RawMap, load_text

    text = "a: " + "[" * (limits.YAML_DEPTH.value - 2) + "]" * (limits.YAML_DEPTH.value - 2) + "\n"
    assert isinstance(load_text(text, "t.yaml"), RawMap)


# -- numbers -----------------------------------------------------------------------------------


def test_a_5000_digit_integer_in_yaml_is_refused(tmp_path, existing):
    text = spec_with("x") + "tests:\n  shapes:\n    x: [" + "9" * 5000 + "]\n"
    refuse(tmp_path, existing, text, r":8:9: this number is 5000 digits, over the 'digits per number' limit of 100")


def test_a_5000_digit_integer_in_a_formula_is_refused_at_the_number(tmp_path, existing):
    refuse(tmp_path, existing, spec_with("x * " + "9" * 5000), r":5:10: this number is 5000 digits, over the 'digits")


def test_a_5000_digit_default_is_refused(tmp_path, existing):
    text = spec_with("x * n", inputs="  n: int = " + "9" * 5000 + "\n")
    refuse(tmp_path, existing, text, r":4:6: this number is 5000 digits, over the 'digits per number' limit")


@pytest.mark.parametrize(
    ("formula", "shown"),
    [
        ("x * 9 ** 9 ** 9", "`9 \\*\\* 9 \\*\\* 9` is about 2 \\*\\* 1.23e\\+09"),
        ("x * 9 ** -(9 ** 9)", "`9 \\*\\* \\(-9 \\*\\* 9\\)` is about 2 \\*\\* -1.23e\\+09"),
        ("x * 2.5 ** 10 ** 20", "`2.5 \\*\\* 10 \\*\\* 20` is about 2 \\*\\* 1.32e\\+20"),
        ("x + 10 ** 400", "`10 \\*\\* 400` is about 2 \\*\\* 1.33e\\+03"),
    ],
)
def test_constant_powers_beyond_float64_are_refused(tmp_path, existing, formula, shown):
    refuse(tmp_path, existing, spec_with(formula), rf"the constant {shown}.* outside float64.*.constant size. limit")


def test_products_of_constants_beyond_float64_are_refused(tmp_path, existing):
    big = "1" + "0" * 99
    pattern = r"`.*` is outside float64.*.constant size."
    refuse(tmp_path, existing, spec_with(f"x * ({big} * {big} * {big} * {big})"), pattern)


@pytest.mark.parametrize(
    ("formula", "pattern"),
    [
        # SymPy multiplies the numbers out of a product or a sum: the formula held 1e616 (an internal error)
        ("x * 1e308 * 1e308", r":5:6: in `x \* 1e308 \* 1e308`: a number SymPy multiplies out of .* outside float64"),
        ("sin(x) + (x * 1e308 + x * 1e308)", r":5:16: .*a number SymPy multiplies out of .* outside float64"),
        # a function of a number: its value overflowed in the generated code (`math.exp(10000000000)`) at every call
        (
            "exp(10 ** 10) * x",
            r":5:6: in `exp\(10 \*\* 10\) \* x`: the constant `exp\(10 \*\* 10\)` is outside float64",
        ),
        # a derived number beyond float64 (`2e308 * x`): an internal error
        ("x ** 2 * 1e308", r":1:1: cannot generate torch code: a number of the derived formulas is outside float64"),
    ],
)
def test_numbers_that_become_too_large_for_float64_are_refused(tmp_path, existing, formula, pattern):
    refuse(tmp_path, existing, spec_with(formula), pattern)


def test_an_exponent_beyond_int64_prints_as_a_float(tmp_path):
    """`x ** (10 ** 100)` printed the exponent as a Python int, which torch takes as int64: every call
    raised 'int too big to convert'. As float64, as plain torch computes the formula with a float exponent."""
    from spec_ops import build_ops

    spec = spec_with("x ** (10 ** 100) + x ** -(2 ** 70)")
    op = build_ops(tmp_path, "power_ops", {"op": spec}).op
    x = torch.tensor([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    want = x.detach() ** 1e100 + x.detach() ** -(2.0**70)
    torch.testing.assert_close(op(x), want)
    plain = torch.autograd.grad((x**1e100 + x ** -(2.0**70)).sum(), x)[0]
    torch.testing.assert_close(torch.autograd.grad(op(x).sum(), x)[0], plain, equal_nan=True)


def test_a_number_sympy_evaluates_into_huge_digits_is_its_float(tmp_path):
    """`lgamma(100000)` is `log(99999!)` to SymPy, and `lgamma(1e5 + 0.5)` a log of a huge fraction: their
    digits are past Python's limit for writing an int (an internal error), and the fraction's size was
    taken for the number's (refused as outside float64). Against torch.lgamma in float64."""
    from spec_ops import build_ops

    op = build_ops(tmp_path, "lgamma_ops", {"op": spec_with("x * lgamma(100000) + lgamma(1e5 + 0.5)")}).op
    x = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64)
    big = torch.tensor([100000.0, 100000.5], dtype=torch.float64).lgamma()
    torch.testing.assert_close(op(x), x * big[0] + big[1])


def test_lgamma_and_digamma_of_a_large_integer_read_in_well_under_a_budget(tmp_path):
    """SymPy evaluates `lgamma(n)` as `log((n-1)!)` and `digamma(n)` as a harmonic number, exactly:
    at 1e7 reading the formula ran past the 20 s budget. Above 1000 they are read to 30 digits.
    Poles stay as they were (lgamma: inf, as torch; digamma: refused). Against torch in float64."""
    from spec_ops import build_ops

    formula = "x * lgamma(1e7) + digamma(10**6) - lgamma(2001) + digamma(-5000.5) + lgamma(7/2)"
    start = time.monotonic()
    op = build_ops(tmp_path, "gamma_ops", {"op": spec_with(formula)}).op
    assert time.monotonic() - start < SECONDS
    x = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64)
    t = torch.tensor([1e7, 1e6, 2001.0, -5000.5, 3.5], dtype=torch.float64)
    lg, dg = t.lgamma(), t.digamma()
    torch.testing.assert_close(op(x), x * lg[0] + dg[1] - lg[2] + dg[3] + lg[4])


# -- formulas ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("formula", "pattern"),
    [
        ("-" * 1000 + "x", r"is 101 levels deep, over the 'formula depth' limit of 100"),
        ("exp(" * 150 + "x" + ")" * 150, r"is 101 levels deep, over the 'formula depth' limit of 100"),
        (" + ".join(["x"] * 3000), r"nested too deeply to read \(the 'formula depth' limit is 100\)"),
        ("(" * 1000 + "x" + ")" * 1000, r"too many nested parentheses"),
        (" + ".join(f"sin({k} * x) * exp(x)" for k in range(60)), r"is \d+ nodes, over the 'formula size' limit"),
    ],
)
def test_formulas_over_the_size_or_depth_limit_are_refused(tmp_path, existing, formula, pattern):
    refuse(tmp_path, existing, spec_with(formula), pattern)


def test_a_chain_of_14_lets_each_used_twice_is_refused_by_the_inlined_size(tmp_path, existing):
    text = spec_with("l13", lets=doubling_lets(14))
    refuse(
        tmp_path, existing, text, r":20:6: output 'y' with its lets written out is 61437 nodes, over the 'inlined size'"
    )


def test_a_gradient_override_over_the_inlined_size_is_refused(tmp_path, existing):
    text = spec_with("x * l0", lets=doubling_lets(14)) + "gradients:\n  x: grad * l13\n"
    pattern = r":22:6: the gradient of 'x' with its lets written out is 61439 nodes, over the 'inlined size' limit"
    refuse(tmp_path, existing, text, pattern)


def test_a_chain_of_lets_nested_too_deep_is_refused_by_the_inlined_depth(tmp_path, existing):
    lets = "  l0: sin(x)\n" + "".join(f"  l{k}: tanh(exp(l{k - 1}))\n" for k in range(1, 60))
    pattern = r":66:6: output 'y' with its lets written out is 120 levels deep, over the 'inlined depth' limit of 100"
    refuse(tmp_path, existing, spec_with("l59", lets=lets), pattern)


@pytest.mark.parametrize(("section", "limit"), [("inputs", 64), ("let", 64), ("outputs", 16)])
def test_counts_of_inputs_lets_and_outputs_are_limited(tmp_path, existing, section, limit):
    names = [f"v{k}" for k in range(limit + 1)]
    inputs = "".join(f"  {n}: Tensor\n" for n in names) if section == "inputs" else "  x: Tensor\n"
    lets = "".join(f"  {n}: x\n" for n in names) if section == "let" else ""
    outputs = "".join(f"  {n}: x\n" for n in names) if section == "outputs" else "  y: x\n"
    text = "name: op\ninputs:\n" + inputs + (f"let:\n{lets}" if lets else "") + "outputs:\n" + outputs
    line = text.splitlines().index(f"{section}:") + 1
    name = "lets" if section == "let" else section
    refuse(
        tmp_path, existing, text, rf":{line}:1: the number of {name} is {limit + 1}, over the '{name}' limit of {limit}"
    )


# -- legal, and once slow ----------------------------------------------------------------------


def generate_and_import(tmp_path: Path, text: str, package: str) -> object:
    spec = tmp_path / "op.yaml"
    spec.write_text(text, encoding="utf-8")
    status, _, err, seconds = run(["generate", str(spec), "-o", str(tmp_path / package)])
    assert status == 0, err
    assert seconds < SECONDS, f"took {seconds:.1f} s"
    return import_package(tmp_path, package).op


def test_a_power_tower_generates_and_matches_autograd(tmp_path):
    op = generate_and_import(tmp_path, spec_with("x ** x ** x"), "tower_pkg")
    x = torch.linspace(0.3, 2.0, 11, dtype=torch.float64, requires_grad=True)
    (got,) = torch.autograd.grad(op(x).sum(), x)
    plain = x.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad((plain ** (plain**plain)).sum(), plain)
    torch.testing.assert_close(got, want)


def test_60_summed_inputs_generate_and_match_autograd(tmp_path):
    names = [f"x{k}" for k in range(60)]
    text = "name: op\ninputs:\n" + "".join(f"  {n}: Tensor\n" for n in names) + f"outputs:\n  y: {' + '.join(names)}\n"
    op = generate_and_import(tmp_path, text, "sum_pkg")
    args = [torch.randn(3, dtype=torch.float64, requires_grad=True) for _ in names]
    value = op(*args)
    torch.testing.assert_close(value, torch.stack(args).sum(0))
    grads = torch.autograd.grad((value * torch.arange(3.0, dtype=torch.float64)).sum(), args)
    for grad in grads:
        torch.testing.assert_close(grad, torch.arange(3.0, dtype=torch.float64))


def test_a_chain_of_14_lets_each_used_once_generates_and_matches_autograd(tmp_path):
    lets = "  l0: sin(x) * x\n" + "".join(f"  l{k}: tanh(l{k - 1}) * x + x\n" for k in range(1, 14))
    op = generate_and_import(tmp_path, spec_with("l13", lets=lets), "chain_pkg")
    x = torch.linspace(-2, 2, 9, dtype=torch.float64, requires_grad=True)
    (got,) = torch.autograd.grad(op(x).sum(), x)
    plain = x.detach().clone().requires_grad_()
    value = torch.sin(plain) * plain
    for _ in range(13):
        value = torch.tanh(value) * plain + plain
    (want,) = torch.autograd.grad(value.sum(), plain)
    torch.testing.assert_close(got, want)


def test_nested_exponentials_generate_in_seconds(tmp_path):
    # exact test values at x = 1e4 would need exp of a 10**4343-sized number (Note [runaway magnitudes])
    op = generate_and_import(tmp_path, spec_with("sin(exp(exp(exp(x))))"), "exp_pkg")
    x = torch.linspace(-3, -1, 5, dtype=torch.float64, requires_grad=True)
    (got,) = torch.autograd.grad(op(x).sum(), x)
    plain = x.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad(torch.sin(torch.exp(torch.exp(torch.exp(plain)))).sum(), plain)
    torch.testing.assert_close(got, want)


# -- the time budget ---------------------------------------------------------------------------

# Inside every size limit (957 nodes written out), and several seconds of SymPy work.
COSTLY = spec_with("l7", lets=doubling_lets(8))


def test_a_spec_over_its_time_budget_is_a_located_error(tmp_path, existing):
    pattern = r"spec too costly: it exceeded the 0.3 s time budget while "
    first = refuse(tmp_path, existing, COSTLY, pattern, env={limits.BUDGET_VARIABLE: "0.3"})
    assert "OPGEN_BUDGET=SECONDS" in first
    assert any(stage in first for stage in limits.STAGES.values())


def test_a_yaml_file_over_the_budget_is_told_to_shrink_the_file(tmp_path, existing):
    """A huge file runs out of time before any formula is read: it was told to simplify its formulas."""
    points = ", ".join(str(k / 1000) for k in range(400_000))
    text = spec_with("x") + f"tests:\n  points: {{x: [{points}]}}\n"
    pattern = r"time budget while reading the YAML; make the spec file smaller, or raise the budget"
    refuse(tmp_path, existing, text, pattern, env={limits.BUDGET_VARIABLE: "0.3"})


def test_the_budget_works_off_the_main_thread_and_leaves_no_timer(tmp_path, monkeypatch):
    spec = tmp_path / "op.yaml"
    spec.write_text(COSTLY)
    monkeypatch.setenv(limits.BUDGET_VARIABLE, "0.3")
    found: list[list[str]] = []
    start = time.monotonic()
    worker = threading.Thread(target=lambda: found.append(build([str(spec)], Renderer()).problems.report()))
    worker.start()
    worker.join(SECONDS)
    assert not worker.is_alive()
    assert time.monotonic() - start < SECONDS
    assert len(found[0]) == 1 and "exceeded the 0.3 s time budget" in found[0][0], found
    time.sleep(1.2)  # a late watchdog would raise into this thread's next work; there is none left
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_after_an_interrupted_spec_the_next_spec_generates_as_alone(tmp_path, monkeypatch):
    (tmp_path / "a_costly.yaml").write_text(COSTLY.replace("name: op", "name: costly"))
    swish = tmp_path / "b_swish.yaml"
    swish.write_text((SPECS / "swish.yaml").read_text())
    handler = signal.getsignal(signal.SIGALRM)
    seconds = iter([0.3, 60.0])
    monkeypatch.setattr(limits, "budget_seconds", lambda: next(seconds))
    both = build([str(tmp_path / "a_costly.yaml"), str(swish)], Renderer())
    assert signal.getsignal(signal.SIGALRM) is handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    (problem,) = both.problems.report()
    assert problem.startswith(f"{tmp_path / 'a_costly.yaml'}:") and "time budget" in problem
    monkeypatch.undo()
    alone = build([str(swish)], Renderer())
    assert not alone.problems
    for name in ("ops/swish.py", "tests/test_swish.py"):
        assert both.files[name] == alone.files[name]


def test_every_spec_is_far_inside_every_limit():
    from conftest import as_written

    from opgen.errors import Problems
    from opgen.pipeline import run_stages, source_name
    from opgen.spec.load import load_file
    from opgen.spec.parse import parse_spec

    for path in sorted(SPECS.glob("*.yaml")):
        spec = parse_spec(load_file(path, str(path)), source_name(path), Problems())
        assert spec is not None
        assert len(spec.inputs) * 10 <= limits.INPUTS.value and len(spec.lets) * 10 <= limits.LETS.value
        stages = run_stages(as_written(spec), Problems(), stop_after="derive")
        assert stages is not None and stages.derived is not None
        for _, expr in stages.derived.full.inlined:
            size, depth = limits.tree_size_and_depth(expr)
            assert size * 10 <= limits.INLINED_NODES.value and depth * 10 <= limits.INLINED_DEPTH.value, path


def test_a_character_yaml_forbids_is_located_on_one_line():
    from opgen.spec.load import load_text

    with pytest.raises(SpecError) as raised:
        load_text("name: a\ndoc: b\x00c\n", "f.yaml")
    assert str(raised.value) == "f.yaml:2:7: invalid YAML: the character U+0000 is not allowed in YAML text; remove it"


def test_an_op_name_too_long_for_its_file_names_is_refused_at_the_name(tmp_path, existing):
    """`tests/test_NAME.py` of a 250-character name is over the 255 bytes of a file name: a located
    error at the name, where the write failed with `File name too long` before."""
    text = f"name: {'a' * 250}\ninputs:\n  x: Tensor\noutputs:\n  y: x * 2\n"
    refuse(tmp_path, existing, text, r":1:7: name 'a+' is 250 characters, over the 'name length' limit of 200")


def test_variance_of_one_entry_without_correction_is_zero(tmp_path):
    """var/std over a shape of ones (`[1]` from a kept reduction) take one entry: with correction=1 a
    located error (test_bad_specs: variance_of_one_entry), with correction=0 zero, as torch gives."""
    from spec_ops import build_ops

    spec = "name: op\ninputs:\n  x: Tensor[K]\nlet:\n  n: sum(x, dim=0, keepdim=true)\noutputs:\n"
    spec += "  y: std(n, correction=0) + var(n, dim=0, correction=0) + x * n\n"
    op = build_ops(tmp_path, "one_entry_ops", {"op": spec}).op
    x = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    n = x.sum(0, keepdim=True)
    want = n.std(correction=0) + n.var(0, correction=0) + x * n
    torch.testing.assert_close(op(x), want)
    torch.testing.assert_close(*(torch.autograd.grad(y.sum(), x)[0] for y in (op(x), want)))


# Note: each of these once took time doubling with each level of nesting (a call's arguments walked
# twice), or recursed as deep as the formula (a long sum as written is as deep as it has terms).
UNARY = ("sin", "cos", "tanh", "atan", "sigmoid", "erf")
TORCH_UNARY = (torch.sin, torch.cos, torch.tanh, torch.atan, torch.sigmoid, torch.erf)
LINEAR_SECONDS = 20  # generous: the machine is shared; each takes a few seconds alone


def generate_in_linear_time(tmp_path: Path, text: str, package: str) -> object:
    spec = tmp_path / "op.yaml"
    spec.write_text(text, encoding="utf-8")
    status, _, err, seconds = run(["generate", str(spec), "-o", str(tmp_path / package), "--no-cache"])
    assert status == 0, err
    assert seconds < LINEAR_SECONDS, f"took {seconds:.1f} s"
    return import_package(tmp_path, package).op


def chained(x: torch.Tensor, count: int) -> torch.Tensor:
    for k in range(count):
        x = TORCH_UNARY[k % len(UNARY)](x)
    return x


def test_a_60_deep_nest_of_unary_functions_generates_in_seconds(tmp_path):
    formula = "x"
    for k in range(60):
        formula = f"{UNARY[k % len(UNARY)]}({formula})"
    op = generate_in_linear_time(tmp_path, spec_with(formula), "nest_pkg")
    x = torch.linspace(-2, 2, 9, dtype=torch.float64, requires_grad=True)
    plain = x.detach().clone().requires_grad_()
    torch.testing.assert_close(op(x), chained(plain, 60))
    torch.testing.assert_close(
        torch.autograd.grad(op(x).sum(), x), torch.autograd.grad(chained(plain, 60).sum(), plain)
    )


@pytest.mark.parametrize("summed", [False, True])
def test_a_60_long_let_chain_generates_in_seconds(tmp_path, summed):
    """Each let a function of the one before (`l59` is 60 calls deep), or the one before plus a term."""
    step = (lambda k: f"l{k - 1} + sin({k} * x)") if summed else (lambda k: f"{UNARY[k % len(UNARY)]}(l{k - 1})")
    lets = "  l0: sin(x)\n" + "".join(f"  l{k}: {step(k)}\n" for k in range(1, 60))
    op = generate_in_linear_time(tmp_path, spec_with("l59", lets=lets), f"lets_pkg_{summed}")
    x = torch.linspace(-2, 2, 9, dtype=torch.float64, requires_grad=True)
    plain = x.detach().clone().requires_grad_()
    if summed:
        want = sum((torch.sin(k * plain) for k in range(1, 60)), torch.sin(plain))
    else:
        want = plain.sin()
        for k in range(1, 60):
            want = TORCH_UNARY[k % len(UNARY)](want)
    torch.testing.assert_close(op(x), want)
    torch.testing.assert_close(torch.autograd.grad(op(x).sum(), x), torch.autograd.grad(want.sum(), plain))


def test_a_200_term_sum_generates_in_seconds(tmp_path):
    """200 terms as written (the 'formula depth' counts a run of `+` and `-` as one level)."""
    names = ("x", "y", "z", "w")
    signs = ["-" if k % 3 == 1 else "+" for k in range(200)]
    formula = " ".join(f"{s} {names[k % 4]}" for k, s in enumerate(signs))[2:]  # the first term is +
    inputs = "".join(f"  {n}: Tensor\n" for n in names)
    op = generate_in_linear_time(tmp_path, f"name: op\ninputs:\n{inputs}outputs:\n  out: {formula}\n", "sum_pkg")
    args = [torch.randn(3, dtype=torch.float64, requires_grad=True) for _ in names]
    weights = [sum((1.0 if s == "+" else -1.0) for k, s in enumerate(signs) if k % 4 == j) for j in range(4)]
    torch.testing.assert_close(op(*args), sum(w * a for w, a in zip(weights, args, strict=True)))
    for grad, weight in zip(torch.autograd.grad(op(*args).sum(), args), weights, strict=True):
        torch.testing.assert_close(grad, torch.full((3,), weight, dtype=torch.float64))


def test_a_50_term_sum_of_calls_generates_in_seconds(tmp_path):
    op = generate_in_linear_time(tmp_path, spec_with(" + ".join(f"sin({k} * x)" for k in range(1, 51))), "sines_pkg")
    x = torch.linspace(-2, 2, 9, dtype=torch.float64, requires_grad=True)
    want = sum(torch.sin(k * x) for k in range(1, 51))
    torch.testing.assert_close(op(x), want)
    (got,) = torch.autograd.grad(op(x).sum(), x)
    torch.testing.assert_close(got, sum(k * torch.cos(k * x) for k in range(1, 51)))
