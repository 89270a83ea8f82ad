"""Snapshot of the messages for a corpus of bad specs (`tests/bad_specs/*.yaml`).

Each message was read and judged when the snapshot was written: it must name the file, line
and column of the offending text and say what is wrong. After an intended change of wording,
refresh with `OPGEN_UPDATE_SNAPSHOTS=1 pytest tests/test_bad_specs.py` and review the diff.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from opgen.emit.render import Renderer
from opgen.pipeline import build

HERE = Path(__file__).resolve().parent
CORPUS = sorted((HERE / "bad_specs").glob("*.yaml"))
SNAPSHOT = HERE / "bad_specs" / "messages.txt"


def messages(path: Path) -> list[str]:
    result = build([str(path.relative_to(HERE.parent))], Renderer())
    return result.problems.report()


def all_messages() -> str:
    lines = []
    for path in CORPUS:
        lines += messages(path)
    return "\n".join(lines) + "\n"


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 15


def test_messages_match_snapshot(monkeypatch):
    monkeypatch.chdir(HERE.parent)
    text = all_messages()
    if os.environ.get("OPGEN_UPDATE_SNAPSHOTS"):
        SNAPSHOT.write_text(text, encoding="utf-8")
    assert text == SNAPSHOT.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_every_bad_spec_gets_a_located_message(path, monkeypatch):
    monkeypatch.chdir(HERE.parent)
    found = messages(path)
    assert found, f"{path.name} was accepted"
    for line in found:
        assert re.match(rf"^tests/bad_specs/{re.escape(path.name)}:\d+:\d+: \S", line), line


def test_all_problems_of_a_spec_are_reported_together(monkeypatch):
    monkeypatch.chdir(HERE.parent)
    found = messages(HERE / "bad_specs" / "several_problems.yaml")
    assert len(found) == 3


def test_bad_spec_exits_2_and_writes_nothing(run_cli, tmp_path):
    out = tmp_path / "pkg"
    status, _, err = run_cli("generate", str(HERE / "bad_specs" / "let_cycle.yaml"), "-o", str(out))
    assert status == 2
    assert "depends on itself: a -> b -> a" in err
    assert "Traceback" not in err
    assert not out.exists()
