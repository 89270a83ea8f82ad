"""The whole generation, spec paths -> the text of every file of the output package.

The only place that sequences the stages. For each spec: load -> parse -> read its formulas
-> optimize them (the stable rewrites and native kernels, as `optimize:` allows) -> derive
-> optimize the gradients -> choose what to save -> plan -> emit, collecting every problem
of the run. Where the generated tests need it, the formulas are also derived as written,
without any optimization, and handed to the test emitter as the accuracy oracle (Note
[derived twice]). No stage calls another. Pure: reads the spec files, writes nothing
(`opgen.write` does that).

Note [derived twice]
~~~~~~~~~~~~~~~~~~~~
The float32 accuracy tests (`opgen.extremes`) compare the op with the exact value of the
formula *as written*, so that nothing opgen does to a formula can hide in the reference.
The read formulas are therefore derived twice from one reading: once optimized (what the op
computes) and once as written (the oracle). Only specs those tests apply to pay for the
second derivation; for the others it would be unused.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from opgen import limits, quote
from opgen.derive import Derived, derive
from opgen.emit import emit_op, public_names, shape_checks
from opgen.emit_tests import emit_tests
from opgen.errors import Loc, Problems, SpecError, located
from opgen.extremes import applies as needs_oracle
from opgen.load import load_file
from opgen.model import Spec
from opgen.optimize import optimize_formulas, optimize_gradients
from opgen.parse import parse_spec
from opgen.plan import plan
from opgen.printer import PrintError
from opgen.read import read
from opgen.render import Renderer
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


def derive_spec(spec: Spec, problems: Problems, optimized: bool = True) -> Derived | None:
    """`spec` read and derived, optimized as its `optimize:` allows (or as written); None on errors."""
    formulas = read(spec, problems)
    if formulas is None:
        return None
    derived = derive(optimize_formulas(formulas) if optimized else formulas, problems)
    return optimize_gradients(derived) if optimized and derived is not None else derived


def _emit(spec: Spec, renderer: Renderer, result: Result) -> None:
    before = len(result.problems.errors)
    formulas = read(spec, result.problems)
    if formulas is None:
        return
    derived = derive(optimize_formulas(formulas), result.problems)
    if derived is None or len(result.problems.errors) > before:
        return
    derived = choose_saved(optimize_gradients(derived), spec.optimize.policy)
    # Note [derived twice]: the oracle of the accuracy tests; a spec it fails on gets none.
    written = derive(formulas, Problems()) if needs_oracle(spec) else None
    with result.problems.collect(), located(spec.loc, f"generating '{spec.name}'"):
        try:
            op_plan = plan(derived)
            result.files[f"ops/{spec.name}.py"] = emit_op(op_plan, renderer)
            result.files[f"tests/test_{spec.name}.py"] = emit_tests(op_plan, renderer, written)
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
