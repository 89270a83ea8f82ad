"""Fuzz tests: random formulas, mutated specs, hostile names and paths (issue: trust).

Every run of opgen must exit 0 or 2, print only `FILE:LINE:COL: ...` messages, finish in
time, leave OUT byte-identical when it refuses and write nothing outside OUT
(`fuzz_sandbox.check_run`); every op it generates from a random legal formula must equal
plain torch autograd of the same formula, values and first and second derivatives, in
float64 (`fuzz_check`), also under torch.func (jacrev, jacfwd, hessian, vmap of grad, vmap over
the last dimension) and with views as inputs (`fuzz_funcs`), as a module's parameters
(`fuzz_modules`) and under torch.compile (`fuzz_compile`: one example in CI); importing a
generated package runs nothing.

CI runs a fixed, derandomized set of examples in well under a minute. A longer run:

    OPGEN_FUZZ_EXAMPLES=2000 OPGEN_FUZZ_SEED=7 .venv/bin/python -m pytest -q tests/test_fuzz.py

(`OPGEN_FUZZ_COLLECT=FILE` appends every failure to FILE as JSON lines and keeps going
instead of stopping at the first; `OPGEN_FUZZ_SECONDS` is the time limit of one run.)
"""

from __future__ import annotations

import base64
import json
import keyword
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fuzz_hostile import DOCS, NAMES, PATHS, mutated_specs
from fuzz_modules import module_case
from fuzz_sandbox import Reply, Sandbox, Worker, check_run, payload, snapshot
from fuzz_specs import Case, cases, spec_text
from hypothesis import HealthCheck, Phase, assume, event, given, note, seed, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("OPGEN_FUZZ_EXAMPLES", "0"))  # 0: the CI numbers below
SEED = os.environ.get("OPGEN_FUZZ_SEED")
COLLECT = os.environ.get("OPGEN_FUZZ_COLLECT")


def fuzz(ci_examples: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Hypothesis settings: CI's fixed examples, or OPGEN_FUZZ_EXAMPLES with OPGEN_FUZZ_SEED."""

    def apply(test: Callable[..., None]) -> Callable[..., None]:
        test = settings(
            max_examples=EXAMPLES or ci_examples,
            deadline=None,
            derandomize=SEED is None,
            database=None,
            # Shrinking replays a failing case many times; worth it only when someone reads the result.
            phases=[Phase.explicit, Phase.generate] + ([Phase.shrink] if EXAMPLES and not COLLECT else []),
            suppress_health_check=list(HealthCheck),
        )(test)
        return seed(int(SEED))(test) if SEED is not None else test

    return apply


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    base = tmp_path_factory.mktemp("fuzz")
    worker = Worker(base / "worker.log")
    try:
        yield Sandbox(base, worker)
    finally:
        worker.stop()


def _record(kind: str, spec: str, message: str, case: Case | None = None) -> None:
    """One JSON line; `case` (a formula case) as base64 pickle, to replay with `fuzz_check.check_case`."""
    record = {"kind": kind, "spec": spec, "message": message}
    if case is not None:
        record["case"] = base64.b64encode(pickle.dumps(case)).decode("ascii")
    with open(COLLECT, "a") as f:  # type: ignore[arg-type]
        f.write(json.dumps(record) + "\n")


def _property(lab: Sandbox, kind: str, spec: str, body: Callable[[], None], case: Case | None = None) -> None:
    """Run one case's checks; with OPGEN_FUZZ_COLLECT a failure is written down instead of raised."""
    note(spec)
    try:
        body()
    except AssertionError as failure:
        if COLLECT is None:
            raise AssertionError(f"{failure}\n--- spec ---\n{spec}") from None
        _record(kind, spec, str(failure), case)
        event(f"failure: {str(failure).splitlines()[0][:60]}")
    finally:
        lab.reset()


def _generate(
    lab: Sandbox, files: dict[str, bytes], argv: list[str], prepare: Callable[[Path], None] | None = None
) -> tuple[Path, Path, int, dict[str, Any]]:
    """Write `files` into a fresh case folder, run `opgen generate ARGV... -o OUT`, check property A."""
    root, out = lab.case()
    if prepare is not None:
        prepare(out)
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    before = snapshot(root)
    reply = lab.worker.call("fuzz_worker", "run_cli", ["generate", *argv, "-o", out.name], cwd=root)
    status = check_run(reply, root, out, before, files, lab)
    if status == 2:
        first = reply.value["err"].splitlines()[0]
        event("refused: " + first.split(": ", 1)[-1][:70])
        if COLLECT:
            _record("refused", next(iter(files.values())).decode("utf-8", "replace"), reply.value["err"])
    return root, out, status, reply.value


def _agrees(lab: Sandbox, root: Path, out: Path, case: Case) -> None:
    reply = lab.worker.call("fuzz_check", "check_case", str(root), out.name, case, cwd=root)
    assert reply.kind == "ok", f"the generated op crashed: {_crash(reply)}"
    problems = reply.value["problems"]
    assert not problems, "the generated op disagrees with plain autograd of the formula:\n" + "\n".join(problems)
    for n in reply.value["notes"]:
        event("not compared: " + n)
    assert not lab.intruders(), f"importing or calling the op had side effects: {lab.intruders()}"


def _crash(reply: Reply) -> str:
    """The exception and the generated line that raised it, first; the whole traceback after."""
    if reply.kind != "error":
        return f"{reply.kind}: {reply.value}"
    lines = str(reply.value).rstrip().splitlines()
    generated = [line.strip() for line in lines if f"{os.sep}ops{os.sep}" in line or "__init__.py" in line]
    where = f" ({generated[-1]})" if generated else ""
    return f"{lines[-1]}{where}\n{reply.value}"


def _formula_case(lab: Sandbox, case: Case) -> None:
    text = spec_text(case)

    def body() -> None:
        root, out, status, _ = _generate(lab, {"specs/op.yaml": text.encode("utf-8", "surrogatepass")}, ["specs"])
        if status == 0:
            _agrees(lab, root, out, case)
        lab.finish(root)

    _property(lab, "formula", text, body, case)


@fuzz(ci_examples=40)
@given(case=cases(dims=False))
def test_random_elementwise_formulas_agree_with_autograd(lab: Sandbox, case: Case) -> None:
    _formula_case(lab, case)


@fuzz(ci_examples=30)
@given(case=cases(dims=True))
def test_random_tensor_formulas_agree_with_autograd(lab: Sandbox, case: Case) -> None:
    _formula_case(lab, case)


@fuzz(ci_examples=5)
@given(case=cases(dims=False, depth=2), held=st.integers(1, 2))
def test_random_modules_agree_with_autograd(lab: Sandbox, case: Case, held: int) -> None:
    """A `module:` holding some Tensor inputs of a random formula as parameters, its numbers as attributes:
    parameters as declared, values and gradients through functional_call and .backward() (`fuzz_modules`)."""
    made = module_case(case, held)
    assume(made is not None)  # one Tensor input, or an override: draw again
    assert made is not None
    case, params = made
    text = spec_text(case)

    def body() -> None:
        root, out, status, _ = _generate(lab, {"specs/op.yaml": text.encode()}, ["specs"])
        if status == 0:
            reply = lab.worker.call("fuzz_modules", "check_module", str(root), out.name, case, params, cwd=root)
            assert reply.kind == "ok", f"the generated module crashed: {_crash(reply)}"
            assert not reply.value, "the module disagrees with plain autograd of the formula:\n" + "\n".join(
                reply.value
            )
        lab.finish(root)

    _property(lab, "module", text, body, case)


@fuzz(ci_examples=1)
@given(case=cases(dims=None, depth=2))
def test_random_ops_under_torch_compile(lab: Sandbox, case: Case) -> None:
    """torch.compile(fullgraph=False) of the op, values and gradients against the op itself (`fuzz_compile`)."""
    text = spec_text(case)

    def body() -> None:
        root, out, status, _ = _generate(lab, {"specs/op.yaml": text.encode()}, ["specs"])
        if status == 0:
            reply = lab.worker.call("fuzz_compile", "check_compiled", str(root), out.name, case, cwd=root, timeout=300)
            assert reply.kind == "ok", f"the compiled op crashed: {_crash(reply)}"
            assert not reply.value, "the compiled op disagrees with the op:\n" + "\n".join(reply.value)
        lab.finish(root)

    _property(lab, "compile", text, body, case)


@fuzz(ci_examples=15)
@given(case=cases(pool=tuple(n for n in NAMES if n not in ("N", "K", "M")), depth=1), doc=st.sampled_from(DOCS))
def test_hostile_names_and_docs(lab: Sandbox, case: Case, doc: str) -> None:
    """Names that shadow builtins, torch or generated internals work or are refused; docs stay text."""
    case = Case(**{**case.__dict__, "doc": doc.replace("{PAYLOAD}", payload(lab, "doc"))})
    _formula_case(lab, case)


@fuzz(ci_examples=30)
@given(mutated=mutated_specs())
def test_mutated_specs_are_refused_with_a_location_or_work(lab: Sandbox, mutated: tuple[str, bytes]) -> None:
    name, data = mutated

    def body() -> None:
        root, out, status, _ = _generate(lab, {f"specs/{name}": data}, [f"specs/{name}"])
        if status == 0:
            reply = lab.worker.call("fuzz_worker", "smoke", str(root), out.name, f"specs/{name}", cwd=root)
            assert reply.kind == "ok" and not reply.value, f"the op generated from the spec fails: {_crash(reply)}"
            assert not lab.intruders(), f"side effects: {lab.intruders()}"
        lab.finish(root)

    _property(lab, "mutation", data.decode("utf-8", "backslashreplace"), body)


SIMPLE = "name: {name}\ninputs:\n  x: Tensor\n  a: float = 0.5\noutputs:\n  y: a * x * sigmoid(x)\n"


@fuzz(ci_examples=10)
@given(
    folder=st.sampled_from(PATHS),
    file=st.sampled_from(PATHS),
    by_folder=st.booleans(),
    nested=st.booleans(),
)
def test_hostile_spec_paths_run_nothing(lab: Sandbox, folder: str, file: str, by_folder: bool, nested: bool) -> None:
    """A spec's folder and file name reach generated headers and docstrings; importing must run nothing.

    With `nested`, OUT also holds another opgen package, which opgen must not touch."""
    folder = folder.replace("{PAYLOAD}", payload(lab, "folder"))
    file = file.replace("{PAYLOAD}", payload(lab, "file")) + ".yaml"
    rel = f"{folder}/{file}"

    def body() -> None:
        files = {rel: SIMPLE.format(name="hostile").encode()}
        vendored = lab.baseline / "out"
        prepare = (lambda out: shutil.copytree(vendored, out / "vendor" / "generated")) if nested else None
        root, out, status, _ = _generate(lab, files, [folder if by_folder else rel], prepare)
        if nested:
            assert snapshot(out / "vendor" / "generated") == snapshot(vendored), "opgen changed a package inside OUT"
        if status == 0:
            reply = lab.worker.call("fuzz_worker", "smoke", str(root), out.name, str(root / rel), cwd=root)
            assert reply.kind == "ok" and not reply.value, f"the generated package fails: {_crash(reply)}"
            assert not lab.intruders(), f"importing the package ran code: {lab.intruders()}"
        lab.finish(root)

    header = f"# spec at {rel!r}, nested package in OUT: {nested}\n"
    _property(lab, "path", header + SIMPLE.format(name="hostile"), body)


@pytest.mark.parametrize("package", ["class", "torch", "lambda"])
def test_out_names_that_cannot_be_imported_are_refused(lab: Sandbox, package: str, tmp_path: Path) -> None:
    """`-o DIR` names the package: a keyword, or a module the package imports itself, cannot work."""
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "op.yaml").write_text(SIMPLE.format(name="op"))
    reply = lab.worker.call("fuzz_worker", "run_cli", ["generate", "specs", "-o", package], cwd=tmp_path)
    assert reply.kind == "ok" and reply.value["escaped"] is None, reply
    if reply.value["status"] == 2:
        assert "-o" in reply.value["err"]
        return
    assert not keyword.iskeyword(package), f"-o {package}: generated a package that `import {package}` cannot load"
    code = f"import {package}, torch; {package}.op(torch.ones(3))"
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, timeout=120)
    assert result.returncode == 0, f"-o {package}: the package does not import:\n{result.stderr.decode()[-2000:]}"
