"""The console command ends without the interpreter's teardown (Note [quick exit] in opgen/cli.py),
yet as a normal exit would: its status, everything it printed (to a pipe, block-buffered), the
exit handlers other tools register with `atexit`, and the files it wrote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

SCRIPT = """
import atexit, sys
atexit.register(lambda: print("exit handler ran", file=sys.stderr))
from opgen.cli import run
sys.argv = ["opgen", *sys.argv[1:]]
run()
"""


def _opgen(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OPGEN_CACHE_DIR": ""}
    command = [sys.executable, "-c", SCRIPT, *args]
    return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("verbose", [False, True])
def test_generate_exits_with_its_status_output_and_exit_handlers(tmp_path, verbose):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "swish.yaml").write_text((ROOT / "specs" / "swish.yaml").read_text("utf-8"), "utf-8")
    done = _opgen(tmp_path, "generate", "specs/swish.yaml", "-o", "out", *(["-v"] if verbose else []))
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("out: 1 ops, 11 files changed\n"), done.stdout
    if verbose:
        assert "out/ops/swish.py: written" in done.stdout
    assert "exit handler ran" in done.stderr
    assert (tmp_path / "out" / "ops" / "swish.py").read_text("utf-8") == (
        ROOT / "generated" / "ops" / "swish.py"
    ).read_text("utf-8")


def test_a_bad_spec_exits_2_with_its_located_message(tmp_path):
    (tmp_path / "op.yaml").write_text("name: op\ninputs: {x: Tensor}\noutputs:\n  y: x * sqrt(-1)\n", encoding="utf-8")
    done = _opgen(tmp_path, "generate", "op.yaml", "-o", "out")
    assert done.returncode == 2
    assert done.stderr.startswith("op.yaml:4:10: ") and "sqrt(-1)" in done.stderr
    assert "exit handler ran" in done.stderr and not (tmp_path / "out").exists()
