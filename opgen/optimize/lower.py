"""Lowering stage: SymPy formulas -> calls of PyTorch's native kernels where a formula is one.

Receives a (rewritten) SymPy expression and the symbols of non-tensor inputs; returns the same
value with every subformula that is exactly a PyTorch primitive replaced by a node that
prints as that primitive's call: `x * sigmoid(x)` becomes `F.silu(x)`, `softplus(b*x)/b`
becomes `F.softplus(x, b)`, and so on. `derive` applies it after the stable
rewrites and before differentiating, so a gradient holds the primitive's derivative as
one node, which the emitter prints as PyTorch's own backward kernel (`opgen.emit.kernel_lines`).

The primitives are nodes of the kernel IR (opgen.nodes.kernels, Note [native backward kernels]);
each family module gives the patterns of its own (`LOWERINGS`: Note [kinks of lowered primitives],
Note [parameters of lowered primitives]).
"""

from __future__ import annotations

import sympy
from sympy import Expr

from opgen.nodes import activations, clips, losses
from opgen.nodes.kernels import Lowering, tensors

# In order: a later pattern sees what an earlier one made (a clip -> hardsigmoid).
LOWERINGS: tuple[Lowering, ...] = (*activations.LOWERINGS, *clips.LOWERINGS, *losses.LOWERINGS)


def lower(expr: Expr, numbers: frozenset[sympy.Symbol]) -> Expr:
    """`expr` with every subformula that is a PyTorch primitive replaced by it.

    `numbers` are the symbols of the non-tensor inputs: a primitive's parameters
    (softplus's beta, elu's alpha) must be made of these and constants.
    """
    if expr.is_Atom or not expr.args or not tensors(expr, numbers):
        return expr
    args = tuple(lower(a, numbers) if isinstance(a, Expr) else a for a in expr.args)
    node = expr.func(*args) if args != expr.args else expr
    for match in LOWERINGS:
        found = match(node, numbers)
        if found is not None:
            node = found
    return node
