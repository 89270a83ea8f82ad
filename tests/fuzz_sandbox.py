"""Where fuzz cases run, and the checks every run of opgen must pass (property A).

`Worker` runs jobs in a separate, long-lived process (`fuzz_worker`) with a time limit: a
run that does not end is killed and reported, never a stuck test run. `Sandbox` gives each
case a fresh folder under one base, with an OUT that already holds an opgen package and a
user's file, and a sentinel folder that hostile payloads try to write into.
`check_run` asserts what the README promises of any run: exit 0 or 2, nothing escaping
as a traceback, every message `FILE:LINE:COL: ...`, OUT byte-identical after a refusal,
the user's file kept, and nothing written outside OUT.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import select
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuzz_worker import HEADER

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SECONDS = float(os.environ.get("OPGEN_FUZZ_SECONDS", "10"))  # longest acceptable opgen run
USER_FILE = "NOTES_FROM_THE_USER.txt"
LOCATED = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): \S")
SUMMARY = re.compile(r"^opgen: (\d+ problems?; nothing was written|error: .+)$")
USAGE = re.compile(r"^(usage: opgen |opgen \w+: error: )")  # argparse's own report of a bad argument


@dataclass
class Reply:
    kind: str  # ok, error (the job raised; value is the traceback), hang, crash (the worker died)
    value: Any
    seconds: float


class Worker:
    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        # opgen's own time budget (half the run limit) must refuse a costly spec, located, before the limit.
        budget = os.environ.get("OPGEN_BUDGET", f"{SECONDS / 2:g}")
        path = os.pathsep.join([str(ROOT), str(TESTS)])
        env = dict(os.environ, PYTHONPATH=path, PYTHONHASHSEED="0", OPGEN_BUDGET=budget)
        with open(self.log, "ab") as log:
            return subprocess.Popen(
                [sys.executable, str(TESTS / "fuzz_worker.py")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=str(self.log.parent),
                env=env,
            )

    def call(self, module: str, function: str, *args: Any, cwd: Path, timeout: float = SECONDS) -> Reply:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        data = pickle.dumps((module, function, args, str(cwd)))
        start = time.monotonic()
        try:
            self.proc.stdin.write(HEADER.pack(len(data)) + data)
            self.proc.stdin.flush()
            header = self._read(HEADER.size, start + timeout)
            if header is None:
                return Reply("hang", None, time.monotonic() - start)
            body = self._read(HEADER.unpack(header)[0], start + timeout + 5)
        except (BrokenPipeError, EOFError) as error:
            return self._crashed(start, error)
        if body is None:
            return Reply("hang", None, time.monotonic() - start)
        kind, value = pickle.loads(body)
        return Reply(kind, value, time.monotonic() - start)

    def _crashed(self, start: float, error: Exception) -> Reply:
        code = self.proc.wait() if self.proc is not None else None
        self.proc = None
        return Reply("crash", f"the worker died ({error!r}, exit status {code})", time.monotonic() - start)

    def _read(self, count: int, deadline: float) -> bytes | None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        chunks = b""
        while len(chunks) < count:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            if not ready:
                self.stop()
                return None
            chunk = os.read(fd, count - len(chunks))
            if not chunk:
                raise EOFError("end of the worker's output")
            chunks += chunk
        return chunks

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def snapshot(folder: Path, skip: Path | None = None) -> dict[str, str]:
    """Every path under `folder` (not following links) with a digest of its content."""
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        if skip is not None and (here == skip or skip in here.parents):
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in dirnames + filenames:
            path = here / name
            if skip is not None and path == skip:
                continue
            rel = os.fsencode(path.relative_to(folder)).decode("utf-8", "backslashreplace")
            if path.is_symlink():
                found[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                found[rel] = "dir"
            else:
                found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


class Sandbox:
    """A base folder for a whole test session: one folder per case, a baseline OUT, a sentinel."""

    def __init__(self, base: Path, worker: Worker) -> None:
        self.base = base
        self.worker = worker
        self.sentinel = base / "sentinel"
        self.sentinel.mkdir()
        self.count = 0
        self.baseline = base / "baseline"
        (self.baseline / "specs").mkdir(parents=True)
        (self.baseline / "specs" / "baseline_op.yaml").write_text(
            "name: baseline_op\ninputs:\n  x: Tensor\noutputs:\n  y: x * sigmoid(x)\n"
        )
        reply = worker.call("fuzz_worker", "run_cli", ["generate", "specs", "-o", "out"], cwd=self.baseline)
        assert reply.kind == "ok" and reply.value["status"] == 0, reply
        (self.baseline / "out" / USER_FILE).write_text("a file of the user's; opgen must leave it alone\n")
        self.top = set(os.listdir(base))

    def case(self) -> tuple[Path, Path]:
        """A fresh case folder and its OUT (a copy of the baseline package), named uniquely for imports."""
        self.count += 1
        root = self.base / f"case{self.count}"
        root.mkdir()
        out = root / f"pkg{self.count}"
        shutil.copytree(self.baseline / "out", out, symlinks=True)
        return root, out

    def finish(self, root: Path) -> None:
        shutil.rmtree(root, ignore_errors=True)

    def reset(self) -> None:
        """Clear what a failed case left in the sentinel folder or the base, so the next case starts clean."""
        for name in os.listdir(self.sentinel):
            (self.sentinel / name).unlink()
        for name in os.listdir(self.base):
            if name not in self.top and not name.startswith("case"):
                path = self.base / name
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()

    def intruders(self) -> list[str]:
        """What appeared in the sentinel folder or at the top of the base: effects outside every case."""
        found = [f"sentinel/{n}" for n in os.listdir(self.sentinel)]
        found += [n for n in os.listdir(self.base) if n not in self.top and not n.startswith("case")]
        return found


def payload(sandbox: Sandbox, tag: str) -> str:
    """Python code that creates `sentinel/tag` when run; it holds no `/`, so it fits in a file name."""
    target = (sandbox.sentinel / tag).as_posix().encode().hex()
    return f'__import__("os").system("touch "+bytes.fromhex("{target}").decode())'


def check_run(
    reply: Reply, root: Path, out: Path, before: dict[str, str], specs: dict[str, bytes], sandbox: Sandbox
) -> int:
    """Property A for one run of opgen; returns its exit status (0 or 2)."""
    assert reply.kind != "hang", f"opgen did not finish within {SECONDS:.0f} s"
    assert reply.kind == "ok", f"the fuzz worker failed: {reply.value}"
    run = reply.value
    escaped = run["escaped"]
    assert escaped is None, f"an exception escaped opgen: {escaped.rstrip().splitlines()[-1]}\n{escaped}"
    text = run["out"] + run["err"]
    assert "Traceback (most recent call last)" not in text, "a traceback was printed:\n" + text
    assert "internal error" not in text, "an internal error instead of a message about the spec:\n" + run["err"]
    assert run["status"] in (0, 2), f"exit status {run['status']!r}:\n{text}"
    assert run["seconds"] < SECONDS, f"opgen took {run['seconds']:.1f} s"
    _check_messages(run["err"], specs)
    after = snapshot(root)
    if run["status"] == 2:
        assert after == before, "a refused run changed files: " + _diff(before, after)
    else:
        outside_before = {k: v for k, v in before.items() if not _under(root / k, out)}
        outside_after = {k: v for k, v in after.items() if not _under(root / k, out)}
        assert outside_after == outside_before, "a run wrote outside OUT: " + _diff(outside_before, outside_after)
        user = os.fsencode((out / USER_FILE).relative_to(root)).decode("utf-8", "backslashreplace")
        assert after.get(user) == before.get(user), "the user's file in OUT was changed or deleted"
    assert not sandbox.intruders(), f"side effects outside the case folder: {sandbox.intruders()}"
    return int(run["status"])


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _diff(before: dict[str, str], after: dict[str, str]) -> str:
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return ", ".join(f"{k} ({'new' if k not in before else 'gone' if k not in after else 'changed'})" for k in changed)


def _check_messages(err: str, specs: dict[str, bytes]) -> None:
    usage = False
    for line in err.splitlines():
        usage = bool(USAGE.match(line)) or (usage and line.startswith(" "))
        if SUMMARY.match(line) or usage:
            continue
        match = LOCATED.match(line)
        assert match, f"a message without FILE:LINE:COL: {line!r}\nall of stderr:\n{err}"
        row, col = int(match["line"]), int(match["col"])
        assert row >= 1 and col >= 1, f"a location before the start of the file: {line!r}"
        source = specs.get(match["file"])
        if source is not None:
            # Lines as YAML counts them: `\r\n`, a lone `\r` and NEL/LS/PS end a line too.
            rows = len(re.split("\r\n|[\r\n\x85\u2028\u2029]", source.decode("utf-8", "replace")))
            assert row <= rows + 1, f"line {row} of a {rows}-line spec: {line!r}"
