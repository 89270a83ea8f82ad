"""Outside text in generated source: spec paths, names, `doc` text and numbers.

Each context has one function in `opgen.spec.quote` (comment, string literal, docstring, number,
identifier check); these tests feed it hostile text and check the Python that results, then
generate packages from hostile paths, docs, numbers and names, import them (nothing may run
on import), call the ops, and run their generated tests.
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import math
import os
import subprocess
import symtable
import sys
import textwrap
import tokenize
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from conftest import import_package
from hypothesis import given, settings
from hypothesis import strategies as st
from spec_ops import build_ops

from opgen.emit.annotations import BUILTIN_NAMES
from opgen.emit.render import Renderer
from opgen.pipeline import build
from opgen.spec import quote

HOSTILE = [
    '"',
    "'",
    '"""',
    "'''",
    "\\",
    "ends in a backslash \\",
    "\\n and \\x00 written out",
    "\n",
    "\r",
    "\r\n",
    "\x00",
    "\ud800",
    "\udcff",
    "{{ x }} {% if y %}{# z #}",
    "\u2028 \u2029 \x85 \x0b \x0c \x1c \x1d \x1e",
    "\u202e bidi \u2066",
    "\t",
    '"""+str(__import__("os").system("touch pwned"))+"""',
    "# not a comment",
    "ｔｏｒｃｈ µ ﬁ",
    "😀 \U0010ffff",
]
ANY_TEXT = st.text(st.characters(exclude_categories=()))  # surrogates, NUL and controls included


def _source_ok(source: str) -> None:
    """Valid UTF-8 Python source without a NUL byte."""
    source.encode("utf-8")
    assert "\x00" not in source
    compile(source, "<generated>", "exec")


# -- the functions, one per context ---------------------------------------------------------------


@pytest.mark.parametrize("text", HOSTILE)
def test_string_literal_is_exactly_the_text(text):
    literal = quote.string(text)
    _source_ok(f"x = {literal}\n")
    assert ast.literal_eval(literal) == text
    assert "\n" not in literal and "\r" not in literal and literal.isprintable()


@pytest.mark.parametrize("text", HOSTILE)
def test_comment_stays_one_comment(text):
    source = f"# made from {quote.comment(text)} -- end\nx = 1\n"
    _source_ok(source)
    assert len(source.splitlines()) == 2
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    assert [t.type for t in tokens[:2]] == [tokenize.COMMENT, tokenize.NL]
    assert len(ast.parse(source).body) == 1


@pytest.mark.parametrize("text", HOSTILE)
def test_docstring_value_is_the_text(text):
    lines = ["First line.", f"before {text} after", "last"]
    source = "def f():\n    " + quote.docstring(lines, indent=4) + "\n"
    _source_ok(source)
    assert len(ast.parse(source).body[0].body) == 1  # type: ignore[attr-defined]
    namespace: dict[str, object] = {}
    exec(source, namespace)
    assert _lines(namespace["f"].__doc__) == _lines("\n".join(lines)) + [""]  # type: ignore[attr-defined]


def _lines(text: str) -> list[str]:
    """A docstring's lines up to their indentation and trailing spaces."""
    return [line.strip(" ") for line in text.split("\n")]


@settings(max_examples=300, deadline=None)
@given(ANY_TEXT)
def test_every_text_round_trips_in_every_context(text):
    assert ast.literal_eval(quote.string(text)) == text
    source = f"# {quote.comment(text)}\n" + "def f():\n    " + quote.docstring(["a", text, "b"], indent=4) + "\nx = 1\n"
    _source_ok(source)
    tree = ast.parse(source)
    assert len(tree.body) == 2
    namespace: dict[str, object] = {}
    exec(source, namespace)
    assert _lines(namespace["f"].__doc__) == _lines(f"a\n{text}\nb") + [""]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (math.inf, "math.inf"),
        (-math.inf, "-math.inf"),
        (math.nan, "math.nan"),
        (1e-300, "1e-300"),
        (-0.0, "-0.0"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e308"),
        (3, "3"),
        (True, "True"),
    ],
)
def test_number_literals(value, text):
    assert quote.number(value, "math") == text
    got = eval(text, {"math": math})  # the literal opgen wrote, read back
    assert got == value or (math.isnan(got) and math.isnan(value))
    assert type(got) is type(value)


def test_non_finite_number_without_math_is_an_internal_error():
    with pytest.raises(ValueError):
        quote.number(math.inf)
    assert quote.number(2.5) == "2.5"


def test_literal_of_nested_data():
    data = {"b": [1.0, -math.inf], "a": ("x", None, True), "c": {"\x00": (2,)}}
    text = quote.literal(data, "m")
    assert text == '{"a": ("x", None, True), "b": [1.0, -m.inf], "c": {"\\x00": (2,)}}'
    assert eval(text, {"m": math}) == data


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("ｔｏｒｃｈ", "read by Python as 'torch'"),
        ("µ", "read by Python as 'μ'"),
        ("ﬁle", "read by Python as 'file'"),
        ("ℌx", "read by Python as 'Hx'"),
        ("a-b", "not a Python identifier"),
        ('a"b', "not a Python identifier"),
        ("a\nb", "not a Python identifier"),
        ("", "not a Python identifier"),
        ("class", "keyword"),
        ("_", "keyword"),
        ("__init__", "dunder"),
        ("__x", "name mangling"),
    ],
)
def test_identifier_problems(name, problem):
    found = quote.identifier_problem(name)
    assert found is not None and problem in found


@pytest.mark.parametrize("name", ["torch", "self", "ctx", "super", "len", "α", "x_1", "_x", "match", "type"])
def test_identifiers_that_work(name):
    assert quote.identifier_problem(name) is None


# -- hostile paths -------------------------------------------------------------------------------

RUN = '__import__("pathlib").Path("pwned").touch()'
PATHS = {
    "docstring": f'specs"""+str({RUN})+"""',
    "newline": f"specs\n{RUN}\n",
    "carriage_return": f"specs\r{RUN}\r",
    "line_separator": f"specs\u2028{RUN}\u2028",
    "next_line": f"specs\x85{RUN}\x85",
    "form_feed": f"specs\x0c{RUN}\x0c",
    "jinja": "specs{{ 7 * 7 }}{% raw %}",
    "backslash": "specs\\",
    "not_utf8": os.fsdecode(b"specs\xff\xfe"),  # a lone surrogate in the str path
}
SPEC = """\
name: op
inputs:
  x: Tensor
  a: float = 2.0
outputs:
  y: x * a
"""


@pytest.mark.parametrize("where", ["folder", "file"])
@pytest.mark.parametrize("case", sorted(PATHS))
def test_nothing_runs_from_the_spec_path(tmp_path, monkeypatch, run_cli, case, where):
    monkeypatch.chdir(tmp_path)
    hostile = PATHS[case]
    folder = tmp_path / (hostile if where == "folder" else "specs")
    folder.mkdir()
    spec = folder / ((hostile if where == "file" else "op") + ".yaml")
    spec.write_text(SPEC)
    status, _, err = run_cli("generate", str(folder), "-o", "pkg")
    assert status == 0, err
    assert run_cli("check", str(folder), "-o", "pkg")[0] == 0
    package = import_package(tmp_path, "pkg")
    __import__("pkg.tests.test_op")
    assert not (tmp_path / "pwned").exists()
    x = torch.randn(4, dtype=torch.float64)
    torch.testing.assert_close(package.op(x), 2.0 * x)
    header = (tmp_path / "pkg" / "ops" / "op.py").read_text(encoding="utf-8").split("\n")[0]
    assert header.startswith("# @generated by opgen from ") and header.endswith(" -- do not edit")


# -- hostile doc ------------------------------------------------------------------------------------


def test_doc_text_is_the_docstring_exactly(tmp_path, run_cli):
    text = "name: op\ndoc: " + json.dumps(" | ".join(HOSTILE)) + "\n" + SPEC.split("\n", 1)[1]
    doc = yaml.safe_load(text)["doc"]
    assert "\x00" in doc and "\ud800" in doc and '"""' in doc
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "op.yaml").write_text(text, encoding="utf-8")
    status, _, err = run_cli("generate", str(tmp_path / "specs"), "-o", str(tmp_path / "pkg"))
    assert status == 0, err
    # A lone surrogate in `doc` made `check` call the package stale (exit 1).
    assert run_cli("check", str(tmp_path / "specs"), "-o", str(tmp_path / "pkg"))[0] == 0
    package = import_package(tmp_path, "pkg")
    assert _lines(package.op.__doc__)[: doc.count("\n") + 2] == _lines(doc) + [""]


# -- non-finite numbers ------------------------------------------------------------------------------

NON_FINITE = {
    "clip": """
        name: clip
        inputs:
          x: Tensor
          low: float = -inf
          high: float = 1e999
        outputs:
          y: sigmoid(clamp(x, low, high))
        module:
          args: {low: float = -inf, high: float = inf}
        tests:
          values: {high: inf}
          points: {x: [-inf, 0.5, inf]}
    """,
    "scaled": """
        name: scaled
        inputs:
          x: Tensor
          scale: float = nan
        outputs:
          y: x * scale
        module:
          args: {scale: float = nan}
    """,
}


# -- names (in the same package) ----------------------------------------------------------------------

# Op names and Module names that collide with something the generated code uses for itself.
HOSTILE_OPS = {
    "reference": "module",
    "len": "OP",
    "iter": "DTYPE",
    "super": "TestLayer",
    "zip": "T",
    "isinstance": "harness",
    "tuple": "torch",
    "testing": "pytest",
    "enumerate": "SHAPES",
    "getattr": "args",
    "native": "full",
    "sample_inputs": "params",
    "math": "forward_args",
    "check_shapes": "Reference",
}
NAMED = """
    name: {name}
    inputs:
      x: Tensor
      w: Tensor
      grad_y: Tensor?
      super: float = 2.0
    outputs:
      y: x * w * super + grad_y
    gradients:
      x: grad * w * super
    module:
      name: {module}
      args: {{size: int, super: float = 1.5}}
      parameters: {{w: {{shape: [size], init: ones}}}}
    tests:
      shapes: {{x: [4], w: [4], grad_y: [4]}}
      points: {{x: [0.0, 1.0]}}
"""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """One package of the non-finite and the hostile-name specs (one run of its tests)."""
    root = tmp_path_factory.mktemp("hostile")
    specs = {name: NAMED.format(name=name, module=module) for name, module in HOSTILE_OPS.items()}
    return root, build_ops(root, "hostile_ops", NON_FINITE | specs)


def test_non_finite_defaults_work(hostile):
    _, ops = hostile
    x = torch.linspace(-5, 5, 11, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(ops.clip(x), torch.sigmoid(x))
    torch.testing.assert_close(ops.clip(x, -1.0, 1.0), torch.sigmoid(x.clamp(-1, 1)))
    assert torch.isnan(ops.scaled(x)).all()
    torch.testing.assert_close(ops.scaled(x, 2.0), 2 * x)
    assert ops.Clip().high == math.inf and ops.Clip().low == -math.inf
    assert math.isnan(ops.Scaled().scale)


def test_generated_tests_of_hostile_specs_pass(hostile):
    root, _ = hostile
    source = (root / "hostile_ops" / "tests" / "test_clip.py").read_text()
    assert "math.inf" in source and "import math" in source
    _run_generated_tests(root / "hostile_ops")


def test_places_beyond_float32_print_as_math_inf(tmp_path):
    """The float32 accuracy tests hold other inputs at the domain's edges, rounded to float32."""
    spec = "name: wide\ninputs: {x: Tensor, z: Tensor}\noutputs: {y: 2 * x + z}\ntests: {domain: {z: [-1e39, 1e39]}}"
    build_ops(tmp_path, "wide_ops", {"wide": spec})
    tests = __import__("wide_ops.tests.test_wide").tests.test_wide
    assert tests.PLACES["high"]["z"] == math.inf and tests.PLACES["low"]["z"] == -math.inf


def _run_generated_tests(package: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(package / "tests")],
        cwd=package.parent,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_names_the_generated_code_uses_work_as_op_and_module_names(hostile):
    _, ops = hostile
    x, w, g = (torch.randn(4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    for name, module_name in HOSTILE_OPS.items():
        torch.testing.assert_close(getattr(ops, name)(x, w, g, 3.0), x * w * 3.0 + g)
        module = getattr(ops, module_name)(4)
        torch.testing.assert_close(module(x, g), x * 1.5 + g)
        assert "super=1.5" in repr(module)


def _bound_and_used(source: str) -> tuple[Counter[str], set[str], set[str]]:
    """A module's module-level bindings (with counts), its imported names, and the builtins it
    uses without binding them."""
    bound: Counter[str] = Counter()
    imported: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound[node.name] += 1
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                bound[name] += 1
                imported.add(name)
        elif isinstance(node, ast.Assign):
            bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
    used: set[str] = set()

    def visit(table: symtable.SymbolTable) -> None:
        for symbol in table.get_symbols():
            if symbol.is_referenced() and (symbol.is_global() or table.get_type() == "module"):
                used.add(symbol.get_name())
        for child in table.get_children():
            visit(child)

    visit(symtable.symtable(source, "<generated>", "exec"))
    return bound, imported, {n for n in used if hasattr(builtins, n) and n not in bound}


def test_no_generated_module_shadows_what_it_uses(hostile):
    """No module binds a name twice or rebinds a builtin that modules of its kind use (the
    builtins the golden package's modules use), and no test module imports a name pytest
    would collect."""
    root, _ = hostile
    golden = Path(__file__).resolve().parent.parent / "generated"
    needed: dict[str, set[str]] = {"tests": set(), "ops": set()}
    for path in [*golden.glob("ops/*.py"), *golden.glob("tests/test_*.py")]:
        needed[path.parent.name] |= _bound_and_used(path.read_text())[2]
    assert {"len", "iter", "enumerate", "getattr"} <= needed["tests"]
    for package in (root / "hostile_ops", golden):
        for path in sorted(package.rglob("*.py")):
            bound, imported, _ = _bound_and_used(path.read_text())
            problems = [f"'{name}' is bound {count} times" for name, count in bound.items() if count > 1]
            # Where a module binds an annotation type's name, it writes that type `builtins.X` (Note
            # [typed generated code]; `super` as `builtins.super(Class, cls)`): binding the name is harmless there.
            typed = set(BUILTIN_NAMES) if any(n.startswith("builtins") for n in imported) else set()
            problems += [
                f"rebinds the builtin '{n}'" for n in bound if n in needed.get(path.parent.name, set()) - typed
            ]
            if path.parent.name == "tests":
                problems += [f"pytest collects the imported '{n}'" for n in imported if n.lower().startswith("test")]
            assert not problems, f"{path}: {problems}"


@pytest.mark.parametrize(
    ("name", "extra", "message"),
    [
        ("tests", "", "name 'tests' is the name of the generated package's own module `tests`"),
        ("ops", "", "name 'ops' is the name of the generated package's own module `ops`"),
        ("_shape_checks", "", "own module `_shape_checks`"),
        ("test_relu", "", "pytest would collect `ops/test_relu.py`"),
        ("conftest", "", "pytest loads as its own configuration"),
        ("op", "module: {name: op}", "module.name 'op' is already the name of the op's functional"),
        ("op", "module: {name: OpFunction}", "module.name 'OpFunction' is already the name of the op's Function class"),
        ("op", "module: {name: tests}", "module.name 'tests' is the name of the generated package's own module"),
        ("op", "module: {name: __all__}", "module.name '__all__' is a dunder name"),
        ("op", "module: {name: Ｌａｙｅｒ}", "module.name 'Ｌａｙｅｒ' is read by Python as 'Layer'"),
        ("op", "module: {args: {__n: int}}", "module arg '__n' starts with '__'"),
    ],
)
def test_names_that_cannot_work_are_refused_where_written(tmp_path, name, extra, message):
    (tmp_path / "op.yaml").write_text(f"name: {name}\ninputs:\n  x: Tensor\noutputs:\n  y: x * 2\n{extra}\n")
    result = build([str(tmp_path / "op.yaml")], Renderer())
    report = result.problems.report()
    assert any(message in line for line in report), report
    assert all(line.startswith(f"{tmp_path / 'op.yaml'}:") for line in report)


def test_a_name_python_reads_as_another_is_refused(tmp_path):
    text = textwrap.dedent(
        """\
        name: op
        inputs:
          ｔｏｒｃｈ: Tensor[ｎ]
          torch: float
        outputs:
          y: torch * 2
        """
    )
    (tmp_path / "op.yaml").write_text(text, encoding="utf-8")
    report = build([str(tmp_path / "op.yaml")], Renderer()).problems.report()
    assert f"{tmp_path / 'op.yaml'}:3:3: input name 'ｔｏｒｃｈ' is read by Python as 'torch'" in report[0]


def test_exported_names_are_unique_across_specs(tmp_path):
    (tmp_path / "a.yaml").write_text("name: layer\ninputs:\n  x: Tensor\noutputs:\n  y: x * 2\n")
    (tmp_path / "b.yaml").write_text("name: op\ninputs:\n  x: Tensor\noutputs:\n  y: x * 2\nmodule: {name: layer}\n")
    report = build([str(tmp_path)], Renderer()).problems.report()
    assert len(report) == 1 and "class name 'layer' is already used by" in report[0]
