"""The names an op module imports from its package's `_runtime.py`, recorded as they are printed.

`RuntimeNames` picks, per op module, a name for each function of the runtime
(`opgen/runtime/machinery.py`, copied as `_runtime.py`) that no name of the spec hides, and
records each one the printer or the template writes; the module imports exactly those, as
SymPy's code printers record the modules they print names from (`_module_format`).
"""

from __future__ import annotations

from opgen.spec.names import Namer

# What an op module may import from the package's `_runtime.py` (opgen/runtime/machinery.py).
RUNTIME_NAMES = (
    "Function",
    "autocast_apply",
    "capture",
    "check_floating",
    "legacy_batched",
    "not_scriptable",
    "promoted",
    "refuse_export",
    "transforms_active",
    "without_jvp",
)


class RuntimeNames:
    """How an op module writes the names it imports from `_runtime.py`, and which it wrote: each
    name asked for is recorded, and the module imports exactly those (as SymPy's printers record
    the modules they print names from)."""

    def __init__(self, namer: Namer) -> None:
        self._local = {name: namer.fresh(name) for name in RUNTIME_NAMES}
        self._used: set[str] = set()

    def __getattr__(self, name: str) -> str:  # only for names that are not attributes: the runtime's
        if name not in RUNTIME_NAMES:
            raise AttributeError(f"the package's runtime has no {name!r}")
        self._used.add(name)
        return self._local[name]

    def import_line(self) -> str:
        """`from .._runtime import ...` of the names used, sorted as ruff's isort sorts them."""
        parts = [n if self._local[n] == n else f"{n} as {self._local[n]}" for n in sorted(self._used, key=_isort_key)]
        line = f"from .._runtime import {', '.join(parts)}"
        if len(line) <= 120:
            return line
        return "from .._runtime import (\n" + "".join(f"    {p},\n" for p in parts) + ")"


def _isort_key(name: str) -> tuple[int, str]:
    """ruff's isort order within one import: constants, then classes, then the rest (case-sensitive)."""
    kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    return kind, name
