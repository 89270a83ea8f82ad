"""Write stage: the files of a package -> the output folder on disk, safely.

Receives the rendered files (path -> text) and the output folder. `changes` compares them with
what is on disk, as far as opgen owns it (`opgen.write.ownership`: the files its manifest lists); `diff`
shows the difference; `generate` replaces the package in one step under a lock (`opgen.write.swap`),
writing only files whose text changed and removing the generated files no spec produces any more.
A file opgen does not own is never overwritten or removed: the run stops instead, changing nothing.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from opgen.write import swap
from opgen.write.ownership import MANIFEST, MARKER, WriteError, manifest_text, owned

__all__ = ["MARKER", "MANIFEST", "Changes", "WriteError", "apply", "changes", "check", "diff", "generate"]


@dataclass(frozen=True)
class Changes:
    write: dict[str, str]  # relative path -> new text (new or changed files, the manifest among them)
    delete: tuple[str, ...]  # generated files no longer produced
    conflicts: tuple[str, ...]  # paths of files or folders that are not opgen's and are in the way

    @property
    def clean(self) -> bool:
        return not self.write and not self.delete


def package_files(files: dict[str, str]) -> dict[str, str]:
    """The files of the package: the rendered ones and the manifest that lists them."""
    return {**files, MANIFEST: manifest_text(list(files))}


def _blocking_folder(out: Path, rel: str) -> str | None:
    """A folder on the way to `rel` that exists and is not a plain folder (a link or a file)."""
    parts = PurePosixPath(rel).parts
    for depth in range(1, len(parts)):
        folder = "/".join(parts[:depth])
        path = out / folder
        if os.path.lexists(path) and (path.is_symlink() or not path.is_dir()):
            return folder
    return None


def changes(out: Path, files: dict[str, str]) -> Changes:
    """What `generate` would do to the package folder `out` to make it the rendered `files`."""
    files = package_files(files)
    own = owned(out) if out.is_dir() else set()
    write: dict[str, str] = {}
    conflicts: list[str] = []
    for rel, text in sorted(files.items()):
        target = out / rel
        blocking = _blocking_folder(out, rel)
        if blocking is not None:
            if blocking not in conflicts:
                conflicts.append(blocking)
        elif os.path.lexists(target):
            if rel not in own:
                conflicts.append(rel)
            elif target.read_text(encoding="utf-8") != text:
                write[rel] = text
        else:
            write[rel] = text
    delete = tuple(sorted(own - files.keys()))
    return Changes(write, delete, tuple(conflicts))


def diff(out: Path, change: Changes, label: str | None = None) -> str:
    """A unified diff from what is on disk to what `generate` would write."""
    label = label or out.name
    chunks: list[str] = []
    for rel, text in sorted(change.write.items()):
        target = out / rel
        old = target.read_text(encoding="utf-8").splitlines(keepends=True) if target.exists() else []
        name = f"{label}/{rel}"
        chunks += difflib.unified_diff(old, text.splitlines(keepends=True), f"a/{name}", f"b/{name}")
    for rel in change.delete:
        old = (out / rel).read_text(encoding="utf-8").splitlines(keepends=True)
        name = f"{label}/{rel}"
        chunks += difflib.unified_diff(old, [], f"a/{name}", "/dev/null")
    return "".join(chunks)


def apply(out: Path, change: Changes) -> Path | None:
    """Make `out` the new package in one step (without the lock: `generate` takes it)."""
    if change.clean or change.conflicts:
        return None
    return swap.replace(swap.real_out(out), change.write, change.delete)


def generate(out: Path, files: dict[str, str], wait: float = swap.LOCK_WAIT) -> tuple[Changes, list[Path]]:
    """Under OUT's lock: clean up after dead runs, then write the package unless something is in the way.

    Returns the changes (with any conflicts, in which case nothing was written) and the folders where
    files that could not be placed were kept.
    """
    real = swap.real_out(out)
    with swap.locked(real, wait):
        kept = swap.clean_leftovers(real)
        change = changes(real, files)
        if not change.conflicts:
            left = apply(real, change)
            kept += [left] if left is not None else []
    return change, kept


def check(out: Path, files: dict[str, str], wait: float = swap.LOCK_WAIT) -> tuple[Changes, str]:
    """What `generate` would change, and its diff; waits for a run writing OUT, changes nothing."""
    real = swap.real_out(out, writing=False)
    with swap.locked(real, wait, create=False):
        change = changes(real, files)
        return change, diff(real, change, out.name)
