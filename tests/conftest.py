"""Shared helpers for opgen's own tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
GENERATED = ROOT / "generated"

SWISH = """\
name: swish
inputs:
  x: Tensor
  beta: float = 1.0
outputs:
  y: x / (1 + exp(-beta * x))
"""  # the smallest spec, as the format page writes it


def as_written(spec):
    """`spec` with its rewrites and lowering off: the one pipeline (`opgen.pipeline.run_stages`)
    then derives its formulas as they are written."""
    from dataclasses import replace

    return replace(spec, optimize=replace(spec.optimize, rewrite=False, lower=False))


def pytest_configure(config: pytest.Config) -> None:
    """No test reads or writes the user's generation cache, in this process or a child: each
    run generates afresh, so a test that changes opgen in memory sees its change. The cache's
    own tests give it a folder of their own."""
    os.environ["OPGEN_CACHE_DIR"] = ""


@pytest.fixture(scope="session")
def golden():
    """`specs/` generated once per test run (the pipeline's `Result`): the golden comparison and
    every test that needs the whole library's output share it."""
    from opgen.emit.render import Renderer
    from opgen.pipeline import build

    result = build([str(SPECS)], Renderer())
    assert not result.problems, result.problems.report()
    return result


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """Run `opgen ARGS...` in this process from `cwd`; returns (exit status, stdout, stderr)."""
    from opgen.cli import main

    def run(*args: str, cwd: Path | None = None) -> tuple[int, str, str]:
        if cwd is not None:
            monkeypatch.chdir(cwd)
        try:
            status = main(list(args))
        except SystemExit as exit:  # argparse errors and --help
            status = int(exit.code or 0)
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    return run


def import_package(path: Path, name: str):
    """Import the generated package at `path/name` freshly (evicting an earlier import of that name)."""
    import importlib

    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]
    sys.path.insert(0, str(path))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(path))


def generated_tests(tmp_path: Path, name: str, text: str):
    """The generated test module of the spec `text` (op `name`), in a package `pkg_<name>` under `tmp_path`."""
    import importlib

    from opgen.cli import main

    specs = tmp_path / "specs"
    specs.mkdir(parents=True, exist_ok=True)
    (specs / f"{name}.yaml").write_text(text)
    package = f"pkg_{name}"
    assert main(["generate", str(specs / f"{name}.yaml"), "-o", str(tmp_path / package)]) == 0
    import_package(tmp_path, package)
    return importlib.import_module(f"{package}.tests.test_{name}")


def run_generated_tests(tests) -> list[str]:
    """Run every `test_*` function of a generated test module; their names."""
    names = sorted(n for n in vars(tests) if n.startswith("test_"))
    assert names
    for name in names:
        getattr(tests, name)()
    return names


def generate_op(folder: Path, text: str) -> str:
    """The source opgen writes for the spec `text` (named `op`), generated in memory."""
    from opgen.emit.render import Renderer
    from opgen.pipeline import build

    (folder / "op.yaml").write_text(text)
    result = build([str(folder / "op.yaml")], Renderer())
    assert not result.problems, result.problems.report()
    return result.files["ops/op.py"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A skipped test is a failure: every test here runs on the machine CI has (no GPU needed, no
    network, no optional package), so a skip only ever hides a check that stopped running."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} was skipped ({report.longrepr}): make it run, or drop it"
