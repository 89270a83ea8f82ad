"""Snapshot of the messages for bad `gradients:`, `differentiable:` and `tests:` points/native.

The specs are `tests/bad_gradient_specs/*.yaml`; every message must name the file, line
and column of the offending text and say what to do. After an intended change of wording,
refresh with `OPGEN_UPDATE_SNAPSHOTS=1 pytest tests/test_gradient_errors.py` and review the diff.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from opgen.emit.render import Renderer
from opgen.pipeline import build

ROOT = Path(__file__).resolve().parent.parent
CORPUS = sorted((ROOT / "tests" / "bad_gradient_specs").glob("*.yaml"))
SNAPSHOT = ROOT / "tests" / "bad_gradient_specs" / "messages.txt"


def all_messages(monkeypatch) -> str:
    monkeypatch.chdir(ROOT)
    lines = []
    for path in CORPUS:
        result = build([str(path.relative_to(ROOT))], Renderer())
        assert result.problems, f"{path.name} should be rejected"
        lines += result.problems.report()
    return "\n".join(lines) + "\n"


def test_messages_match_snapshot(monkeypatch):
    text = all_messages(monkeypatch)
    if os.environ.get("OPGEN_UPDATE_SNAPSHOTS"):
        SNAPSHOT.write_text(text)
    assert text == SNAPSHOT.read_text()


def test_every_message_is_located(monkeypatch):
    for line in all_messages(monkeypatch).splitlines():
        assert re.match(r"^tests/bad_gradient_specs/\w+\.yaml:\d+:\d+: \S", line), line
