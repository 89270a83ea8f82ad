"""Package writes: what opgen owns in OUT, all-or-nothing switches, the lock, leftovers.

The kill tests run the writer in a child process that SIGKILLs itself before its k-th change to
the filesystem, for every k, and check that OUT is then exactly the old or the new package (every
file, the user's included) and that the next run ends with the new package and nothing left over.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, SWISH, import_package
from package_trees import NotAvailable, fast_folder, leftovers, mount, mtimes, read_only, tree, with_user_files

from opgen.write import files as write
from opgen.write import swap

OTHER = SWISH.replace("swish", "swish_two").replace("1.0", "3.0")


def _files(folder: Path, specs: dict[str, str]) -> dict[str, str]:
    from opgen.emit.render import Renderer
    from opgen.pipeline import build

    folder.mkdir(parents=True)
    for name, text in specs.items():
        (folder / f"{name}.yaml").write_text(text, encoding="utf-8")
    result = build([str(folder)], Renderer())
    assert not result.problems, result.problems.report()
    return result.files


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], dict[str, str]]:
    """Two packages: `swish` alone, then `swish` changed and `swish_two` added."""
    base = tmp_path_factory.mktemp("versions")
    old = _files(base / "old", {"swish": SWISH})
    new = _files(base / "new", {"swish": SWISH.replace("1.0", "2.0"), "swish_two": OTHER})
    return old, new


# -- failure 2: opgen touches only what it owns ------------------------------------------------------


def test_a_nested_opgen_package_is_never_touched(run_cli, tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "swish.yaml").write_text(SWISH)
    inner = tmp_path / "proj" / "generated"
    assert run_cli("generate", str(specs), "-o", str(inner))[0] == 0
    before, times = tree(inner), mtimes(inner)
    (specs / "swish.yaml").write_text(OTHER)
    (specs / "swish.yaml").rename(specs / "swish_two.yaml")
    status, _, err = run_cli("generate", str(specs), "-o", str(tmp_path / "proj"))
    assert status == 0, err
    assert tree(inner) == before and mtimes(inner) == times
    assert import_package(tmp_path, "proj").swish_two is not None
    assert import_package(tmp_path / "proj", "generated").swish is not None


def test_user_files_inside_out_survive_every_change(versions, tmp_path):
    old, new = versions
    out = with_user_files(tmp_path / "pkg", old)
    mine = {k: v for k, v in tree(out).items() if k in ("notes.txt", "ops/helper.py", "tests/conftest.py", "data")}
    mine.update({k: v for k, v in tree(out).items() if k.startswith("nested/") or k == "notes_link"})
    for files in (new, old, new):
        change, kept = write.generate(out, files)
        assert not change.conflicts and kept == []
        now = tree(out)
        assert {k: now.get(k) for k in mine} == mine
    assert "ops/swish_two.py" in tree(out)
    assert leftovers(tmp_path, "pkg") == []


def test_a_package_without_manifest_is_adopted_and_only_its_own_files_go(versions, tmp_path):
    """Packages written before the manifest: the marker files at top level, ops/ and tests/ are opgen's."""
    old, new = versions
    out = tmp_path / "pkg"
    write.generate(out, new)
    (out / write.MANIFEST).unlink()
    deep = out / "sub" / "ops"
    deep.mkdir(parents=True)
    (deep / "swish_two.py").write_text(f"{write.MARKER}\n# a nested package's file\n")
    change, _ = write.generate(out, old)
    assert not change.conflicts
    assert "ops/swish_two.py" in change.delete and not (out / "ops" / "swish_two.py").exists()
    assert (deep / "swish_two.py").exists()
    assert (out / write.MANIFEST).read_text().splitlines()[2:] == sorted(old)


@pytest.mark.parametrize("manifest", [True, False], ids=["with-manifest", "without"])
def test_the_ops_folder_of_a_package_is_not_a_package(versions, tmp_path, manifest):
    """`-o pkg/ops` must not take pkg's op modules for its own (its `__init__.py` is generated too)."""
    old, _ = versions
    out = tmp_path / "pkg"
    write.generate(out, old)
    if not manifest:
        (out / write.MANIFEST).unlink()
    before = tree(out)
    change, _ = write.generate(out / "ops", old)
    assert change.conflicts == ("__init__.py",) and tree(out) == before


def test_a_folder_that_is_not_a_package_owns_nothing(versions, tmp_path):
    old, _ = versions
    out = tmp_path / "pkg"
    (out / "ops").mkdir(parents=True)
    (out / "ops" / "swish.py").write_text(f"{write.MARKER}\n# looks generated, but no package says so\n")
    change, _ = write.generate(out, old)
    assert change.conflicts == ("ops/swish.py",)
    assert tree(out) == {"ops/swish.py": f"{write.MARKER}\n# looks generated, but no package says so\n"}


def test_a_listed_file_the_user_rewrote_is_theirs(versions, tmp_path, run_cli):
    old, new = versions
    out = tmp_path / "pkg"
    write.generate(out, old)
    (out / "ops" / "swish.py").write_text("# now my own code\n")
    before = tree(out)
    change, _ = write.generate(out, new)
    assert change.conflicts == ("ops/swish.py",) and tree(out) == before


@pytest.mark.parametrize("entry", ["../outside.py", "/etc/passwd", "sub/pkg/x.py", "ops/../../x.py"])
def test_a_tampered_manifest_stops_the_run(versions, tmp_path, entry):
    old, _ = versions
    out = tmp_path / "pkg"
    write.generate(out, old)
    (tmp_path / "outside.py").write_text(f"{write.MARKER}\n")
    manifest = out / write.MANIFEST
    lines = manifest.read_text().splitlines()
    manifest.write_text("\n".join([*lines[:3], entry, *lines[3:]]) + "\n")
    before = tree(tmp_path)
    with pytest.raises(write.WriteError, match=rf"\.opgen-manifest:4:1: '{entry}' is not a file opgen writes"):
        write.generate(out, {})
    assert tree(tmp_path) == before


def test_a_linked_ops_folder_is_in_the_way(versions, tmp_path):
    """Writing through a symbolic link in OUT would write into the user's other folder."""
    old, _ = versions
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "pkg"
    out.mkdir()
    os.symlink(elsewhere, out / "ops")
    change, _ = write.generate(out, old)
    assert change.conflicts == ("ops",) and list(elsewhere.iterdir()) == []


# -- failure 3: all or nothing -----------------------------------------------------------------------


@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "two-renames"])
def test_a_kill_at_any_step_leaves_the_old_or_the_new_package(versions, tmp_path, fallback):
    old, new = versions
    script = (
        "import json, os, sys; sys.path[:0] = sys.argv[1:3]; import package_trees as t; from pathlib import Path;"
        "os.fsync = lambda fd: None;"  # durability is not what this test is about; it takes most of the time
        "old, new = json.loads(Path(sys.argv[3]).read_text());"
        "print(json.dumps(t.kill_at_every_step(Path(sys.argv[4]), old, new, sys.argv[5] == '1')))"
    )
    data = tmp_path / "versions.json"
    data.write_text(json.dumps([old, new]))
    base = fast_folder(tmp_path)
    try:
        result = subprocess.run(
            [sys.executable, "-c", script, str(ROOT), str(ROOT / "tests"), str(data), str(base), str(int(fallback))],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout)
    assert len(results) > 20  # every change counted: the lock, staging, links, the switch, the clean-up
    assert results[-1] == {**results[-1], "killed": False, "exit": 0, "state": "new"}
    states = {r["state"] for r in results}
    allowed = {"old", "new", "renamed away"} if fallback else {"old", "new"}
    assert states <= allowed, [r for r in results if r["state"] not in allowed]
    assert {"old", "new"} <= states
    assert all(r["next_run_new"] and r["left"] == [] for r in results), [r for r in results if r["left"]]


def test_the_package_imports_whole_after_each_switch(versions, tmp_path):
    old, new = versions
    out = tmp_path / "pkg"
    write.generate(out, old)
    assert not hasattr(import_package(tmp_path, "pkg"), "swish_two")
    write.generate(out, new)
    package = import_package(tmp_path, "pkg")
    assert package.swish_two is not None and "beta: float = 2.0" in (out / "ops" / "swish.py").read_text()


def test_leftovers_of_older_opgen_versions_are_removed_and_user_folders_kept(versions, tmp_path):
    old, _ = versions
    out = tmp_path / "pkg"
    stale = tmp_path / ".pkg.opgen-ab_cd123"  # what earlier versions of opgen left on a kill
    (stale / "ops").mkdir(parents=True)
    (stale / "ops" / "swish.py").write_text(f"{write.MARKER}\nold\n")
    lookalike = tmp_path / ".pkg.opgen-stage-1-0123abcd"
    lookalike.mkdir()
    (lookalike / "diary.txt").write_text("not opgen's\n")
    unrelated = tmp_path / ".pkg.opgen-notes"
    unrelated.mkdir()
    (unrelated / "x").write_text("x")
    _, kept = write.generate(out, old)
    assert not stale.exists() and (unrelated / "x").read_text() == "x"
    assert len(kept) == 1 and (kept[0] / "diary.txt").read_text() == "not opgen's\n"
    assert ".pkg.opgen-kept-" in kept[0].name


def test_two_runs_on_one_out_never_mix(versions, tmp_path):
    """Each run is slowed down (a slow disk); the second waits for the first, and OUT is one of them, whole."""
    old, new = versions
    data = tmp_path / "versions.json"
    data.write_text(json.dumps([old, new]))
    script = (
        "import json, os, sys, time; sys.path.insert(0, sys.argv[1]); from pathlib import Path;"
        "from opgen.write import files as write; link = os.link;"
        "os.link = lambda *a, **k: (time.sleep(0.02), link(*a, **k))[1];"
        "files = json.loads(Path(sys.argv[2]).read_text())[int(sys.argv[4])];"
        "write.generate(Path(sys.argv[3]), files, wait=30)"
    )
    out = with_user_files(tmp_path / "pkg", new)
    runs = [
        subprocess.Popen([sys.executable, "-c", script, str(ROOT), str(data), str(out), str(which)])
        for which in (0, 1, 0, 1)
    ]
    assert [run.wait(timeout=60) for run in runs] == [0, 0, 0, 0]
    expected = [tree(with_user_files(tmp_path / f"ref{i}" / "pkg", files)) for i, files in enumerate((old, new))]
    assert tree(out) in expected
    assert leftovers(tmp_path, "pkg") == []


def test_a_held_lock_makes_generate_and_check_wait_then_fail_clearly(run_cli, tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "swish.yaml").write_text(SWISH)
    out = tmp_path / "pkg"
    assert run_cli("generate", str(specs), "-o", str(out))[0] == 0
    before = tree(out)
    (specs / "swish.yaml").write_text(SWISH.replace("1.0", "2.0"))
    with swap.locked(swap.real_out(out)):
        for command in ("generate", "check"):
            start = time.monotonic()
            status, _, err = run_cli(command, str(specs), "-o", str(out), "--wait", "0.3")
            assert status == 2 and time.monotonic() - start >= 0.3
            assert f"another opgen run (pid {os.getpid()}) is writing it; waited 0.3 s" in err
    assert tree(out) == before
    assert run_cli("check", str(specs), "-o", str(out))[0] == 1
    assert run_cli("generate", str(specs), "-o", str(out))[0] == 0
    assert run_cli("check", str(specs), "-o", str(out))[0] == 0
    assert leftovers(tmp_path, "pkg") == []


class _Msvcrt:
    """Windows' `msvcrt.locking`, played by POSIX flock: a held byte range refuses LK_NBLCK with an OSError."""

    LK_NBLCK = 2

    def __init__(self) -> None:
        import fcntl

        self.fcntl = fcntl
        self.calls = 0

    def locking(self, fd: int, mode: int, nbytes: int) -> None:
        assert mode == self.LK_NBLCK and nbytes == 1 and os.lseek(fd, 0, os.SEEK_CUR) == 0
        self.calls += 1
        self.fcntl.flock(fd, self.fcntl.LOCK_EX | self.fcntl.LOCK_NB)


def test_without_fcntl_the_lock_is_msvcrts(run_cli, tmp_path, monkeypatch):
    """On Windows (no fcntl) runs on one OUT still take turns, through msvcrt.locking."""
    fake = _Msvcrt()
    monkeypatch.setattr(swap, "fcntl", None)
    monkeypatch.setattr(swap, "msvcrt", fake)
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "swish.yaml").write_text(SWISH)
    out = tmp_path / "pkg"
    assert run_cli("generate", str(specs), "-o", str(out))[0] == 0
    with swap.locked(swap.real_out(out)):
        status, _, err = run_cli("generate", str(specs), "-o", str(out), "--wait", "0.2")
    assert status == 2 and "another opgen run" in err and "waited 0.2 s" in err
    assert fake.calls >= 3 and "warning" not in err


def test_without_any_file_lock_a_run_says_so(run_cli, tmp_path, monkeypatch):
    monkeypatch.setattr(swap, "fcntl", None)
    monkeypatch.setattr(swap, "msvcrt", None)
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "swish.yaml").write_text(SWISH)
    status, _, err = run_cli("generate", str(specs), "-o", str(tmp_path / "pkg"))
    assert status == 0 and swap.NO_LOCK in err


def test_check_on_a_read_only_parent_needs_no_lock(versions, tmp_path):
    old, _ = versions
    out = tmp_path / "ro" / "pkg"
    write.generate(out, old)
    with _frozen(out.parent):
        change, text = write.check(out, old)
    assert change.clean and text == ""


def test_a_symlinked_out_on_another_filesystem_is_written_beside_its_target(run_cli, tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem at /dev/shm")
    target_parent = Path(os.path.realpath(shm)) / f"opgen-test-{os.getpid()}-{time.monotonic_ns()}"
    target_parent.mkdir()
    try:
        specs = tmp_path / "specs"
        specs.mkdir()
        (specs / "swish.yaml").write_text(SWISH)
        out = tmp_path / "pkg"
        os.symlink(target_parent / "real_pkg", out)
        for default in ("1.0", "2.0"):
            (specs / "swish.yaml").write_text(SWISH.replace("1.0", default))
            status, _, err = run_cli("generate", str(specs), "-o", str(out))
            assert status == 0, err
        assert (
            out.is_symlink()
            and f"beta: float = {default}" in (target_parent / "real_pkg" / "ops" / "swish.py").read_text()
        )
        assert leftovers(target_parent, "real_pkg") == [] and leftovers(tmp_path, "pkg") == []
        assert import_package(tmp_path, "pkg").swish is not None
        assert run_cli("check", str(specs), "-o", str(out))[0] == 0
    finally:
        shutil.rmtree(target_parent)


def test_a_mount_point_out_is_refused_untouched(run_cli, versions, tmp_path):
    old, _ = versions
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "swish.yaml").write_text(SWISH)
    source, out = tmp_path / "source", tmp_path / "pkg"
    write.generate(source, old)
    out.mkdir()
    if not mount("--bind", str(source), str(out)):
        pytest.skip("cannot bind-mount here (needs root)")
    try:
        before = tree(out)
        (specs / "swish.yaml").write_text(SWISH.replace("1.0", "2.0"))
        status, _, err = run_cli("generate", str(specs), "-o", str(out))
        assert status == 2 and "is a mount point" in err and "symbolic link" in err
        assert tree(out) == before and leftovers(tmp_path, "pkg") == []
        assert run_cli("check", str(specs), "-o", str(out))[0] == 1  # reading a mount point is fine
    finally:
        subprocess.run(["umount", str(out)], check=True)


def test_a_mount_point_inside_out_is_refused_untouched(versions, tmp_path):
    """It could not come along into the new folder, and removing the old one would empty it."""
    old, new = versions
    out = tmp_path / "pkg"
    write.generate(out, old)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "precious.txt").write_text("mine\n")
    (out / "data").mkdir()
    if not mount("--bind", str(tmp_path / "data"), str(out / "data")):
        pytest.skip("cannot bind-mount here (needs root)")
    try:
        before = tree(out)
        with pytest.raises(write.WriteError, match="is a mount point inside"):
            write.generate(out, new)
        assert tree(out) == before and leftovers(tmp_path, "pkg") == []
    finally:
        subprocess.run(["umount", str(out / "data")], check=True)
    assert (tmp_path / "data" / "precious.txt").read_text() == "mine\n"


@contextlib.contextmanager
def _frozen(folder: Path) -> Iterator[None]:
    guard = read_only(folder)
    try:
        guard.__enter__()
    except NotAvailable as error:
        pytest.skip(str(error))
    try:
        yield
    finally:
        guard.__exit__(None, None, None)


def test_a_read_only_subfolder_stops_the_run_before_anything_changes(run_cli, tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "swish.yaml").write_text(SWISH)
    out = tmp_path / "pkg"
    assert run_cli("generate", str(specs), "-o", str(out))[0] == 0
    before, times = tree(out), mtimes(out)
    (specs / "swish.yaml").write_text(SWISH.replace("1.0", "2.0"))
    with _frozen(out / "tests"):
        status, _, err = run_cli("generate", str(specs), "-o", str(out))
    assert status == 2 and f"{out / 'tests'}: is not writable" in err
    assert tree(out) == before and mtimes(out) == times
    assert leftovers(tmp_path, "pkg") == []
