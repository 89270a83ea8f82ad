"""`[tool.opgen]` in a project's pyproject.toml: the arguments `opgen generate` and `check` default to.

Receives the working folder; returns the `Config` of the nearest pyproject.toml, in it or
above it, that has a `[tool.opgen]` table (as ruff finds `[tool.ruff]`), or an empty one.
Paths in the table are relative to the pyproject.toml's folder. Flags given on the command
line override the table key by key (opgen.cli).

Note [config locations]
~~~~~~~~~~~~~~~~~~~~~~~
tomllib reads a table but forgets where each key was written, and a wrong key or value must
be reported as `pyproject.toml:LINE:COL`. The keys of `[tool.opgen]` are plain `key = value`
lines, so each is located by scanning the table's lines for `key =` after tomllib has
accepted the file; a key written some other way (a dotted `tool.opgen.key = ...` elsewhere,
an inline table) is located at its table's header, or at the file's first line.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opgen.errors import Loc, SpecError
from opgen.spec.model import POLICIES

PYPROJECT = "pyproject.toml"
KEYS = ("specs", "out", "policy", "fuse", "templates", "form")


@dataclass(frozen=True)
class Config:
    """The `[tool.opgen]` values; None where the table does not set one."""

    file: Path | None = None  # the pyproject.toml read, if any
    specs: tuple[str, ...] | None = None  # paths as the command line takes them
    out: str | None = None
    policy: str | None = None
    fuse: bool | None = None
    templates: str | None = None
    form: str | None = None  # handed on as the `--form` flag is


class NoToml(SpecError):
    """This Python cannot read TOML: 3.10 without the tomli package, which opgen declares for it
    (an install that skipped opgen's dependencies). With SPEC and -o given a run goes on without
    the table (opgen.cli)."""

    why = "reading it needs Python 3.11 (tomllib) or the tomli package"

    def __init__(self, loc: Loc) -> None:
        super().__init__(
            loc,
            f"{self.why}, which opgen requires on Python 3.10: reinstall opgen with its dependencies, "
            "`python -m pip install tomli`, or pass SPEC and -o on the command line",
        )


def _toml() -> Any:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            return None
    return tomllib


def find(start: Path) -> Path | None:
    """The nearest pyproject.toml at or above `start` with a `[tool.opgen]` table (by its text)."""
    for folder in (start, *start.parents):
        candidate = folder / PYPROJECT
        if candidate.is_file():
            try:
                text = candidate.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            # `[tool.opgen` without its `]` counts: tomllib then says where the header is broken
            if re.search(r"^\s*\[\s*tool\s*\.\s*opgen\b|^\s*tool\s*\.\s*opgen\s*[.=]", text, re.MULTILINE):
                return candidate
    return None


def load(start: Path) -> Config:
    """The `[tool.opgen]` config that applies in `start`; a bad file, key or value is a `SpecError`."""
    path = find(start)
    if path is None:
        return Config()
    shown = _shown(path)
    toml = _toml()
    if toml is None:
        raise NoToml(Loc(shown, 1, 1))
    text = path.read_text(encoding="utf-8")
    try:
        table = toml.loads(text).get("tool", {}).get("opgen", {})
    except toml.TOMLDecodeError as error:
        raise _decode_error(shown, str(error), text) from None
    locate = _Locator(shown, text)
    if not isinstance(table, dict):
        raise SpecError(locate.table(), "[tool.opgen] must be a table of `key = value` lines")
    values = {key: _value(key, value, locate) for key, value in table.items()}
    root = path.parent
    specs = values.get("specs")
    return Config(
        file=path,
        specs=None if specs is None else tuple(_path(root, s) for s in specs),
        out=None if values.get("out") is None else _path(root, values["out"]),
        policy=values.get("policy"),
        fuse=values.get("fuse"),
        templates=None if values.get("templates") is None else _path(root, values["templates"]),
        form=values.get("form"),
    )


def _value(key: str, value: object, locate: _Locator) -> Any:
    """`value` of `key` checked; a wrong key or value is located at its line."""
    if key not in KEYS:
        close = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.75)
        hint = f"did you mean '{close[0]}'?" if close else f"the keys are: {', '.join(KEYS)}"
        raise SpecError(locate.key(key), f"unknown key '{key}' in [tool.opgen]; {hint}")
    where = locate.value(key)
    if key == "specs":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise SpecError(where, 'specs must be a folder or spec file, or a list of them: specs = ["specs"]')
        return value
    if key == "fuse":
        if not isinstance(value, bool):
            raise SpecError(where, "fuse must be true or false")
        return value
    if key == "policy" and value not in POLICIES:
        raise SpecError(where, f"policy must be one of {', '.join(POLICIES)}, not {value!r}")
    if not isinstance(value, str) or not value:
        example = {"out": '"generated"', "templates": '"templates"', "form": '"..."'}.get(key, '"..."')
        raise SpecError(where, f"{key} must be a non-empty string, e.g. {key} = {example}")
    return value


def _path(root: Path, value: str) -> str:
    """`value` relative to `root`, as the command line would name it from the working folder."""
    path = root / value
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _shown(path: Path) -> str:
    return _path(path.parent, path.name)


def _decode_error(shown: str, message: str, text: str) -> SpecError:
    """tomllib's `... (at line 3, column 7)` as a located error."""
    found = re.search(r"\(at line (\d+), column (\d+)\)", message)
    if found:
        what = message[: found.start()].strip()
        return SpecError(Loc(shown, int(found[1]), int(found[2])), f"invalid TOML: {what}")
    if message.endswith("(at end of document)"):
        lines = text.splitlines() or [""]
        what = message[: -len("(at end of document)")].strip()
        return SpecError(Loc(shown, len(lines), len(lines[-1]) + 1), f"invalid TOML at the end of the file: {what}")
    return SpecError(Loc(shown, 1, 1), f"invalid TOML: {message}")


class _Locator:
    """Where a key of `[tool.opgen]` is written (Note [config locations])."""

    _HEADER = re.compile(r"^\s*\[\s*tool\s*\.\s*opgen\s*\]")

    def __init__(self, file: str, text: str) -> None:
        self.file = file
        self.lines = text.splitlines()
        self.start = next((k for k, line in enumerate(self.lines) if self._HEADER.match(line)), None)

    def table(self) -> Loc:
        return Loc(self.file, 1 if self.start is None else self.start + 1, 1)

    def _line(self, key: str) -> tuple[int, re.Match[str]] | None:
        if self.start is None:
            return None
        pattern = re.compile(rf"^(\s*)(\"?){re.escape(key)}\2\s*=\s*")
        for k in range(self.start + 1, len(self.lines)):
            if self.lines[k].lstrip().startswith("["):
                break
            if match := pattern.match(self.lines[k]):
                return k, match
        return None

    def key(self, key: str) -> Loc:
        found = self._line(key)
        return self.table() if found is None else Loc(self.file, found[0] + 1, len(found[1][1]) + 1)

    def value(self, key: str) -> Loc:
        found = self._line(key)
        return self.table() if found is None else Loc(self.file, found[0] + 1, found[1].end() + 1)
