"""Optimize stage: formulas -> the same values computed stably and by PyTorch's native kernels.

Receives `Formulas` (before `opgen.derive.gradients`) or `Derived` (after it); returns the same kind,
changed as the spec's `optimize:` allows: the stable rewrites (`opgen.optimize.rewrite`) and the
lowering to native kernels (`opgen.optimize.lower`) on every formula before it is differentiated,
so gradients come from stable functions and native backward kernels, and the rewrites
again on every derived gradient. The pipeline calls these around `derive`; nothing here
calls another stage.
"""

from __future__ import annotations

from dataclasses import replace

import sympy
from sympy import Expr

from opgen.derive.gradients import Derived
from opgen.derive.jvp import OutputTangent, Tangents, Term
from opgen.formula.read import Formulas
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


def _through_lets(formulas: Formulas) -> Formulas:
    """Definitions whose stable form spans `let`s (`e: exp(x)`, `y: e / sum(e, ...)`) written inline.

    Note [stable forms through lets]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    The rewrites see one formula at a time, and a user names pieces with `let`s. A definition
    is read with the lets it uses written out, each let rewritten on its own; where a stable
    rewrite still applies to that (one that spans a let: softmax, log_softmax, logsumexp of
    Note [stable rewrites over reductions], logsigmoid, softplus, ... of Note [stable
    rewrites]), the rewritten inlined form replaces the definition, with any let it still
    contains whole folded back to its name. So focal loss's
    `p: sigmoid(logits)`, `ce: -(target * log(p) + (1 - target) * log(1 - p))` computes `ce`
    with two logsigmoids, finite at any logit, and `p` still where `p` is used as it is. A let
    no formula uses any more is not computed (the forward drops it).
    """
    lets = formulas.symbols.lets
    if not any(n in lets for n in formulas.definitions):
        return formulas
    alone: dict[sympy.Symbol, Expr] = {}  # each let with the lets before it, each rewritten on its own
    for name, expr in formulas.definitions.items():
        if name in lets:
            alone[lets[name]] = rewrite(expr, formulas.shapes).xreplace(alone)

    def choose(full: Expr, written: Expr) -> Expr | None:
        if full == written:  # no let: nothing to gain
            return None
        separately = rewrite(written, formulas.shapes).xreplace(alone)
        return rewrite(full, formulas.shapes) if rewrite(separately, formulas.shapes) != separately else None

    return through_lets(formulas, choose)


def optimize_gradients(derived: Derived) -> Derived:
    """`derived` with its gradients rewritten, when the spec's `optimize.rewrite` allows."""
    return spread_gradients(rewrite_gradients(derived)) if derived.spec.optimize.rewrite else derived


def optimize_tangents(tangents: Tangents, derived: Derived) -> Tangents:
    """`tangents` (of `derived`'s op) with every term rewritten, when the spec's `optimize.rewrite` allows;
    a term the rewrites make 0 goes."""
    if not derived.spec.optimize.rewrite:
        return tangents

    def rewritten(out: OutputTangent | None) -> OutputTangent | None:
        if out is None:
            return None
        terms = (Term(t.input, rewrite(t.value)) for t in out.terms)
        return replace(out, terms=tuple(t for t in terms if t.value != 0))

    variants = tuple(replace(v, outputs=tuple(rewritten(out) for out in v.outputs)) for v in tangents.variants)
    return replace(tangents, variants=variants)
