"""Replacing a package folder in one step: the lock, the staging folder, the switch, the clean-up.

Receives the output folder and its new and changed files (a `write.Changes`); builds the whole
new package in a staging folder beside the real output folder, carries over everything it does
not replace (the user's files, unchanged generated files, as hard links), and exchanges the two
folders in one atomic rename (Note [atomic package switch]). Every folder a run leaves behind is
removed by the next run under the same lock, keeping any byte that exists nowhere else.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import filecmp
import os
import re
import secrets
import shutil
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from opgen.write.ownership import MANIFEST, WriteError, owned_leftovers

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: Windows locks with msvcrt
    fcntl = None  # type: ignore[assignment]
try:
    import msvcrt
except ImportError:
    msvcrt = None  # type: ignore[assignment]

NO_LOCK = (
    "opgen: warning: this platform has neither fcntl nor msvcrt file locks: runs on one OUT do not take"
    " turns, so never run two at once"
)

LOCK_WAIT = 60.0  # seconds a run waits for another run on the same OUT

# Note [atomic package switch]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A package is many files and Python imports them one by one, so replacing the files one by one
# (even each atomically) leaves a mix of old and new for whoever imports, or is killed, halfway.
# opgen builds the complete new OUT in `.OUT.opgen-stage-PID-TOKEN` beside the real OUT (symbolic
# links resolved, so always the same filesystem): first the manifest, then the new and changed files,
# then hard links to every other file of OUT (unchanged generated files keep their inode and mtime;
# the user's files and nested packages come along unchanged; a copy where the filesystem has no hard
# links), folder modes last. Then one `renameat2(RENAME_EXCHANGE)` swaps the two folders: before it
# OUT is wholly the old package, after it wholly the new one, and the staging name holds the old tree.
# New files are fsynced before the switch (together, from threads: one by one, each waits for its
# own journal commit); beyond that, the promise is about a run that is killed, not about a machine
# that loses power.
# Where the exchange is not available (not Linux, or a filesystem without it) OUT is renamed away and
# the new tree renamed in: a kill between the two leaves no OUT, and the next run puts the old one
# back before anything else (the one weaker spot, only on such systems).
#
# Leftovers (a staging folder of a killed run, or the old tree after the switch) are removed file by
# file, and only files whose bytes survive in OUT at the same path (same inode, or same content),
# the leftover's own manifest files, and `__pycache__`: anything else (a file the user changed in OUT
# while opgen ran) stays, in `.OUT.opgen-kept-PID-TOKEN`, with a warning. Leftovers are found by name
# under the lock, so they belong to runs that are dead. `.OUT.opgen-XXXXXXXX` folders of older opgen
# versions are cleaned the same way.
#
# Refused, with OUT untouched: OUT a mount point (its folder cannot be renamed; write to a folder
# inside it, or point a symbolic link at it), a mount point inside OUT (it could not come along), and
# a folder of OUT that the user cannot read and write. The old folder's inode is replaced, so a shell
# whose working directory is inside OUT must `cd` again afterwards.


def mount_points() -> set[str]:
    """Every mount point of this process (Linux; elsewhere none, and `os.path.ismount` must do)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return set()
    unescape = re.compile(r"\\([0-7]{3})")
    fields = [line.split(" ") for line in lines]
    return {unescape.sub(lambda m: chr(int(m.group(1), 8)), field[4]) for field in fields if len(field) > 4}


def _is_mount(path: Path, mounts: set[str]) -> bool:
    return str(path) in mounts or os.path.ismount(path)


def real_out(out: Path, writing: bool = True) -> Path:
    """The folder that is really replaced: `out` with every symbolic link resolved."""
    real = Path(os.path.realpath(out))
    if os.path.lexists(real) and not real.is_dir():
        raise WriteError(f"-o {out}: exists and is not a folder")
    if writing and (real.parent == real or _is_mount(real, mount_points())):
        raise WriteError(
            f"-o {out}: {real} is a mount point, and opgen replaces the package folder with one rename, which a mount"
            " point does not allow; write to a folder inside it, or to a folder elsewhere with a symbolic link to it"
        )
    return real


# -- the lock ----------------------------------------------------------------------------------------


def _holder(path: Path) -> str:
    try:
        pid = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


def _take(path: Path, real: Path, wait: float) -> int:
    deadline = time.monotonic() + wait
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            while not _try_lock(fd):
                if time.monotonic() >= deadline:
                    raise WriteError(
                        f"{real}: another opgen run{_holder(path)} is writing it; waited {wait:g} s for it to"
                        f" finish (its lock: {path})"
                    ) from None
                time.sleep(0.02)
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(fd), os.stat(path)):
                    os.ftruncate(fd, 0)
                    os.write(fd, f"{os.getpid()}\n".encode("ascii"))
                    return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # its holder removed it as we took it: take the new one


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock of the open lock file `fd` without waiting; False while another run holds
    it. POSIX: `flock` of the whole file; Windows: `msvcrt.locking` of its first byte (the lock is the
    byte range, taken from the start)."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def locked(real: Path, wait: float = LOCK_WAIT, create: bool = True) -> Iterator[None]:
    """Hold `.OUT.opgen-lock` beside the real OUT, waiting at most `wait` seconds for another run.

    With `create=False` (a reader) a missing or read-only parent folder means no lock: nobody writes there.
    """
    path = real.parent / f".{real.name}.opgen-lock"
    if fcntl is None and msvcrt is None:
        print(NO_LOCK, file=sys.stderr)
        yield
        return
    if create:
        real.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = _take(path, real, wait)
    except OSError:
        if create:
            raise
        fd = -1
    try:
        yield
    finally:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(path)  # before unlocking: a waiter that took this file sees it gone and retries
            os.close(fd)


# -- building the new tree ---------------------------------------------------------------------------


def _write_text(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(text)


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except PermissionError:  # a umask that leaves the owner no read bit: the file is written, unsynced
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(folder: Path, write: dict[str, str]) -> None:
    """Write each file of `write` into `folder`, the manifest first (clean-up reads it), and fsync them
    all, from threads while the next are written: one after the other, each fsync waits for its own
    journal commit (a third of a second for a package on a busy disk); together they share a few."""
    from concurrent.futures import ThreadPoolExecutor  # here: most runs write nothing

    with ThreadPoolExecutor(max_workers=8) as pool:
        synced = []
        for rel in sorted(write, key=lambda rel: rel != MANIFEST):
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            _write_text(folder / rel, write[rel])
            synced.append(pool.submit(_fsync, folder / rel))
        for done in synced:
            done.result()  # an fsync that failed fails the run, as a write does


def _carry(source: Path, target: Path) -> None:
    """`target` becomes `source`: a hard link, else a copy (a filesystem without links)."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.EMLINK, errno.EXDEV, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        else:
            shutil.copy2(source, target, follow_symlinks=False)


def _check_folder(folder: Path, device: int, real: Path, mounts: set[str]) -> os.stat_result:
    info = os.lstat(folder)
    if info.st_dev != device or (folder != real and _is_mount(folder, mounts)):
        raise WriteError(
            f"{folder}: is a mount point inside {real}; opgen replaces the whole folder and cannot carry a mount over"
        )
    if not os.access(folder, os.R_OK | os.W_OK | os.X_OK):
        raise WriteError(
            f"{folder}: is not writable; opgen needs to read and write every folder of {real.name} "
            "(it rebuilds the package beside it and removes the old one); nothing was changed"
        )
    return info


def _mirror(real: Path, staging: Path, skip: set[str]) -> list[tuple[Path, os.stat_result]]:
    """Carry every entry of `real` except `skip` into `staging`; returns each folder with its old status."""
    device, mounts = os.lstat(real).st_dev, mount_points()

    def fail(error: OSError) -> None:
        raise error

    folders = []
    for dirpath, dirnames, filenames in os.walk(real, onerror=fail):
        here = Path(dirpath)
        rel_dir = here.relative_to(real)
        folders.append((staging / rel_dir, _check_folder(here, device, real, mounts)))
        (staging / rel_dir).mkdir(exist_ok=True)
        for name in sorted(filenames + [d for d in dirnames if (here / d).is_symlink()]):
            if (rel_dir / name).as_posix() not in skip:
                _carry(here / name, staging / rel_dir / name)
    return folders


def _restore_modes(folders: list[tuple[Path, os.stat_result]]) -> None:
    for folder, info in reversed(folders):  # deepest first: a read-only folder is finished before
        if os.geteuid() == 0 and (info.st_uid, info.st_gid) != (0, 0):
            with contextlib.suppress(OSError):
                os.chown(folder, info.st_uid, info.st_gid)
        os.chmod(folder, stat.S_IMODE(info.st_mode))


def _new_folder(parent: Path, name: str, kind: str) -> Path:
    while True:
        path = parent / f".{name}.opgen-{kind}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue


# -- the switch --------------------------------------------------------------------------------------


def _libc_renameat2():
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    except OSError:  # pragma: no cover
        return None


def _exchange(a: Path, b: Path) -> bool:
    """Swap the folders `a` and `b` atomically; False when this system or filesystem cannot."""
    renameat2 = _libc_renameat2() if sys.platform.startswith("linux") else None
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _switch(staging: Path, real: Path) -> Path:
    """Put `staging` at `real`; returns where the old tree is now."""
    if _exchange(staging, real):
        return staging
    old = _new_folder(real.parent, real.name, "old")
    os.rmdir(old)
    os.rename(real, old)
    os.rename(staging, real)  # a kill before this leaves no OUT: `clean_leftovers` renames `old` back
    return old


def replace(real: Path, write: dict[str, str], delete: tuple[str, ...]) -> Path | None:
    """Make `real` its old contents with `write` written and `delete` removed, in one step.

    Returns the folder where files changed in OUT during the run were kept, if any.
    """
    real.parent.mkdir(parents=True, exist_ok=True)
    if not os.access(real.parent, os.W_OK | os.X_OK):
        raise WriteError(f"{real.parent}: is not writable; opgen stages the new package there")
    staging = _new_folder(real.parent, real.name, "stage")
    try:
        _write_all(staging, write)
        if not os.path.lexists(real):
            os.rename(staging, real)
            return None
        _restore_modes(_mirror(real, staging, set(write) | set(delete)))
        old = _switch(staging, real)
    except BaseException:
        retire(staging, real)
        raise
    return retire(old, real)


# -- clean-up ----------------------------------------------------------------------------------------


def _survives(path: Path, twin: Path) -> bool:
    """The entry `path` of a leftover folder exists unchanged at `twin` in OUT."""
    try:
        mine, theirs = os.lstat(path), os.lstat(twin)
        if os.path.samestat(mine, theirs):
            return True
        if stat.S_ISLNK(mine.st_mode) and stat.S_ISLNK(theirs.st_mode):
            return os.readlink(path) == os.readlink(twin)
        if stat.S_ISREG(mine.st_mode) and stat.S_ISREG(theirs.st_mode) and mine.st_size == theirs.st_size:
            return filecmp.cmp(path, twin, shallow=False)
    except OSError:
        pass
    return False


def retire(folder: Path, real: Path) -> Path | None:
    """Remove a leftover folder, keeping any file whose bytes are nowhere else (Note [atomic package switch])."""
    if not os.path.lexists(folder):
        return None
    own = owned_leftovers(folder)
    device, mounts = os.lstat(folder).st_dev, mount_points()
    walked = []
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        # never into another filesystem mounted inside: it stays, and so does the folder
        dirnames[:] = [d for d in dirnames if os.lstat(here / d).st_dev == device and not _is_mount(here / d, mounts)]
        walked.append((here, dirnames, filenames))
    for here, dirnames, filenames in reversed(walked):
        rel_dir = here.relative_to(folder)
        for name in filenames + [d for d in dirnames if (here / d).is_symlink()]:
            rel = rel_dir / name
            if rel.as_posix() in own or "__pycache__" in rel.parts or _survives(here / name, real / rel):
                with contextlib.suppress(OSError):
                    os.unlink(here / name)
        for name in dirnames:
            with contextlib.suppress(OSError):
                os.rmdir(here / name)
    try:
        os.rmdir(folder)
        return None
    except OSError:
        pass
    kept = _new_folder(folder.parent, real.name, "kept")
    os.rmdir(kept)
    os.rename(folder, kept)
    return kept


def clean_leftovers(real: Path) -> list[Path]:
    """Restore or remove what dead runs on `real` left beside it (call under the lock); returns kept folders."""
    name = re.escape(real.name)
    ours = re.compile(rf"\.{name}\.opgen-(?:(stage|old)-\d+-[0-9a-f]{{8}}|[a-z0-9_]{{8}})")
    kept: list[Path] = []
    if not real.parent.is_dir():
        return kept
    for path in sorted(real.parent.iterdir()):
        match = ours.fullmatch(path.name)
        if not match or path.is_symlink() or not path.is_dir():
            continue
        if match.group(1) == "old" and not os.path.lexists(real):
            os.rename(path, real)  # killed between the two renames of the fallback switch
            continue
        left = retire(path, real)
        if left is not None:
            kept.append(left)
    return kept
