"""Names the generated code uses for its own internals.

Spec names (inputs, outputs, lets, module args) are the user's and appear unchanged in the
generated code. Everything the generated code needs for itself (`torch`, `ctx`, `self`,
gradient variables, temporaries, ctx attributes) gets a name from a `Namer` that avoids
every spec name, so no spec can shadow or change what the generated code does.
"""

from __future__ import annotations

import builtins
import keyword

# Attributes torch's autograd ctx already has; a value kept on ctx must not replace one.
CTX_ATTRIBUTES = frozenset(
    """apply dirty_tensors mark_dirty mark_non_differentiable materialize_grads metadata name
    needs_input_grad next_functions non_differentiable register_hook register_prehook
    save_for_backward save_for_forward saved_for_forward saved_tensors saved_variables
    set_materialize_grads to_save""".split()
)


class Namer:
    """Hands out names not yet taken; a taken name gets underscores appended."""

    def __init__(self, taken: set[str] | frozenset[str]) -> None:
        self.taken = set(taken) | set(keyword.kwlist) | {"None", "True", "False"}

    def fresh(self, base: str) -> str:
        name = base
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        return name

    def reserve(self, name: str) -> str:
        self.taken.add(name)
        return name


def ctx_namer() -> Namer:
    """Names for attributes on ctx: never one of ctx's own, never private-looking."""
    return Namer(CTX_ATTRIBUTES | {n for n in dir(builtins) if n.startswith("_")})


# The generated package's own modules: an op or class of one of these names would replace the
# module in the package's namespace (`pkg.tests` must stay the test subpackage).
PACKAGE_MODULES = frozenset({"ops", "tests", "_shape_checks", "_runtime", "_custom_ops"})


def public_name_problem(name: str) -> str | None:
    """Why the package cannot export `name` (an op or class name), or None."""
    if name in PACKAGE_MODULES:
        return f"is the name of the generated package's own module `{name}`; choose another name"
    return None


def op_name_problem(name: str) -> str | None:
    """Why an op cannot have `name` (it names `ops/<name>.py` and `tests/test_<name>.py`), or None."""
    if problem := public_name_problem(name):
        return problem
    if name.startswith("test_"):
        return (
            f"starts with 'test_': pytest would collect `ops/{name}.py` and its function as tests; choose another name"
        )
    if name == "conftest":
        return "would make `ops/conftest.py`, which pytest loads as its own configuration; choose another name"
    return None
