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


def assert_located(folder: Path, inputs: str, formula: str, expected: str) -> None:
    """The spec `bad` of `inputs` (a YAML flow mapping) with the output `out: formula` is refused at the
    formula's line with a message holding `expected`."""
    from opgen.pipeline import plan_all

    spec = folder / "bad.yaml"
    spec.write_text(f"name: bad\ninputs: {inputs}\noutputs:\n  out: {formula}\n")
    _, problems = plan_all([str(spec)])
    assert problems.errors, formula
    message = problems.report()[0]
    assert message.startswith(f"{spec}:4:"), message
    assert expected in message, message
