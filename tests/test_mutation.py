"""The generated tests fail on a wrong op: each kind of mistake, made in a generated op, is caught.

Ops are generated from `specs/` into a temporary package; each mutation rewrites one op's source
(a parameter ignored, an extra output returned, a gradient scaled, a term of a gradient dropped),
and the op's own generated tests run in this process against the mutated package. The unmutated
package passes them all, so a failure is the mutation's doing.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SPECS, import_package

from opgen.cli import main

PARAMETERS = ("swish", "softplus", "elu", "grad_reverse", "clip_grad", "hardtanh", "leaky_relu")
OUTPUTS = ("swish", "softplus", "elu", "grad_reverse", "clip_grad", "tanhshrink", "linear", "quantize_ste")
SCALED = ("swish", "softplus", "elu", "grad_reverse", "clip_grad", "tanhshrink", "linear", "bilinear")
TERMS = ("swish", "silu", "mish", "focal_loss", "sinc", "cosine_similarity", "rbf_kernel")
NAMES = sorted(set(PARAMETERS + OUTPUTS + SCALED + TERMS))

Mutation = Callable[[ast.Module, str], bool]  # edits the op module's tree in place; False: not applicable


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A package generated from the specs the mutations use; returns its folder."""
    root = tmp_path_factory.mktemp("mutation")
    specs = root / "specs"
    specs.mkdir()
    for name in NAMES:
        shutil.copy(SPECS / f"{name}.yaml", specs / f"{name}.yaml")
    assert main(["generate", str(specs), "-o", str(root / "base")]) == 0
    return root / "base"


def _functional(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _backward(tree: ast.Module) -> ast.FunctionDef:
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "backward")


def _number_defaults(function: ast.FunctionDef) -> dict[str, ast.expr]:
    """The functional's arguments with a number default (the non-tensor inputs), and the default."""
    args = function.args.args[len(function.args.args) - len(function.args.defaults) :]
    pairs = zip(args, function.args.defaults, strict=True)
    return {a.arg: d for a, d in pairs if not (isinstance(d, ast.Constant) and d.value is None)}


def ignore_parameter(tree: ast.Module, name: str) -> bool:
    """The functional uses each non-tensor argument's default, whatever it is given."""
    function = _functional(tree, name)
    defaults = _number_defaults(function)
    fixed = [ast.Assign([ast.Name(arg, ast.Store())], default, lineno=0) for arg, default in defaults.items()]
    function.body[1:1] = fixed  # after the docstring
    return bool(fixed)


def ignore_parameter_in_backward(tree: ast.Module, name: str) -> bool:
    """Backward reads each non-tensor argument's default instead of the value forward got."""
    defaults = _number_defaults(_functional(tree, name))
    changed = False
    for node in ast.walk(_backward(tree)):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and node.value.attr in defaults:
            node.value = defaults[node.value.attr]
            changed = True
    return changed


def extra_output(tree: ast.Module, name: str) -> bool:
    """The functional returns one more tensor than the spec's outputs (its first input)."""
    function = _functional(tree, name)
    ret = function.body[-1]
    assert isinstance(ret, ast.Return) and ret.value is not None
    first = ast.Name(function.args.args[0].arg, ast.Load())
    if isinstance(ret.value, ast.Tuple):
        ret.value.elts.append(first)
    else:
        ret.value = ast.Tuple([ret.value, first], ast.Load())
    return True


def _scale_gradient(factor: float) -> Mutation:
    def scale(tree: ast.Module, name: str) -> bool:
        """The first gradient backward returns, multiplied by `factor`."""
        backward = _backward(tree)
        ret = backward.body[-1]
        assert isinstance(ret, ast.Return) and ret.value is not None
        first = ret.value.elts[0] if isinstance(ret.value, ast.Tuple) else ret.value
        assert isinstance(first, ast.Name)
        scaled = ast.parse(f"{first.id} = None if {first.id} is None else {first.id} * {factor}").body[0]
        backward.body.insert(len(backward.body) - 1, scaled)
        return True

    return scale


def drop_term(tree: ast.Module, name: str) -> bool:
    """The first sum or difference computed in backward loses its second term."""
    for statement in _backward(tree).body:
        for node in ast.walk(statement):
            for field, value in ast.iter_fields(node):
                if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add | ast.Sub):
                    setattr(node, field, value.left)
                    return True
                if isinstance(value, list):
                    for k, item in enumerate(value):
                        if isinstance(item, ast.BinOp) and isinstance(item.op, ast.Add | ast.Sub):
                            value[k] = item.left
                            return True
    return False


def _failures(root: Path, package: str, name: str) -> list[str]:
    """Runs the generated tests of op `name` in `root/package`; returns the names of those that fail."""
    import_package(root, package)
    tests = importlib.import_module(f"{package}.tests.test_{name}")
    failed = []
    for test in sorted(n for n in vars(tests) if n.startswith("test_")):
        patch = pytest.MonkeyPatch()
        # The generated autouse fixture: every test runs through the Function (Note [small calls]).
        for value in vars(tests).values():
            if isinstance(value, type) and "native_below" in vars(value):
                patch.setattr(value, "native_below", 0)
        function = getattr(tests, test)
        try:
            function(*(patch for p in inspect.signature(function).parameters if p == "monkeypatch"))
        except Exception:  # noqa: BLE001 - any failure of a generated test counts
            failed.append(test)
        finally:
            patch.undo()
    return failed


def _mutated(package: Path, tmp_path: Path, name: str, mutation: Mutation) -> tuple[Path, str] | None:
    """A copy of `package` with op `name` mutated, as (folder, package name); None if not applicable."""
    source = (package / "ops" / f"{name}.py").read_text()
    tree = ast.parse(source)
    if not mutation(tree, name):
        return None
    copy = tmp_path / f"mutant_{name}"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    text = ast.unparse(ast.fix_missing_locations(tree))
    assert text != ast.unparse(ast.parse(source))
    (copy / "ops" / f"{name}.py").write_text(text)
    return tmp_path, copy.name


def test_the_correct_ops_pass(package: Path):
    for name in NAMES:
        assert _failures(package.parent, package.name, name) == [], name


@pytest.mark.parametrize(
    ("mutation", "names"),
    [
        (ignore_parameter, PARAMETERS),
        (ignore_parameter_in_backward, ("swish", "softplus", "elu", "grad_reverse", "clip_grad", "hardtanh")),
        (extra_output, OUTPUTS),
        (_scale_gradient(1.01), SCALED),
        (_scale_gradient(2.0), SCALED),
        (drop_term, TERMS),
    ],
    ids=["ignore-parameter", "ignore-parameter-in-backward", "extra-output", "scale-1.01", "scale-2", "drop-term"],
)
def test_a_mutated_op_fails_its_generated_tests(package: Path, tmp_path: Path, mutation: Mutation, names: tuple[str]):
    survivors = []
    for name in names:
        mutated = _mutated(package, tmp_path, name, mutation)
        assert mutated is not None, f"{name}: the mutation does not apply"
        if not _failures(*mutated, name):
            survivors.append(name)
    assert not survivors, f"the generated tests of {survivors} pass on the mutated op"
