"""Package trees for the write tests: snapshots, a package with the user's files, the kill loop.

Kept apart from `test_write.py` (no pytest, no sympy) so the kill loop's process stays small.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from opgen.write import files as write
from opgen.write import swap


def tree(folder: Path) -> dict[str, str]:
    """Every entry under `folder` (files with their text, links with their target, empty folders)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if "__pycache__" in path.parts:
            continue
        if path.is_symlink():
            found[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            found[rel] = path.read_text(encoding="utf-8")
        elif not any(path.iterdir()):
            found[rel] = "<empty folder>"
    return found


def mtimes(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.lstat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def with_user_files(out: Path, files: dict[str, str]) -> Path:
    """`out` generated from `files`, with the user's files and a nested opgen package inside."""
    write.generate(out, files)
    (out / "notes.txt").write_text("mine\n")
    (out / "ops" / "helper.py").write_text("# my helper\n")
    (out / "tests" / "conftest.py").write_text("# my conftest\n")
    (out / "data").mkdir()
    os.symlink("notes.txt", out / "notes_link")
    write.generate(out / "nested", {"__init__.py": f"{write.MARKER}\n", "ops/x.py": f"{write.MARKER}\nX = 1\n"})
    return out


def leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}.opgen-"))


CHILD_STEPS = ("link", "symlink", "mkdir", "rename", "replace", "unlink", "rmdir", "chmod", "chown", "ftruncate")


def _child(out: Path, files: dict[str, str], kill_at: int, fallback: bool) -> None:
    """In a forked child: count every change to the filesystem, SIGKILL before the `kill_at`-th."""
    count = 0

    def step() -> None:
        nonlocal count
        count += 1
        if count == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def counted(function):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            step()
            return function(*args, **kwargs)

        return wrapper

    for name in CHILD_STEPS:
        setattr(os, name, counted(getattr(os, name)))
    real_open = os.open
    os.open = lambda path, flags, *a, **k: (
        (step() if flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR) else None) or (real_open(path, flags, *a, **k))
    )
    swap._exchange = (lambda a, b: False) if fallback else counted(swap._exchange)
    try:
        write.generate(out, files, wait=5)
    except BaseException:
        os._exit(3)
    os._exit(0)


def kill_at_every_step(base: Path, old: dict[str, str], new: dict[str, str], fallback: bool) -> list[dict]:
    """Kill the writer before each of its steps in turn; report the state it leaves and the next run's."""
    template = with_user_files(base / "ref_old" / "pkg", old)
    expect_old = tree(template)
    reference = with_user_files(base / "ref_new" / "pkg", old)
    write.generate(reference, new)
    expect_new = tree(reference)
    results = []
    for k in range(1, 500):
        parent = base / f"k{k}"
        out = parent / "pkg"
        shutil.copytree(template, out, symlinks=True)
        pid = os.fork()
        if pid == 0:
            _child(out, new, k, fallback)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status)
        now = tree(out) if out.exists() else None
        away = [p for p in parent.iterdir() if ".opgen-old-" in p.name]
        if now == expect_old:
            state = "old"
        elif now == expect_new:
            state = "new"
        elif now is None and len(away) == 1 and tree(away[0]) == expect_old:
            state = "renamed away"
        else:
            state = f"mixed: {sorted(set((now or {}).items()) ^ set(expect_old.items()))[:4]}"
        change, kept = write.generate(out, new)
        results.append(
            {
                "k": k,
                "killed": killed,
                "exit": os.WEXITSTATUS(status) if not killed else None,
                "state": state,
                "next_run_new": tree(out) == expect_new and not change.conflicts,
                "left": leftovers(parent, "pkg") + [str(p) for p in kept],
            }
        )
        shutil.rmtree(parent)
        if not killed:
            return results
    raise AssertionError("the writer never finished")


def fast_folder(tmp_path: Path) -> Path:
    """A fresh folder in memory (/dev/shm) where there is one: the kill loop makes thousands of folders."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="opgen-kill-", dir=shm))
    folder = tmp_path / "kills"
    folder.mkdir()
    return folder


def mount(*args: str) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


class read_only:
    """A folder nobody may change: `chattr +i` for root (who ignores modes), else mode 0o555."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __enter__(self) -> None:
        if os.geteuid() == 0:
            if subprocess.run(["chattr", "+i", str(self.folder)], capture_output=True).returncode != 0:
                raise NotAvailable("chattr is not available")
        else:
            self.folder.chmod(0o555)

    def __exit__(self, *exc: object) -> None:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(self.folder)], check=True)
        else:
            self.folder.chmod(0o755)


class NotAvailable(Exception):
    """The system cannot set up this test's situation (no root, no chattr)."""
