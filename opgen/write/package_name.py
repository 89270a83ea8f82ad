"""Which names an output package may have: `-o build/NAME` is imported as `import NAME`.

Receives the last component of OUT (and, after the build, the rendered files); returns why the
name would not work as a package, or None (Note [package names]).
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import keyword
import os
import re
import sys
import unicodedata
from pathlib import Path

# Note [package names]
# ~~~~~~~~~~~~~~~~~~~~
# OUT's last component becomes a top-level module name, so it must be importable and must not
# take the place of another module. Refused:
# - not an identifier (`my-ops`), or not in NFKC form (`ｔｏｒｃｈ`: Python reads `import ｔｏｒｃｈ`
#   as `import torch`, so the package could never be imported);
# - a keyword (`class`, `None`): `import class` is a syntax error;
# - a module of the standard library or built into Python (`math`, `json`, `sys`): wherever the
#   package's parent folder comes first on `sys.path` (running from it, pytest's rootdir) it hides
#   the real module from torch, pytest and the generated code, or the real one hides it;
# - a module the generated code imports (`torch`, `pytest`, `dataclasses`): the package would
#   import itself;
# - the top-level module of a distribution installed in the Python running opgen (`numpy`, `yaml`,
#   `opgen`), unless that module is OUT itself (an editable install of the user's own package).
# Allowed: soft keywords (`match`, `case`, `type`, `_`) and names of builtins (`len`, `super`):
# `import match` works, the generated code imports only relatively inside the package, and
# `import len` rebinds `len` only in the module that asks for it.


def before_build(name: str) -> str | None:
    """Why `name` cannot be a package name, judged from the name alone."""
    if not name.isidentifier():
        return f"the package name '{name}' is not a Python identifier"
    normal = unicodedata.normalize("NFKC", name)
    if normal != name:
        return f"the package name '{name}' is read by Python as '{normal}' (`import {name}` imports {normal}); use that"
    if keyword.iskeyword(name):
        return f"the package name '{name}' is a Python keyword, so `import {name}` is a syntax error; choose another"
    if name in sys.stdlib_module_names or name in sys.builtin_module_names:
        return (
            f"the package name '{name}' is a module of Python's standard library; the package would hide it from "
            "torch and the generated code (or be hidden by it); choose another name"
        )
    return None


def imported_modules(files: dict[str, str], name: str | None = None) -> set[str]:
    """The top-level modules the generated files import by absolute name.

    With `name`, only files whose text could import it are parsed (`_may_import`): the others
    cannot add `name` to the answer, and parsing every file is most of a re-run's time.
    """
    found: set[str] = set()
    for text in files.values():
        if name is not None and not _may_import(text, name):
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def _may_import(text: str, name: str) -> bool:
    """Whether `text` has `import` or `from` followed by `name` with only names, dots, commas,
    `as` aliases, spaces and line continuations between: every statement that imports `name`
    does (`import a as b, name`, `from \\<newline> name.x import y`); a match may be no import."""
    if name not in text:
        return False
    pattern = r"\b(?:import|from)\b(?:[ \t,\w.]|\\\r?\n)*?(?<![\w.])" + re.escape(name) + r"\b"
    return re.search(pattern, text) is not None


def _is_out(spec: importlib.machinery.ModuleSpec | None, out: Path) -> bool:
    """The module `spec` finds is the package OUT itself."""
    if spec is None:
        return False
    real = os.path.realpath(out)
    places = [os.path.dirname(spec.origin)] if spec.origin else []
    places += list(spec.submodule_search_locations or [])
    return any(os.path.realpath(place) == real for place in places)


def after_build(out: Path, files: dict[str, str]) -> str | None:
    """Why OUT's name cannot be a package name, given what the package imports and what is installed."""
    name = out.name
    if name in imported_modules(files, name):
        return (
            f"the package name '{name}' is a module the generated code imports (`import {name}`); the package "
            "would import itself instead; choose another name"
        )
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or _is_out(spec, out):
        # No module of that name can be imported, or it is OUT (an editable install of the user's
        # own package): nothing to hide. Checked before the costly look at every distribution.
        return None
    from importlib.metadata import packages_distributions  # here: the rare, costly case

    distributions = packages_distributions().get(name)
    if not distributions:
        return None
    return (
        f"the package name '{name}' is the module of the installed distribution {distributions[0]}; one would "
        "hide the other; choose another name"
    )
