"""Locations and spec errors, shared by every stage.

Every node of a spec remembers where it came from (`Loc`). A stage that finds a
problem raises `SpecError(loc, message)`; the `located` context manager turns any
other exception raised while handling a node into a `SpecError` at that node, so a
user never sees a traceback for a bad spec. `Problems` collects the errors of a
whole run so they can be reported together.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Loc:
    """A position in a spec file; line and column are 1-based."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def shifted(self, line_offset: int, col: int) -> Loc:
        """The location `line_offset` lines below and at column `col` (1-based)."""
        return Loc(self.file, self.line + line_offset, col)


class SpecError(Exception):
    """A problem with a spec, at a known place."""

    def __init__(self, loc: Loc, message: str) -> None:
        super().__init__(f"{loc}: {message}")
        self.loc = loc
        self.message = message


@dataclass
class Problems:
    """The errors found so far in a run, in the order they were found."""

    errors: list[SpecError] = field(default_factory=list)

    def add(self, error: SpecError) -> None:
        self.errors.append(error)

    @contextlib.contextmanager
    def collect(self) -> Iterator[None]:
        """Record a `SpecError` raised inside the block and carry on after it."""
        try:
            yield
        except SpecError as error:
            self.add(error)

    def report(self) -> list[str]:
        seen: set[str] = set()
        lines = []
        for error in self.errors:
            text = str(error)
            if text not in seen:
                seen.add(text)
                lines.append(text)
        return lines

    def __bool__(self) -> bool:
        return bool(self.errors)


class Interrupted(BaseException):
    """Work on a spec stopped from outside (its time budget ran out, `opgen.limits`).

    Not an `Exception`, so no handler meant for errors swallows it; `located` blocks let it
    pass and the innermost one records where the work was.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.loc: Loc | None = None
        self.what = ""


@contextlib.contextmanager
def located(loc: Loc, what: str = "") -> Iterator[None]:
    """Re-raise any unexpected error inside the block as a `SpecError` at `loc`.

    An internal error while handling a spec node should still point the user at the
    node that triggered it (torchgen's `utils.context` does the same).
    """
    try:
        yield
    except SpecError:
        raise
    except Interrupted as interrupted:
        if interrupted.loc is None:
            interrupted.loc, interrupted.what = loc, what
        raise
    except RecursionError:
        raise SpecError(loc, f"{what or 'formula'} is nested too deeply") from None
    except Exception as error:  # noqa: BLE001 - anything else becomes a located error
        prefix = f"{what}: " if what else ""
        raise SpecError(loc, f"{prefix}internal error: {type(error).__name__}: {error}") from error
