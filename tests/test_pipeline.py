"""The pipeline sequences the stages: each run once, by the pipeline alone, one direction of
imports, the as-written derivation handed on as data, and tables no module changes behind
another's back."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys

import pytest
import sympy
from conftest import ROOT, as_written

from opgen.derive.guard import guard_branches
from opgen.emit.names import OpNames
from opgen.errors import Problems
from opgen.formula import functions as fn
from opgen.pipeline import run_stages
from opgen.plan.extremes import extreme_rows
from opgen.spec.load import load_text
from opgen.spec.parse import parse_spec

# opgen's stage packages in the order data flows (docs/design.md), then the
# modules that sequence them; a module may import its own stage and earlier ones. `None`: a
# helper of every stage, which imports no stage.
STAGES: dict[str, int | None] = {
    "errors": None,
    "limits": None,
    "parallel": None,  # spreads work over forked processes; knows nothing of specs
    "runtime": None,  # copied into the generated package, imported by no stage
    "nodes": None,  # the node families (Note [nodes] in opgen/nodes/base.py): see NODES_IMPORT
    "spec": 1,
    "formula": 2,
    "records": 2,  # what the stages hand on (Derived, Residual, ...): made of the spec's and the formulas' values
    "derive": 3,
    "optimize": 4,
    "plan": 5,
    "emit": 6,
    "cache": 7,
    "pipeline": 7,
    "write": 8,
    "catalogue": 8,
    "commands": 9,  # the command line's own modules (config, skeleton)
    "cli": 9,
    "__main__": 9,
    "__init__": 9,
}

# What the node families are made of (Note [nodes] in opgen/nodes/base.py): not a stage, every stage
# imports them (the nodes of later stages meet earlier ones in formulas); they import the formula
# language and, for a primitive's derivative (its formula's, rewritten as every derivative is:
# opgen.nodes.kernels), the optimizer's rewrite alone.
NODES_IMPORT = ("opgen.formula", "opgen.nodes", "opgen.optimize.rewrite")


def _imports(path) -> set[str]:
    """The stages (first names under opgen) `path` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "opgen":
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("opgen."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("opgen.")}
    return found


def _stage_of(path) -> str:
    parts = path.relative_to(ROOT / "opgen").parts
    return parts[0] if len(parts) > 1 else path.stem


def test_every_module_is_in_a_stage_package_or_sequences_them():
    stray = [p for p in (ROOT / "opgen").rglob("*.py") if _stage_of(p) not in STAGES]
    assert not stray, "put the module in a stage package, or give it a place in STAGES"


def test_no_module_imports_a_later_stage():
    wrong = []
    for path in sorted((ROOT / "opgen").rglob("*.py")):
        if _stage_of(path) == "nodes":
            continue  # test_the_node_families_import_the_formula_language_and_the_rewrite_alone
        stage = STAGES[_stage_of(path)]
        for used in _imports(path):
            used_stage = STAGES[used]
            if used_stage is not None and (stage is None or used_stage > stage):
                wrong.append(f"{path.relative_to(ROOT)} (stage {stage}) imports {used} (stage {used_stage})")
    assert not wrong


# The functions the stages run from: `opgen.pipeline.run_stages` calls each once, in order.
ENTRY_POINTS = {
    "opgen.formula.read": {"read"},
    "opgen.optimize.passes": {"optimize_formulas", "optimize_gradients", "optimize_tangents"},
    "opgen.derive.gradients": {"derive", "forward_only"},
    "opgen.derive.jvp": {"derive_jvp"},
    "opgen.optimize.save": {"choose_saved"},
    "opgen.plan.backward": {"plan"},
}


def test_only_the_pipeline_runs_a_stage():
    """No stage calls another: a stage's entry point is imported by the pipeline alone."""
    wrong = []
    for path in sorted((ROOT / "opgen").rglob("*.py")):
        if path.name == "pipeline.py" and path.parent.name == "opgen":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in ENTRY_POINTS:
                used = {alias.name for alias in node.names} & ENTRY_POINTS[node.module]
                wrong += [f"{path.relative_to(ROOT)} imports {node.module}.{name}" for name in sorted(used)]
    assert not wrong


def test_the_save_stage_differentiates_nothing():
    """Save chooses among what derive differentiated (Note [parts of the outputs] in opgen.derive.parts)."""
    for name in ("save.py", "save_tensors.py"):
        tree = ast.parse((ROOT / "opgen" / "optimize" / name).read_text(encoding="utf-8"))
        used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        used |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert not used & {"diff", "real_diff", "tensor_gradient", "derive_jvp"}, name


def _modules(path) -> set[str]:
    """The opgen modules (dotted) `path` imports from."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "opgen":
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "opgen"}
    return found


def test_the_node_families_import_the_formula_language_and_the_rewrite_alone():
    wrong = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sorted((ROOT / "opgen" / "nodes").glob("*.py"))
        for module in sorted(_modules(path))
        if not any(module == allowed or module.startswith(allowed + ".") for allowed in NODES_IMPORT)
    ]
    assert not wrong
    assert len(list((ROOT / "opgen" / "nodes").glob("*.py"))) > 3


def test_emit_imports_nothing_of_derive_or_optimize():
    """Emit reads what the earlier stages made through the plan, the records and the nodes (opgen/records.py,
    opgen/nodes/): never derives or optimizes."""
    wrong = [
        f"{path.relative_to(ROOT)} imports {used}"
        for path in sorted((ROOT / "opgen" / "emit").rglob("*.py"))
        for used in sorted(_imports(path) & {"derive", "optimize"})
    ]
    assert not wrong


# What only the stages before emit may run on formulas: common-subexpression elimination, rewrites to
# stable forms, simplification, which statement is a backward kernel (emit prints what the plan holds:
# opgen.plan.blocks shares the parts, opgen.plan.kernel_calls finds the kernels).
DECIDING = {"cse", "stable_form", "stable_forms", "simplify", "rewrite", "share", "backward_kernel", "kernel_factors"}


def test_emit_runs_no_cse_and_no_rewrite():
    wrong = []
    for path in sorted((ROOT / "opgen" / "emit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in DECIDING:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not wrong


def test_importing_the_rewrites_changes_no_table_of_the_guard():
    script = (
        "import opgen.derive.guard as g; before = dict(g.DOMAINS); "
        "import opgen.optimize.rewrite, opgen.optimize.lower; assert g.DOMAINS == before, set(g.DOMAINS) - set(before)"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_function_of_a_later_stage_is_guarded_by_its_own_domain():
    from opgen.optimize.product_rules import sinc

    x = sympy.Symbol("x", real=True)
    guarded = guard_branches(fn.where(x > 1, sinc(x), 0), frozenset([x]))
    assert guarded == fn.where(x > 1, sinc(fn.where(x > 1, x, 1)), 0)


def _spec(text: str):
    problems = Problems()
    spec = parse_spec(load_text(text, "op.yaml"), "specs/op.yaml", problems)
    assert spec is not None, problems.report()
    return spec


def _stages(spec, stop_after: str = "plan"):
    stages = run_stages(spec, Problems(), stop_after)
    assert stages is not None
    return stages


def test_the_accuracy_rows_come_from_the_derivation_handed_on():
    """The test plan evaluates the derivation the pipeline gives it, never one of its own."""
    spec = _spec("name: op\ninputs:\n  x: Tensor\noutputs:\n  y: log(1 + exp(x))\n")
    other = _spec("name: op\ninputs:\n  x: Tensor\noutputs:\n  y: 2 * x\n")
    rows = extreme_rows(spec, _stages(other, "derive").oracle)
    assert rows and all(values == (2 * point,) and slope == 2 for _, point, values, slope, _ in rows)
    assert extreme_rows(spec, None) == []


def test_the_oracle_is_derived_as_written_and_the_op_optimized():
    spec = _spec("name: op\ninputs:\n  x: Tensor\noutputs:\n  y: log(1 + exp(x))\n")
    stages = _stages(spec, "derive")
    written, optimized = stages.oracle, stages.derived
    assert written is not None and optimized is not None
    assert not written.full.outputs[0][1].has(fn.softplus)
    assert optimized.full.outputs[0][1] != written.full.outputs[0][1]


def test_a_pipeline_stopped_after_a_stage_ran_exactly_the_stages_before_it():
    spec = _spec("name: op\ninputs:\n  x: Tensor\noutputs:\n  y: x - tanh(x)\n")
    read, derived, saved, planned = (_stages(spec, stage) for stage in ("read", "derive", "save", "plan"))
    assert read.optimized is None and derived.gradients is None and saved.planned is None
    assert derived.derived == planned.derived and saved.residuals == planned.residuals
    assert [r.name for r in planned.residuals] == ["saved_tanh"] and planned.planned is not None
    assert planned.planned.plan.residuals == planned.residuals and planned.planned.plan.derived == planned.saved
    with pytest.raises(AssertionError):
        run_stages(spec, Problems(), "emit")


def test_the_names_of_an_op_module_are_given_by_keyword():
    """Sixteen names in a row are easy to give in the wrong order; `OpNames` takes keywords only."""
    fields = [f.name for f in dataclasses.fields(OpNames)]
    with pytest.raises(TypeError):
        OpNames(*fields)  # type: ignore[misc]
    names = OpNames(**{name: name for name in fields})  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        names.ctx = "other"  # type: ignore[misc]


AS_WRITTEN = [
    "log(1 + exp(x))",  # rewritten to softplus: the oracle differs from the op
    "x * sigmoid(x) + log(1 + exp(-x)) * y",
    "where(x > 0, x, exp(x) - 1) * y",
    "sqrt(x**2 + 1) - x",
]


@pytest.mark.parametrize("formula", AS_WRITTEN)
def test_the_oracle_reads_the_formulas_as_written_without_differentiating_them(formula, monkeypatch):
    """The rows of the pipeline's plan are those of the full derivation as written, yet the
    as-written formulas are derived once at most (Note [derived twice]): only the op's are."""
    import opgen.derive.gradients as gradients
    from opgen.pipeline import plan_spec

    spec = _spec(f"name: op\ninputs:\n  x: Tensor\n  y: Tensor\noutputs:\n  z: {formula}\n")
    expected = extreme_rows(spec, _stages(as_written(spec), "derive").derived)
    derived: list[object] = []
    original = gradients.derive

    def counting(formulas, problems):
        derived.append(formulas)
        return original(formulas, problems)

    monkeypatch.setattr(gradients, "derive", counting)
    planned = plan_spec(spec, Problems())
    assert planned is not None and planned.rows == tuple(expected) and expected
    assert len(derived) == 1, "the formulas as written are inlined for the oracle, not differentiated"


def test_the_design_page_has_a_row_for_every_module():
    """docs/design.md lists every module of opgen/, one row each, and no module that is gone."""
    page = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(opgen/[\w/]+\.py)` \|", page, re.M))
    listed = {m for m in listed if not m.endswith("__init__.py")}  # packages are rows of the table above
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "opgen").rglob("*.py") if p.name[:2] != "__"}
    assert modules - listed == set(), "add a row to docs/design.md for each"
    assert listed - modules == set(), "drop the rows of modules that are gone"
