"""Softmax and log-softmax written through logsumexp, found in a formula and made PyTorch's fused
nodes (`Softmax`, `LogSoftmax` of opgen.formula.tensor): the same values, one kernel each."""

from __future__ import annotations

import sympy
from sympy import Expr

from opgen.formula.tensor import LogSoftmax, ReduceLogSumExp, Softmax


def _log_softmax_parts(expr: Expr) -> tuple[Expr, sympy.Integer] | None:
    """(a, dim) when `expr` is `a - logsumexp(a, dim, keepdim=true)` over one dim (torch.softmax takes one)."""
    if not isinstance(expr, sympy.Add):
        return None
    for term in expr.args:
        coeff, body = term.as_coeff_Mul()
        if (
            coeff == -1
            and isinstance(body, ReduceLogSumExp)
            and body.keepdim
            and not isinstance(body.args[1], sympy.Tuple)
        ):
            rest = sympy.Add(*[t for t in expr.args if t is not term])
            if rest == body.operand:
                return body.operand, body.args[1]
    return None


def fuse_softmax(expr: Expr) -> Expr:
    """Softmax and log-softmax written through logsumexp become PyTorch's fused ops (same values)."""
    found: dict[sympy.Basic, Expr] = {}
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.exp) and (parts := _log_softmax_parts(node.args[0])):
            found[node] = Softmax(*parts)
        elif isinstance(node, sympy.Add) and (parts := _log_softmax_parts(node)):
            found[node] = LogSoftmax(*parts)
    return expr.xreplace(found) if found else expr
