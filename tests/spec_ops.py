"""Build ops from spec text in a temporary folder, for opgen's own tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

from conftest import import_package

from opgen.emit.render import Renderer
from opgen.pipeline import build
from opgen.write.files import apply, changes


def build_ops(folder: Path, package: str, specs: dict[str, str]):
    """Write each `name: yaml text` spec under `folder`, generate the package `package`, import it."""
    spec_dir = folder / "specs"
    spec_dir.mkdir(parents=True, exist_ok=True)
    for name, text in specs.items():
        (spec_dir / f"{name}.yaml").write_text(textwrap.dedent(text))
    result = build([str(spec_dir)], Renderer(), namespace=package)
    assert not result.problems, result.problems.report()
    out = folder / package
    apply(out, changes(out, result.files))
    return import_package(folder, package)
