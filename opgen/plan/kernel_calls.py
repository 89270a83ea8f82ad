"""Plan stage, part of `opgen.plan.backward` and `opgen.plan.forward`: which derivatives of a
primitive backward (or jvp) computes as one native backward kernel call, and which statements are one.

A kernel (`silu_backward(g, u)`, Note [native backward kernels] in opgen.nodes.kernels) takes
the incoming gradient, which the plan's factors leave out; whether a derivative can be one depends
on how the plan groups the factors: where it is a factor of the only contribution of its gradient,
or the whole factor of two gradients that negate each other (Note [gradients that negate another]
in opgen.plan.backward). So before the plan's common-subexpression elimination, `kernel_factors`
writes out every derivative that cannot become a kernel: the elimination then sees its parts like
those of any formula, and a kernel's arguments too.
"""

from __future__ import annotations

from collections.abc import Iterable

import sympy
from sympy import Expr

from opgen.nodes.kernels import Prime, backward_kernel, written_out


def kernel_factors(factors: list[list[Expr]], negations: bool = False) -> list[list[Expr]]:
    """The factors of each gradient's contributions, derivatives that cannot be kernels written out.

    A derivative stays a node where it is a factor of the only contribution of its gradient
    and appears nowhere else: there backward computes `g * prime(u)` by the kernel. With
    `negations`, also where it is the whole factor of two gradients, once negated (a loss's input
    and target): backward computes the kernel once for both (Note [gradients that negate another]).
    """
    count: dict[Expr, int] = {}
    for group in factors:
        for factor in group:
            for prime in factor.atoms(Prime):
                count[prime] = count.get(prime, 0) + 1
    kept: set[Expr] = set()
    for group in factors:
        if len(group) == 1 and len(group[0].atoms(Prime)) == 1:
            kept |= {f for f in sympy.Mul.make_args(group[0]) if isinstance(f, Prime) and count[f] == 1}
    whole = [group[0] for group in factors if len(group) == 1]
    if negations:
        kept |= {f for f in whole if isinstance(f, Prime) and count[f] == 2 and -f in whole}
    return [
        [f.replace(lambda e: isinstance(e, Prime) and e not in kept, written_out) for f in group] for group in factors
    ]


def kernel_calls(statements: Iterable[tuple[Expr, frozenset[sympy.Symbol]]]) -> tuple[tuple[Expr, Expr], ...]:
    """The value of each statement of backward or jvp that one backward kernel computes (`g * prime(u)`,
    `g * s * (1 - s)` of a saved sigmoid), with that kernel's node; a statement is its value and the
    symbols that hold tensors where it stands (an output's kernel reads a saved tensor)."""
    found: dict[Expr, Expr] = {}
    for value, tensors in statements:
        if value not in found and (node := backward_kernel(value, tensors)) is not None:
            found[value] = node
    return tuple(found.items())
