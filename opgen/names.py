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
