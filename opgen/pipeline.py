"""The whole generation, spec paths -> the text of every file of the output package.

Runs load -> parse -> derive -> save -> plan -> emit for each spec, collecting every problem
of the run; `derive` applies the stable rewrites (`opgen.rewrite`) and the lowering to native
kernels (`opgen.lower`) to each formula before differentiating, as the spec's `optimize:`
allows. Pure: reads the spec files, writes nothing (`opgen.write` does that).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import sympy
from sympy import Expr

from opgen import limits, quote
from opgen.derive import Rewrite, derive
from opgen.emit import emit_op, public_names, shape_checks
from opgen.emit_tests import emit_tests
from opgen.errors import Loc, Problems, SpecError, located
from opgen.load import load_file
from opgen.lower import lower
from opgen.model import Spec
from opgen.parse import parse_spec
from opgen.plan import plan
from opgen.printer import PrintError
from opgen.render import Renderer
from opgen.rewrite import rewrite, rewrite_gradients
from opgen.save import choose_saved


@dataclass
class Result:
    files: dict[str, str] = field(default_factory=dict)  # path inside the package -> text
    problems: Problems = field(default_factory=Problems)
    specs: list[Spec] = field(default_factory=list)


def find_spec_files(args: list[str], problems: Problems) -> list[tuple[Path, str]]:
    """Each SPEC argument is a file or a folder of `*.yaml`; returns (path, display name)."""
    found: list[tuple[Path, str]] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
            if not files:
                problems.add(SpecError(Loc(arg, 1, 1), "the folder has no *.yaml spec files"))
            found += [(p, str(Path(arg) / p.name)) for p in files]
        elif path.is_file():
            found.append((path, arg))
        else:
            problems.add(SpecError(Loc(arg, 1, 1), "no such spec file or folder"))
    return found


def source_name(path: Path) -> str:
    """How generated headers name a spec: its folder and file (`specs/swish.yaml`), never an absolute path."""
    resolved = path.resolve()
    return f"{resolved.parent.name}/{resolved.name}" if resolved.parent.name else resolved.name


def _optimizer(spec: Spec) -> Rewrite:
    """What `derive` does to each formula before differentiating it, as `optimize:` says."""

    def optimize(expr: Expr, numbers: frozenset[sympy.Symbol]) -> Expr:
        if spec.optimize.rewrite:
            expr = rewrite(expr)
        if spec.optimize.lower:
            expr = lower(expr, numbers)
        return expr

    return optimize


def _emit(spec: Spec, renderer: Renderer, result: Result) -> None:
    before = len(result.problems.errors)
    derived = derive(spec, result.problems, _optimizer(spec))
    if derived is None or len(result.problems.errors) > before:
        return
    if spec.optimize.rewrite:
        derived = rewrite_gradients(derived)
    derived, residuals = choose_saved(derived, spec.optimize.policy)
    with result.problems.collect(), located(spec.loc, f"generating '{spec.name}'"):
        try:
            op_plan = plan(derived, residuals)
            result.files[f"ops/{spec.name}.py"] = emit_op(op_plan, renderer)
            result.files[f"tests/test_{spec.name}.py"] = emit_tests(op_plan, renderer)
        except PrintError as error:
            raise SpecError(spec.loc, f"cannot generate torch code: {error}") from None


def build(args: list[str], renderer: Renderer, policy: str | None = None, fuse: bool = False) -> Result:
    """Generate every spec.

    `policy`, when given, replaces each spec's `optimize.policy`; `fuse` sets `optimize.fuse`.
    """
    result = Result()
    exported: dict[str, Loc] = {}  # every name the package exports: functionals and classes
    for path, display in find_spec_files(args, result.problems):
        with result.problems.collect(), limits.budget(Loc(display, 1, 1)):
            spec = parse_spec(load_file(path, display), source_name(path), result.problems)
            if spec is None:
                continue
            for what, name in zip(("op name", "class name", "class name"), public_names(spec), strict=False):
                if name in exported:
                    raise SpecError(spec.loc, f"{what} '{name}' is already used by {exported[name]}")
            exported |= {name: spec.loc for name in public_names(spec)}
            result.specs.append(spec)
            if policy is not None or fuse:
                chosen = replace(spec.optimize, policy=policy or spec.optimize.policy, fuse=fuse or spec.optimize.fuse)
                spec = replace(spec, optimize=chosen)
            _emit(spec, renderer, result)
    if not result.problems:
        result.files.update(package_files(result.specs, renderer))
    return result


def package_files(specs: list[Spec], renderer: Renderer) -> dict[str, str]:
    specs = sorted(specs, key=lambda s: s.name)
    imports = []
    exported: list[str] = []
    for spec in specs:
        names = [spec.function_class_name, spec.name] + ([spec.module.name] if spec.module else [])
        imports.append(f"from .ops.{spec.name} import {', '.join(sorted(names))}")
        exported += names
    sources = ", ".join(sorted({s.source.split("/")[0] + "/" for s in specs})) or "no specs"
    doc = quote.docstring([f"Custom autograd ops generated by opgen from {sources}."], indent=0)
    init = renderer.render("init.py.j2", imports=imports, exported=sorted(exported), doc=doc)
    marker = "# @generated by opgen -- do not edit\n"
    files = {
        "__init__.py": init,
        "ops/__init__.py": marker + '"""One module per op; import them from the package."""\n',
        "tests/__init__.py": marker + '"""Generated tests: run `pytest` on this folder."""\n',
        "tests/harness.py": renderer.render("harness.py.j2"),
    }
    if any(shape_checks(spec) for spec in specs):
        # Beside `ops/`, not in it: no op module can have its name.
        files["_shape_checks.py"] = renderer.render("shape_checks.py.j2")
    return files
