"""The whole generation, spec paths -> the text of every file of the output package.

The only place that sequences the stages. For each spec: load -> parse -> read its formulas
-> optimize them (the stable rewrites and native kernels, as `optimize:` allows) -> derive
-> optimize the gradients -> choose what to save -> the tangents of forward mode, derived from
the saved gradients and rewritten (Note [tangents after save] in opgen.derive.jvp) -> plan
-> emit, collecting every problem of the run. `run_stages` runs the stages up to plan, each
once, in that order (`STAGES`); a test may stop it after one and read what the stages made.
Where the generated tests need it, the formulas are also derived as written, without any
optimization, and handed to the test emitter as the accuracy oracle (Note [derived twice]).
No stage calls another. Pure: reads the spec files, writes nothing (`opgen.write.files` does
that).

Note [derived twice]
~~~~~~~~~~~~~~~~~~~~
The float32 accuracy tests (`opgen.plan.extremes`) compare the op with the exact value of the
formula *as written*, so that nothing opgen does to a formula can hide in the reference.
The read formulas are therefore used twice from one reading: derived optimized (what the op
computes), and as written (the oracle). The oracle reads only the outputs, in terms of the
inputs (its slopes are difference quotients of them, never opgen's gradients), so the formulas
as written are only inlined (`forward_only`), not differentiated. Only specs those tests apply
to pay for it, and only when the optimizations changed a formula: otherwise the derivation
before the gradients are rewritten serves as the oracle.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import opgen
from opgen import limits
from opgen.cache import Cache, Entry
from opgen.emit.render import Renderer
from opgen.errors import Loc, Problems, SpecError, located
from opgen.formula.words import REDUCTIONS
from opgen.parallel import default_jobs, run_all
from opgen.spec import native, quote
from opgen.spec.load import load_file
from opgen.spec.model import Spec
from opgen.spec.parse import parse_spec

if TYPE_CHECKING:
    from opgen.derive.gradients import Derived
    from opgen.formula.read import Formulas
    from opgen.optimize.save import Residual
    from opgen.plan.backward import Plan
    from opgen.plan.extremes import Row


@dataclass
class Result:
    files: dict[str, str] = field(default_factory=dict)  # path inside the package -> text
    problems: Problems = field(default_factory=Problems)
    specs: list[Spec] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # `FILE:LINE:COL: warning: ...`, in spec order


def find_spec_files(args: list[str], problems: Problems) -> list[tuple[Path, str]]:
    """Each SPEC argument is a file or a folder of `*.yaml`; returns (path, display name)."""
    found: list[tuple[Path, str]] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            entries = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and not p.is_dir())
            # A link to nothing or a pipe named like a spec is reported as when it is given directly.
            files = [(p, str(Path(arg) / p.name)) for p in entries if _spec_file(p, str(Path(arg) / p.name), problems)]
            if not entries:
                problems.add(SpecError(Loc(arg, 1, 1), "the folder has no *.yaml spec files"))
            found += files
        elif _spec_file(path, arg, problems):
            found.append((path, arg))
    return found


def _spec_file(path: Path, shown: str, problems: Problems) -> bool:
    """Whether `path` (not a folder) is a regular file to read; else a located problem about it."""
    if path.is_file():
        return True
    if path.is_symlink() and not path.exists():
        problems.add(SpecError(Loc(shown, 1, 1), f"a link to nothing ({os.readlink(path)}): no spec file or folder"))
    elif path.exists():  # a pipe or a device: reading one could wait for ever
        problems.add(SpecError(Loc(shown, 1, 1), "not a regular file or a folder; give a spec file or a folder"))
    else:
        problems.add(SpecError(Loc(shown, 1, 1), "no such spec file or folder"))
    return False


def source_name(path: Path) -> str:
    """How generated headers name a spec: its folder and file (`specs/swish.yaml`), never an absolute path."""
    resolved = path.resolve()
    return f"{resolved.parent.name}/{resolved.name}" if resolved.parent.name else resolved.name


# Note [stages imported on use]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The stages from `read` on import SymPy, which takes half a second. A run whose every spec
# is served from the cache (Note [generation cache] in opgen/cache.py) never needs them, so
# the functions below import them when they first run, not this module when it is imported.


STAGES = ("read", "optimize formulas", "derive", "optimize gradients", "save", "plan")


@dataclass(frozen=True)
class Planned:
    """One spec through every stage before emit: the plan of its op, and what the oracle (the spec
    derived as written, Note [derived twice]) says of its tests."""

    plan: Plan
    rows: tuple[Row, ...] = ()  # the float32 accuracy tests' exact rows (`opgen.plan.extremes`)
    warnings: tuple[str, ...] = ()  # `FILE:LINE:COL: warning: ...`: tests bound to fail (`opgen.plan.domain`)


@dataclass(frozen=True)
class Stages:
    """What the stages made of one spec, each field from the stage `STAGES` names in its comment,
    as far as they ran (`run_stages`: the generation runs them all; a test may stop after one)."""

    formulas: Formulas  # read
    optimized: Formulas | None = None  # optimize formulas: what the op computes
    derived: Derived | None = None  # derive: the gradients of `optimized`
    oracle: Derived | None = None  # derive: the formulas as written, for the accuracy tests (Note [derived twice])
    gradients: Derived | None = None  # optimize gradients
    saved: Derived | None = None  # save: the gradients as they read what forward keeps
    residuals: tuple[Residual, ...] = ()  # save: what forward returns for backward only
    planned: Planned | None = None  # plan


def run_stages(spec: Spec, problems: Problems, stop_after: str = "plan", oracle: bool = True) -> Stages | None:
    """`spec` through the stages, in order, each once, up to `stop_after` (one of `STAGES`); None if a
    problem was recorded. `oracle`: also read the formulas as written where the generated tests need
    them (Note [derived twice])."""
    from opgen.derive.gradients import derive, forward_only  # Note [stages imported on use]
    from opgen.derive.jvp import derive_jvp
    from opgen.formula.read import read
    from opgen.optimize.passes import optimize_formulas, optimize_gradients, optimize_tangents
    from opgen.optimize.save import choose_saved
    from opgen.plan.backward import plan
    from opgen.plan.domain import domain_warnings, extreme_warnings
    from opgen.plan.extremes import Oracle, extreme_rows
    from opgen.plan.extremes import applies as needs_oracle

    assert stop_after in STAGES, stop_after
    before = len(problems.errors)
    formulas = read(spec, problems)
    if formulas is None:
        return None
    if stop_after == "read":
        return Stages(formulas)
    optimized = optimize_formulas(formulas)
    if stop_after == "optimize formulas":
        return Stages(formulas, optimized)
    derived = derive(optimized, problems)
    if derived is None or len(problems.errors) > before:
        return None
    # Note [derived twice]: the oracle of the accuracy tests; a spec it fails on gets none.
    written = None
    if oracle and needs_oracle(spec):
        unchanged = optimized.definitions == formulas.definitions and optimized.overrides == formulas.overrides
        with contextlib.suppress(SpecError):
            written = derived if unchanged else forward_only(formulas)
    if stop_after == "derive":
        return Stages(formulas, optimized, derived, written)
    gradients = optimize_gradients(derived)
    if stop_after == "optimize gradients":
        return Stages(formulas, optimized, derived, written, gradients)
    saved, residuals = choose_saved(gradients, spec.optimize.policy)
    if stop_after == "save":
        return Stages(formulas, optimized, derived, written, gradients, saved, residuals)
    with problems.collect(), located(spec.loc, f"generating '{spec.name}'"):
        # Forward mode from the same (rewritten, saved) gradients as backward (Note [tangents after save]).
        tangents = optimize_tangents(derive_jvp(saved, tuple((r.name, r.expr) for r in residuals)), saved)
        compiled = Oracle(written) if written is not None else None  # compiled once for rows and warnings
        rows = tuple(extreme_rows(spec, written, compiled))
        found = domain_warnings(spec, written, compiled, saved)
        if compiled is not None:  # Note [rows no form can pass] in opgen.plan.domain
            at_extremes, rows = extreme_warnings(spec, rows, compiled, saved, residuals)
            found += at_extremes
        warnings = tuple(f"{loc}: warning: {message}" for loc, message in found)
        planned = Planned(plan(saved, residuals, tangents), rows, warnings)
        return Stages(formulas, optimized, derived, written, gradients, saved, residuals, planned)
    return None


def plan_spec(spec: Spec, problems: Problems, oracle: bool = True) -> Planned | None:
    """The plan of one spec's op, through every stage up to emit (`run_stages`); None if a problem was recorded."""
    stages = run_stages(spec, problems, oracle=oracle)
    return stages.planned if stages is not None else None


def generate(spec: Spec, renderer: Renderer, problems: Problems) -> Entry | None:
    """The files of one spec, through every stage; None if a problem was recorded in `problems`."""
    from opgen.emit.forward import shape_checks  # Note [stages imported on use]
    from opgen.emit.op import emit_op
    from opgen.emit.printer import PrintError
    from opgen.emit.tests import emit_tests

    planned = plan_spec(spec, problems)
    if planned is None:
        return None
    with problems.collect(), located(spec.loc, f"generating '{spec.name}'"):
        try:
            files = {
                f"ops/{spec.name}.py": emit_op(planned.plan, renderer),
                f"tests/test_{spec.name}.py": emit_tests(planned.plan, renderer, planned.rows),
            }
        except (PrintError, OverflowError) as error:  # OverflowError: a number beyond float64
            raise SpecError(spec.loc, f"cannot generate torch code: {error}") from None
        return Entry(files, bool(shape_checks(spec)), planned.warnings)
    return None


def import_stages() -> None:
    """Import the stages `generate` runs (Note [stages imported on use]). Called outside any
    spec's time budget: half a second of importing SymPy is no spec's cost, and an import
    interrupted halfway would leave a module half made."""
    stages = ("formula.read", "optimize.passes", "derive.gradients", "derive.jvp", "optimize.save", "plan.backward")
    for stage in stages:
        importlib.import_module(f"opgen.{stage}")
    for stage in ("plan.extremes", "plan.domain", "emit.op", "emit.tests", "emit.printer"):
        importlib.import_module(f"opgen.{stage}")


def _spec(path: Path, display: str, exported: dict[str, Loc], result: Result) -> Spec | None:
    """The spec at `path`, recorded in `result`; its exported names must be new (`exported` gains them)."""
    spec = parse_spec(load_file(path, display), source_name(path), result.problems)
    if spec is None:
        return None
    for what, name in zip(("op name", "class name", "class name"), spec.public_names, strict=False):
        if name in exported:
            raise SpecError(spec.loc, f"{what} '{name}' is already used by {exported[name]}")
    exported |= {name: spec.loc for name in spec.public_names}
    result.specs.append(spec)
    return spec


def _parsed(
    args: list[str], result: Result, policy: str | None, fuse: bool, form: str | None = None, namespace: str = ""
) -> Iterator[tuple[Spec, Loc, float]]:
    """Each spec of `args`, parsed (recorded in `result`), with `policy`/`fuse` and its form
    (`_with_form`) applied, where its errors are reported and what is left of its time budget."""
    exported: dict[str, Loc] = {}  # every name the package exports: functionals and classes
    for path, display in find_spec_files(args, result.problems):
        spec, seconds = None, limits.budget_seconds()
        with result.problems.collect(), limits.budget(Loc(display, 1, 1), seconds):
            spec = _spec(path, display, exported, result)
        if spec is None:
            continue
        if policy is not None or fuse:
            chosen = replace(spec.optimize, policy=policy or spec.optimize.policy, fuse=fuse or spec.optimize.fuse)
            spec = replace(spec, optimize=chosen)
        with result.problems.collect():
            spec = _with_form(spec, form, namespace)
        if spec is not None and (problem := native.shape_problem(spec, REDUCTIONS)):
            result.problems.add(problem)  # Note [native output shapes]
            spec = None
        if spec is not None:
            yield spec, Loc(display, 1, 1), seconds


# A worker first compiles the templates and fills SymPy's caches, which costs about what
# generating a few specs does: fewer specs than this per worker are generated here, serially.
SPECS_PER_WORKER = 4


@dataclass(frozen=True)
class _Job:
    """A spec the cache did not have: where its entry goes, and where its problems go among the run's."""

    index: int  # in the run's entries, in spec order
    spec: Spec
    where: Loc
    seconds: float
    key: str
    at: int  # len(problems.errors) when the spec was parsed: a serial run reports its problems there


def _size(spec: Spec) -> int:
    """About how long generating `spec` takes, in no unit: its formulas' length, once per Tensor input
    and once more (each Tensor input has its gradient and its rows of extreme inputs)."""
    length = sum(len(let.formula.text) for let in spec.lets) + sum(len(o.formula.text) for o in spec.outputs)
    return length * (1 + len(spec.tensor_inputs))


def _generate_job(job: _Job, renderer: Renderer, cache: Cache | None) -> tuple[Entry | None, list[tuple[Loc, str]]]:
    """`generate` one spec under its budget, in a worker or here (`opgen.parallel`), and store it in
    `cache` (from the workers, side by side); its problems as (location, message) pairs, which pickle
    where a `SpecError` does not."""
    problems = Problems()
    entry = None
    with problems.collect(), limits.budget(job.where, job.seconds):
        entry = generate(job.spec, renderer, problems)
    if entry is not None and cache is not None:
        cache.put(job.key, entry)
    return entry, [(error.loc, error.message) for error in problems.errors]


def _generate_all(
    todo: list[_Job],
    renderer: Renderer,
    cache: Cache | None,
    jobs: int | None,
    progress: Callable[[int, int, str], None] | None,
) -> list[tuple[Entry | None, list[tuple[Loc, str]]]]:
    """Each job's entry and problems, in `todo`'s order, from up to `jobs` workers (`build`)."""
    import_stages()  # before the workers fork: they start with the stages imported
    workers = jobs if jobs is not None else min(default_jobs(), len(todo) // SPECS_PER_WORKER)
    # Largest first, so that no large spec is left to run alone at the end (the results come back in spec order).
    order = sorted(range(len(todo)), key=lambda j: -_size(todo[j].spec))
    finished: list[int] = []

    def report(i: int) -> None:
        finished.append(i)
        if progress is not None:
            progress(len(finished), len(todo), todo[order[i]].spec.name)

    results = run_all(
        lambda i: _generate_job(todo[order[i]], renderer, cache), len(todo), max(workers, 1), finished=report
    )
    return [results[order.index(j)] for j in range(len(todo))]


def build(
    args: list[str],
    renderer: Renderer,
    policy: str | None = None,
    fuse: bool = False,
    cache: Cache | None = None,
    form: str | None = None,
    namespace: str = "",
    jobs: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> Result:
    """Generate every spec.

    `policy`, when given, replaces each spec's `optimize.policy`; `fuse` sets `optimize.fuse`;
    `form` is the form of specs without `form:` (default `function`), `namespace` the
    torch.library namespace of `custom_op`-form ops (the package name, or `--namespace`).
    With a `cache`, a spec generated before with the same opgen is not generated again.
    The specs the cache lacks are generated in up to `jobs` worker processes (default: one per
    core, `$OPGEN_JOBS`, with `SPECS_PER_WORKER` specs at least for each; `opgen.parallel`); the
    result is the same, in the same order, as a serial run's. `progress(done, total, name)` is called
    as each spec the cache lacked is generated, in the order they finish.
    """
    result = Result()
    entries: list[Entry | None] = []
    todo: list[_Job] = []
    for spec, where, seconds in _parsed(args, result, policy, fuse, form, namespace):
        key = cache.key(spec) if cache is not None else ""
        entry = cache.get(key, {f"ops/{spec.name}.py", f"tests/test_{spec.name}.py"}) if cache is not None else None
        if entry is None:
            todo.append(_Job(len(entries), spec, where, seconds, key, len(result.problems.errors)))
        entries.append(entry)
    if todo:
        done = _generate_all(todo, renderer, cache, jobs, progress)
        for job, (entry, errors) in reversed(list(zip(todo, done, strict=True))):
            result.problems.errors[job.at : job.at] = [SpecError(loc, message) for loc, message in errors]
            entries[job.index] = entry
    shape_checked = False  # some op uses the package's `_shape_checks.py`
    for entry in entries:
        if entry is not None:
            result.files.update(entry.files)
            result.warnings.extend(entry.warnings)
            shape_checked |= entry.shape_checks
    if not result.problems:
        with result.problems.collect():  # a user's template fails at its own line (opgen.emit.render)
            result.files.update(package_files(result.specs, renderer, shape_checked))
    return result


def plan_all(args: list[str], policy: str | None = None, fuse: bool = False) -> tuple[list[Planned], Problems]:
    """The plan of every spec's op, as `build` makes it, without emitting anything (`opgen show`;
    a custom_op-form spec is planned as any other: the form changes only how the op is printed)."""
    result = Result()
    planned: list[Planned] = []
    for spec, where, seconds in _parsed(args, result, policy, fuse, namespace="show"):
        import_stages()
        with result.problems.collect(), limits.budget(where, seconds):
            one = plan_spec(spec, result.problems, oracle=False)
            if one is not None:
                planned.append(one)
    return planned, result.problems


def _with_form(spec: Spec, form: str | None, namespace: str) -> Spec | None:
    """`spec` in its form: its own `form:`, else the run's; a `custom_op` one with its namespace."""
    from opgen.emit.custom_op import namespace_problem

    spec = replace(spec, form=spec.form or form or "function")
    if not spec.custom_op:
        return spec
    if problem := namespace_problem(namespace):
        raise SpecError(
            spec.loc,
            f"form custom_op: the namespace '{namespace}' (the package name unless --namespace says) {problem}; "
            "pass --namespace NAME",
        )
    if spec.optimize.fuse:  # torch.compile'd kernels inside a custom op's kernel crash torch 2.13's fake-tensor checks
        raise SpecError(spec.loc, "form custom_op cannot be fused (optimize.fuse / --fuse); drop one of the two")
    return replace(spec, namespace=namespace)


def package_files(specs: list[Spec], renderer: Renderer, shape_checked: bool) -> dict[str, str]:
    """The package's own files; `shape_checked`: some op calls the shared `_shape_checks.py`."""
    specs = sorted(specs, key=lambda s: s.name)
    imports = []
    exported: list[str] = []
    for spec in specs:
        names = [spec.function_class_name, spec.name] + ([spec.module.name] if spec.module else [])
        imports.append(f"from .ops.{spec.name} import {', '.join(sorted(names))}")
        exported += names
    sources = ", ".join(sorted({s.source.split("/")[0] + "/" for s in specs})) or "no specs"
    doc = quote.docstring(
        [
            f"Custom autograd ops generated by opgen {opgen.__version__} from {sources}.",
            "",
            f"The package needs only torch, a release in {opgen.TORCH_REQUIREMENT.removeprefix('torch')}.",
        ],
        indent=0,
    )
    versions = {"opgen": opgen.__version__, "torch": opgen.TORCH_REQUIREMENT.removeprefix("torch")}
    init = renderer.render("init.py.j2", imports=imports, exported=sorted(exported), doc=doc, versions=versions)
    marker = "# @generated by opgen -- do not edit\n"
    files = {
        "__init__.py": init,
        "ops/__init__.py": marker + '"""One module per op; import them from the package."""\n',
        "tests/__init__.py": marker + '"""Generated tests: run `pytest` on this folder."""\n',
        "tests/harness.py": renderer.runtime("harness"),
        "tests/accuracy.py": renderer.runtime("accuracy"),
        "_runtime.py": renderer.runtime("machinery"),
    }
    # Where a user installs the package's own requirement from (`pip install -r OUT/requirements.txt`).
    files["requirements.txt"] = (
        f"{marker}# What this package needs; its tests in tests/ also need pytest.\n{opgen.TORCH_REQUIREMENT}\n"
    )
    if shape_checked:
        # Beside `ops/`, not in it: no op module can have its name.
        files["_shape_checks.py"] = renderer.runtime("shape_checks")
    # Every package: a function-form op with a gradient override defines its custom op for torch.export.
    files["_custom_ops.py"] = renderer.runtime("custom_ops")
    return files
