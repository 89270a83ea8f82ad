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
    "backward_kernels",
    "capture",
    "first_order_only",
    "floating",
    "may_work_in_place",
    "not_scriptable",
    "outputs_only",
    "recorded",
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

    def mark(self) -> frozenset[str]:
        """The names used so far, for `rewind`."""
        return frozenset(self._used)

    def rewind(self, mark: frozenset[str]) -> None:
        """Forget the names used since `mark`: the lines that printed them were dropped."""
        self._used = set(mark)

    def import_line(self) -> str:
        """The `from .._runtime import ...` statements of the names used."""
        return from_imports(".._runtime", [(name, self._local[name]) for name in self._used])


def from_imports(module: str, names: list[tuple[str, str]]) -> str:
    """`from module import ...` of each (name, local name), as ruff's isort writes them: the names
    imported as themselves in one statement, each renamed one in its own, the statements in the order
    of their first names; a statement too long for a line is bracketed, one name a line."""
    plain = sorted((name for name, local in names if name == local), key=_isort_key)
    statements = [(name, f"{name} as {local}") for name, local in names if name != local]
    statements += [(plain[0], ", ".join(plain))] if plain else []
    lines = []
    for _, imported in sorted(statements, key=lambda statement: _isort_key(statement[0])):
        line = f"from {module} import {imported}"
        if len(line) > 120:
            line = f"from {module} import (\n" + "".join(f"    {name},\n" for name in imported.split(", ")) + ")"
        lines.append(line)
    return "\n".join(lines)


def _isort_key(name: str) -> tuple[int, str]:
    """ruff's isort order within one import: constants, then classes, then the rest (case-sensitive)."""
    kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    return kind, name
