"""Build ops from spec text in a temporary folder, for opgen's own tests."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

from opgen.pipeline import build
from opgen.render import Renderer
from opgen.write import apply, changes


def build_ops(folder: Path, package: str, specs: dict[str, str]):
    """Write each `name: yaml text` spec under `folder`, generate the package `package`, import it."""
    spec_dir = folder / "specs"
    spec_dir.mkdir(parents=True, exist_ok=True)
    for name, text in specs.items():
        (spec_dir / f"{name}.yaml").write_text(textwrap.dedent(text))
    result = build([str(spec_dir)], Renderer())
    assert not result.problems, result.problems.report()
    out = folder / package
    apply(out, changes(out, result.files))
    for module in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[module]
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(package)
    finally:
        sys.path.remove(str(folder))


def problems_of(folder: Path, name: str, text: str) -> list[str]:
    """The error messages opgen reports for one spec, with paths relative to `folder`."""
    path = folder / f"{name}.yaml"
    path.write_text(textwrap.dedent(text))
    result = build([str(path)], Renderer())
    return [line.replace(str(folder) + "/", "") for line in result.problems.report()]
