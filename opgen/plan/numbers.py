"""Plan stage, part of `opgen.plan.backward`: number-valued factors out of linear tensor nodes.

Note [parameters out of linear nodes]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A linear node (`unsqueeze`, `sum`, `mean`, ...) pulls a literal number out of its operand when it is
built, but not a parameter: it cannot tell a float input from a tensor. The LSE pooling
`log(mean(exp(r*x), dim=-1)) / r` so had the gradient `r * exp(...) * (grad / r).unsqueeze(-1)`, two
full-size multiplications by `r` and `1/r` that cancel. The plan knows which symbols hold numbers
(the non-tensor inputs and the sizes of named dimensions; a residual is a tensor) and takes the
factors made only of them outside each linear node, where SymPy cancels them against the others;
where nothing cancels, the gradient stays as it was.
"""

from __future__ import annotations

import sympy
from sympy import Expr

from opgen.formula.tensor import LINEAR, is_dim_size


def pull_numbers(expr: Expr, numbers: frozenset[sympy.Symbol]) -> Expr:
    """`expr` with each linear node's number-valued factors (of `numbers`, sizes of dims) outside it,
    where they cancel: outside, a factor that cancels nothing costs a pass (the matrix of `(g * c) @ k`
    became `c * g`, a full-size product, and `2*(t @ y - ...)` two products by 2), so `expr` is kept unless
    pulling them out leaves fewer operations."""

    def number(factor: Expr) -> bool:
        free = factor.free_symbols
        return bool(free) and all(s in numbers or is_dim_size(s) for s in free)

    def pull(node: Expr) -> Expr:
        operand, *rest = node.args
        outside = [f for f in sympy.Mul.make_args(operand) if number(f)]
        if not outside:
            return node
        inside = sympy.Mul(*[f for f in sympy.Mul.make_args(operand) if not number(f)])
        return sympy.Mul(*outside) * node.func(inside, *rest)

    if not expr.has(*LINEAR):
        return expr
    pulled = expr.replace(lambda e: isinstance(e, LINEAR), pull)
    return pulled if sympy.count_ops(pulled) < sympy.count_ops(expr) else expr
