"""opgen's version and the torch range: one source each, stated by the CLI and by every generated package."""

from __future__ import annotations

import ast

import tomllib
import torch
from conftest import GENERATED, ROOT

import opgen


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_version_is_pyprojects():
    assert opgen.__version__ == _pyproject()["project"]["version"]


def test_the_torch_range_is_the_one_pyproject_declares():
    dependencies = [d.replace(" ", "") for d in _pyproject()["project"]["dependencies"]]
    assert opgen.TORCH_REQUIREMENT in dependencies


def test_the_pinned_torch_is_inside_the_range():
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith("torch==")]
    assert len(pins) == 1
    pinned = tuple(int(p) for p in pins[0].removeprefix("torch==").split(".")[:2])
    installed = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    low = tuple(int(p) for p in opgen.TORCH_REQUIREMENT.split(">=")[1].split(",")[0].split("."))
    high = int(opgen.TORCH_REQUIREMENT.split("<")[1])
    assert low <= pinned and pinned[0] < high
    assert installed == pinned, "the tests run on the pinned release"


def test_the_generated_package_states_both():
    source = (GENERATED / "__init__.py").read_text(encoding="utf-8")
    namespace = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in ("__opgen_version__", "__torch_requires__")
    }
    assert namespace["__opgen_version__"] == opgen.__version__
    assert "torch" + str(namespace["__torch_requires__"]) == opgen.TORCH_REQUIREMENT
    assert f"opgen {opgen.__version__}" in source.split('"""')[1]


def test_version_flag(run_cli):
    status, out, _ = run_cli("--version")
    assert status == 0 and out.strip() == f"opgen {opgen.__version__} (generated code: {opgen.TORCH_REQUIREMENT})"
