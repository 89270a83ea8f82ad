"""The generation cache: a spec's generated files, kept by what they were made from.

Receives, from the pipeline, a parsed `Spec` (with the run's options applied) and the files
generated from it; returns them on a later run whose inputs are the same
(Note [generation cache]). Knows nothing of the stages: it stores text under a key.

Note [generation cache]
~~~~~~~~~~~~~~~~~~~~~~~
Deriving and printing a spec costs tens of milliseconds, and importing SymPy to do it half
a second, so an unchanged `opgen generate` would spend nearly all its time redoing what it
did before. Each spec's generated files are kept in a folder the user may delete at any
time: `$OPGEN_CACHE_DIR` if set (set to the empty string, no cache is used), else
`$XDG_CACHE_HOME/opgen`, else `~/.cache/opgen`; never in the generated package.

- The key of a spec is a SHA-256 of everything its files depend on: the parsed `Spec`
  (its `repr`, which holds every field of the frozen model: the formulas, the name its
  header gives the file, `optimize:` with the `--policy` and `--fuse` options applied), the
  text of every file in the user's `--templates` folder, and the *generator*: the source of every
  module of opgen and of its own templates, opgen's version, the versions of SymPy,
  mpmath, Jinja2 and PyYAML, and Python's. Changing any of them makes a new key, so an entry
  is never stale; a spec with a problem is never stored, so its messages are always fresh.
- Entries live in a subfolder per generator; a run keeps the `KEEP` newest subfolders and
  removes older ones, so editing opgen does not grow the cache without end.
- An entry is written to a temporary file and moved into place (`os.replace`), so a reader
  sees a whole entry or none, and concurrent runs may write the same entry. An entry that
  cannot be read or is not what it should be (another key, other file names, not text) is
  ignored, and the run writes a good one in its place. A cache that cannot be written (a
  read-only home) costs speed only: the run goes on without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from opgen.emit.render import default_template_dir
from opgen.spec.model import Spec

CACHE_VARIABLE = "OPGEN_CACHE_DIR"
KEEP = 4  # generator subfolders kept (Note [generation cache])
FORMAT = 2  # the layout of an entry; part of the generator's digest
DEPENDENCIES = ("sympy", "mpmath", "jinja2", "PyYAML")


@dataclass(frozen=True)
class Entry:
    """What the cache keeps for one spec: its files, whether they use the package's shared shape
    checks, and the located warnings generating them gave (`FILE:LINE:COL: warning: ...` lines)."""

    files: dict[str, str]
    shape_checks: bool
    warnings: tuple[str, ...] = ()


def _version(distribution: str) -> str:
    import importlib.metadata  # here: a run without a cache never needs it (70 ms to import)

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _digest_folder(digest: hashlib._Hash, folder: Path, pattern: str) -> None:
    """Add the path (inside `folder`) and bytes of each file `pattern` matches to `digest`."""
    for path in sorted(folder.glob(pattern)):
        if path.is_file():
            data = path.read_bytes()
            digest.update(f"{path.relative_to(folder).as_posix()}\0{len(data)}\0".encode("utf-8", "surrogateescape"))
            digest.update(data)


SOURCE = Path(__file__).resolve().parent  # opgen's own modules


@cache
def generator_digest(template_dir: Path, source: Path = SOURCE) -> str:
    """A digest of everything that generates code from a spec: opgen's source and templates, and versions."""
    digest = hashlib.sha256(f"opgen cache {FORMAT}\0{sys.version}\0".encode())
    for distribution in ("opgen", *DEPENDENCIES):
        digest.update(f"{distribution}={_version(distribution)}\0".encode())
    _digest_folder(digest, source, "**/*.py")  # every stage package and the runtime modules
    _digest_folder(digest, template_dir, "*")
    return digest.hexdigest()


def folder_digest(folder: Path | None) -> str:
    """A digest of a user's template folder (the empty string when there is none)."""
    if folder is None:
        return ""
    digest = hashlib.sha256()
    _digest_folder(digest, folder, "**/*")
    return digest.hexdigest()


def spec_key(*parts: str | bytes) -> str:
    """The key of one spec's files, from every input they depend on (Note [generation cache])."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def default_folder() -> Path | None:
    """The cache folder the environment names, or None when `$OPGEN_CACHE_DIR` is set empty."""
    chosen = os.environ.get(CACHE_VARIABLE)
    if chosen is not None:
        return Path(chosen) if chosen else None
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError:  # no home folder to be found: run without a cache
            return None
    return Path(base) / "opgen"


class Cache:
    """Entries under `root/<generator digest>/<key>.json`; `templates` is the user's template folder."""

    def __init__(self, root: Path, templates: Path | None = None) -> None:
        generator = generator_digest(default_template_dir())
        self.root = root
        self.folder = root / generator[:32]
        self.templates = folder_digest(templates)
        self.hits = 0
        self.misses = 0

    def key(self, spec: Spec) -> str:
        """The key of one spec's files: the whole parsed spec, with the run's options in its `optimize`."""
        return spec_key(repr(spec), self.templates)

    def get(self, key: str, expected: set[str]) -> Entry | None:
        """The entry stored under `key` if it is whole and holds exactly the files `expected`, else None."""
        try:
            data = json.loads((self.folder / f"{key}.json").read_text(encoding="utf-8"))
            files, shape_checks, warnings = data["files"], data["shape_checks"], data["warnings"]
            valid = (
                data["key"] == key
                and isinstance(shape_checks, bool)
                and isinstance(warnings, list)
                and all(isinstance(text, str) for text in warnings)
                and isinstance(files, dict)
                and set(files) == expected
                and all(isinstance(text, str) for text in files.values())
            )
        except (OSError, ValueError, KeyError, TypeError):
            valid = False
        if not valid:
            self.misses += 1
            return None
        self.hits += 1
        return Entry(files, shape_checks, tuple(warnings))

    def put(self, key: str, entry: Entry) -> None:
        """Store `entry` under `key` atomically; a cache that cannot be written is skipped."""
        data = {"key": key, "files": entry.files, "shape_checks": entry.shape_checks, "warnings": list(entry.warnings)}
        with contextlib.suppress(OSError):
            new = not self.folder.is_dir()
            self.folder.mkdir(parents=True, exist_ok=True)
            if new:
                self._prune()
            handle, temporary = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.folder)
            try:
                with os.fdopen(handle, "w", encoding="utf-8") as stream:
                    json.dump(data, stream, ensure_ascii=False, sort_keys=True)
                os.replace(temporary, self.folder / f"{key}.json")
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise

    def _prune(self) -> None:
        """Remove all but the `KEEP` newest generator subfolders (this run's is one of them)."""
        folders = [p for p in self.root.iterdir() if p.is_dir() and len(p.name) == 32]
        folders.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        for old in [p for p in folders if p != self.folder][KEEP - 1 :]:
            shutil.rmtree(old, ignore_errors=True)
