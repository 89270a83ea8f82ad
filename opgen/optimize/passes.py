"""Optimize stage: formulas -> the same values computed stably and by PyTorch's native kernels.

Receives `Formulas` (before `opgen.derive.gradients`) or `Derived` (after it); returns the same kind,
changed as the spec's `optimize:` allows: the stable rewrites (`opgen.optimize.rewrite`) and the
lowering to native kernels (`opgen.optimize.lower`) on every formula before it is differentiated,
so gradients come from stable functions and native backward kernels, and the rewrites
again on every derived gradient. The pipeline calls these around `derive`; nothing here
calls another stage.
"""

from __future__ import annotations

import sympy
from sympy import Expr

from opgen.derive.gradients import Derived
from opgen.formula.read import Formulas
from opgen.optimize.lower import lower
from opgen.optimize.rewrite import rewrite, rewrite_gradients


def optimize_formulas(formulas: Formulas) -> Formulas:
    """`formulas` rewritten and lowered, as the spec's `optimize:` says."""
    chosen = formulas.spec.optimize
    if not (chosen.rewrite or chosen.lower):
        return formulas

    def optimize(expr: Expr, numbers: frozenset[sympy.Symbol]) -> Expr:
        if chosen.rewrite:
            expr = rewrite(expr)
        if chosen.lower:
            expr = lower(expr, numbers)
        return expr

    return formulas.transformed(optimize)


def optimize_gradients(derived: Derived) -> Derived:
    """`derived` with its gradients rewritten, when the spec's `optimize.rewrite` allows."""
    return rewrite_gradients(derived) if derived.spec.optimize.rewrite else derived
