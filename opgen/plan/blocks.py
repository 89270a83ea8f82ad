"""Plan stage, part of `opgen.plan.backward`: the statements whose repeated parts are computed once.

A forward `let`, output or residual, the formulas a kernel computes under torch.func transforms
(Note [layer norm under torch.func] in opgen.nodes.layer_norm), and the formula a native backward
kernel stands for where double backward records it (Note [native backward kernels] in
opgen.nodes.kernels) are each computed as a `Block`: its parts used twice first, as temporaries,
then its values reading them. Which parts those are is decided here, once (`share`); the emitters
print a block's temporaries and values and cut long lines, nothing more.

Note [shared parts of a statement]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A statement's part used twice is computed once (`abs(x)` in the stable form of `log(cosh(x))`,
`x @ W` in a gate), in forward as in backward, whatever printed the repeats (the formula as
written, Note [printed stable forms]). A number times one name (`-x`, `g / 2`) is no such part: a
temporary costs a pass over the tensor, where each use prints it into its own operation for
free (`hi - x`, `x - lo`), so it stays inline, as do conditions (a bool tensor would give
`(cond).to(...)` the wrong dtype). A formula the reader kept partly unevaluated is computed
unshared (`_rebuilds_as_is`): rebuilding it would lose what the reader kept (`(a < a) * x`).

Note [printed stable forms]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
A node of the stable rewrites whose derivative is simpler than its value (`logcosh`: its
derivative is tanh, its value a `where` of two stable forms) is computed as its `stable_form()`,
written out in the block so that a long one is cut into temporaries and its repeated parts shared.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import sympy
from sympy import Expr

from opgen.nodes.base import Node, UnderTransforms
from opgen.nodes.kernels import Prime

# The incoming gradient of a backward kernel's recorded formula: the statement that calls the
# kernel reads its own (`kernel_block`).
GRAD = sympy.Symbol("block:grad", real=True)


@dataclass(frozen=True)
class Block:
    """`values` computed after `parts`: each part a temporary (`block:0`, ... until the emitter names it)."""

    parts: tuple[tuple[sympy.Symbol, Expr], ...]
    values: tuple[Expr, ...]


class _Parts(Iterator[sympy.Symbol]):
    def __init__(self) -> None:
        self.count = 0

    def __next__(self) -> sympy.Symbol:
        self.count += 1
        return sympy.Symbol(f"block:{self.count - 1}", real=True)


def share(exprs: Iterable[Expr]) -> Block:
    """`exprs` as one block: their stable forms written out, each part two of them (or one twice) use
    computed once, before (Note [shared parts of a statement])."""
    values = [stable_forms(expr) for expr in exprs]
    if not all(_rebuilds_as_is(value) for value in values):
        return Block((), tuple(values))
    replacements, values = sympy.cse(values, symbols=_Parts(), order="canonical")
    inline: dict[sympy.Basic, sympy.Basic] = {}
    named: dict[sympy.Basic, sympy.Symbol] = {}
    parts = []
    for symbol, part in replacements:
        part = part.xreplace(inline).xreplace(named)
        if is_condition(part) or _folds_into_use(part):
            inline[symbol] = part
            continue
        parts.append((symbol, part))
        named[part] = symbol
    # SymPy's cse leaves some whole occurrences of a part it named unreplaced (a term of a sum)
    return Block(tuple(parts), tuple(value.xreplace(inline).xreplace(named) for value in values))


def kernel_block(prime: Prime) -> Block:
    """The formula of the backward kernel of `prime`'s primitive, `GRAD * prime(u)`, as a block."""
    return share([GRAD * prime.elementary()])


def transform_block(node: UnderTransforms) -> Block:
    """The formulas a kernel computes under torch.func transforms, one block (the absent entries left out)."""
    return share([part for part, _ in node.transform_formulas() if part is not None])


def stable_forms(expr: Expr) -> Expr:
    """`expr` with each node that has a stable form as that form (Note [printed stable forms])."""
    if not any(_has_stable_form(node) for node in sympy.preorder_traversal(expr)):
        return expr
    return expr.replace(_has_stable_form, lambda e: e.stable_form())


def _has_stable_form(expr: sympy.Basic) -> bool:
    return isinstance(expr, Node) and expr.stable_form() is not None


def _folds_into_use(expr: sympy.Basic) -> bool:
    """A number times one name (Note [shared parts of a statement])."""
    if not isinstance(expr, sympy.Mul) or len(expr.args) != 2:
        return False
    number, other = sorted(expr.args, key=lambda a: not a.is_number)
    return bool(number.is_number) and other.is_Atom


def _rebuilds_as_is(expr: sympy.Basic) -> bool:
    """Whether CSE, which rebuilds the formula, keeps it: not where the reader kept a node unevaluated."""
    return all(node.func(*node.args) == node for node in sympy.postorder_traversal(expr) if node.args)


def is_condition(expr: sympy.Basic) -> bool:
    return isinstance(expr, sympy.logic.boolalg.Boolean) and not isinstance(expr, Expr)


def blocks_of(forward: Iterable[Expr], backward: Iterable[Expr]) -> tuple[tuple[Expr, Block], ...]:
    """The block of each statement forward computes with its parts shared (`forward`: lets, residuals and
    outputs), and of each kernel's formulas a statement of backward or jvp (`backward`) may print."""
    found: dict[Expr, Block] = {}
    for expr in forward:
        if expr not in found:
            found[expr] = share([expr])
    for expr in backward:
        for node in expr.atoms(UnderTransforms) - found.keys():
            found[node] = transform_block(node)
        for prime in expr.atoms(Prime) - found.keys():
            found[prime] = kernel_block(prime)
    return tuple(found.items())
