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
from opgen.formula.tensor import LogSoftmax, ReduceLogSumExp, ReduceSum, Softmax
from opgen.optimize.gates import lower_gates
from opgen.optimize.lets import through_lets
from opgen.optimize.lower import lower
from opgen.optimize.norms import lower_norms
from opgen.optimize.rewrite import rewrite, rewrite_gradients
from opgen.optimize.spread import spread_gradients


def optimize_formulas(formulas: Formulas) -> Formulas:
    """`formulas` rewritten and lowered, as the spec's `optimize:` says."""
    chosen = formulas.spec.optimize
    if not (chosen.rewrite or chosen.lower):
        return formulas

    def optimize(expr: Expr, numbers: frozenset[sympy.Symbol]) -> Expr:
        if chosen.rewrite:
            expr = rewrite(expr, formulas.shapes)
        if chosen.lower:
            expr = lower(expr, numbers)
        return expr

    if chosen.rewrite:
        formulas = _through_lets(formulas)
    formulas = formulas.transformed(optimize)
    return lower_gates(lower_norms(formulas)) if chosen.lower else formulas


_STABLE_NODES = (Softmax, LogSoftmax, ReduceLogSumExp)


def _stable_nodes(expr: Expr) -> int:
    return sum(1 for node in sympy.preorder_traversal(expr) if isinstance(node, _STABLE_NODES))


def _through_lets(formulas: Formulas) -> Formulas:
    """Definitions whose stable form spans `let`s (`e: exp(x)`, `y: e / sum(e, ...)`) written inline.

    Note [stable forms through lets]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    The rewrites see one formula at a time, and a user names pieces with `let`s. A definition
    is read with the lets it uses written out; where that gives more stable reduction nodes
    (softmax, log_softmax, logsumexp: Note [stable rewrites over reductions]) than it has as
    written, the inlined form replaces it, with any let it still contains whole folded back to
    its name. A let no formula uses any more is not computed (the forward drops it).
    """
    if not any(n in formulas.symbols.lets for n in formulas.definitions):
        return formulas

    def choose(full: Expr, written: Expr) -> Expr | None:
        if full == written or not full.has(ReduceSum, ReduceLogSumExp):  # no reduction: nothing to gain
            return None
        stable = rewrite(full, formulas.shapes)
        return stable if _stable_nodes(stable) > _stable_nodes(rewrite(written, formulas.shapes)) else None

    return through_lets(formulas, choose)


def optimize_gradients(derived: Derived) -> Derived:
    """`derived` with its gradients rewritten, when the spec's `optimize.rewrite` allows."""
    return spread_gradients(rewrite_gradients(derived)) if derived.spec.optimize.rewrite else derived
