"""Save-versus-recompute: which tensors backward reads, chosen by the spec's policy.

Receives `Derived` (after the rewrites and the lowering) and a policy; returns `Derived`
whose gradients read the op's outputs instead of recomputing them where the policy says
so. `plan` then saves exactly the inputs and outputs the gradients use.

Two ways to write each gradient are weighed: as derived (from the inputs), and with every
recomputation of an output replaced by the output itself -- the output's formula where it
appears whole (`sigmoid(x)` -> `y`), or a costly call the output holds linearly
(`y = x - tanh(x)` gives `tanh(x) -> x - y`). The second is never slower; it may save more.

Note [save policies]
~~~~~~~~~~~~~~~~~~~~
- `balanced` (the default): least memory among the ways whose estimated time is within
  10% of the fastest;
- `memory`: least memory, then least time;
- `speed`: least time, then least memory.
Memory counts the tensors saved for backward; time is a cost model of the forward and
backward formulas, each distinct subexpression counted once (as CSE will leave it), with
weights from measurements of 1M-element float32 kernels on one CPU thread (`COST`).
"""

from __future__ import annotations

from dataclasses import replace

import sympy
from sympy import Expr

from opgen import functions as fn
from opgen.derive import Derived, Symbols, Variant
from opgen.model import POLICIES

SLACK = 1.10  # `balanced`: at most this much slower than the fastest way

# Relative time of one elementwise kernel (an add or multiply is 1).
COST: dict[type, float] = {
    fn.sigmoid: 2,
    sympy.exp: 6,
    sympy.log: 6,
    fn.log1p: 6,
    fn.expm1: 6,
    sympy.sin: 6,
    sympy.cos: 6,
    sympy.tan: 6,
    sympy.atan: 6,
    sympy.erf: 10,
    sympy.erfc: 10,
    fn.softplus: 10,
    sympy.tanh: 20,
    sympy.sinh: 10,
    sympy.cosh: 10,
}
DEFAULT_COST = 1.0
CALL_COST = 3.0  # functions without an entry (where, native kernels, ...)


def cost(exprs: list[Expr]) -> float:
    """Estimated time of evaluating `exprs` once, sharing common subexpressions."""
    seen: set[sympy.Basic] = set()
    total = 0.0
    for expr in exprs:
        for node in sympy.preorder_traversal(expr):
            if node.is_Atom or node in seen or not isinstance(node, Expr):
                continue
            seen.add(node)
            if isinstance(node, sympy.Function):
                total += COST.get(type(node), CALL_COST)
            else:
                total += DEFAULT_COST * max(1, len(node.args) - 1)
    return total


def _saved(exprs: list[Expr], symbols: Symbols) -> int:
    tensors = set(symbols.tensor_inputs) | set(symbols.outputs.values())
    return len(set().union(*(e.free_symbols for e in exprs)) & tensors) if exprs else 0


def _recomputations(variant: Variant, symbols: Symbols, factors: list[Expr]) -> dict[Expr, Expr]:
    """What in `factors` each output can stand in for (module docstring)."""
    swap: dict[Expr, Expr] = {}
    calls = {c for f in factors for c in f.atoms(sympy.Function) if COST.get(type(c), 0) > DEFAULT_COST}
    for name, expr in variant.inlined:
        output = symbols.outputs[name]
        if not expr.is_Atom:
            swap[expr] = output
        for call in sorted(calls & expr.atoms(sympy.Function), key=sympy.default_sort_key):
            hole = sympy.Dummy("hole")
            linear = expr.xreplace({call: hole})
            coeff = sympy.diff(linear, hole)
            if coeff.is_number and coeff != 0 and not linear.has(call):
                swap.setdefault(call, (output - linear.subs(hole, 0)) / coeff)
    return swap


def _choose(variant: Variant, symbols: Symbols, forward: float, policy: str) -> Variant:
    factors = [c.factor for g in variant.gradients for c in g.contributions]
    swap = _recomputations(variant, symbols, factors)
    replaced = [f.xreplace(swap) for f in factors]
    if replaced == factors:
        return variant
    ways = [(forward + cost(fs), _saved(fs, symbols), k) for k, fs in enumerate((factors, replaced))]
    if policy == "speed":
        best = min(ways, key=lambda w: (w[0], w[1]))
    elif policy == "memory":
        best = min(ways, key=lambda w: (w[1], w[0]))
    else:
        fastest = min(w[0] for w in ways)
        best = min((w for w in ways if w[0] <= SLACK * fastest), key=lambda w: (w[1], w[0]))
    if best[2] == 0:
        return variant
    gradients = tuple(
        replace(g, contributions=tuple(replace(c, factor=c.factor.xreplace(swap)) for c in g.contributions))
        for g in variant.gradients
    )
    return replace(variant, gradients=gradients)


def choose_saved(derived: Derived, policy: str) -> Derived:
    """`derived` with each variant's gradients written as `policy` prefers (Note [save policies])."""
    assert policy in POLICIES, policy
    variants = []
    for variant in derived.variants:
        forward = cost([e for _, e in variant.inlined])
        variants.append(_choose(variant, derived.symbols, forward, policy))
    return replace(derived, variants=tuple(variants))
