"""Plan stage, part of `opgen.plan.backward`: the kink every gradient shares, computed once.

Receives the gradient factors of one variant (each `grad_<output> * factor`) and returns them with
the part they share taken out as a new symbol, and that symbol with its product, incoming gradient
included, for the plan's common-subexpression elimination (`_named_shares` in opgen.plan.backward).

Note [shared kinks]
~~~~~~~~~~~~~~~~~~~
A kink of several inputs, the hinge `max(0, 1 - x*y)`, gives each input a gradient
`grad * where(1 - x*y > 0, -y, 0)`: a `where` per gradient, the negation of the other input in each,
and CSE cannot share `grad * where(c, -1, 0)`, which is written in none of them. Each factor
`where(c, k*a_i, 0)` with the same condition `c` and number `k` becomes `share * a_i`, with
`share = where(c, k*grad, 0)` computed once for all, as PyTorch's autograd computes the kink's
backward once and multiplies it by each input's own part. Where the output is that kink,
`max(0, u)`, its condition `u > 0` is read from the saved output, `out > 0`, and `u` is not computed
again, and `where(out > 0, k*grad, 0)` is relu's backward kernel, `threshold_backward`. This applies
only where each gradient is its one output's incoming gradient times a factor (`_may_share_negations`);
the factors after sharing hold the incoming gradient (their output is None).
"""

from __future__ import annotations

import sympy
from sympy import Expr

from opgen.derive.gradients import Derived, Variant
from opgen.formula.functions import maximum, where
from opgen.formula.tensor import SumTo
from opgen.nodes.kernels import threshold_backward


def kink_of_output(derived: Derived, variant: Variant) -> dict[Expr, Expr]:
    """`u > 0` -> `out > 0` for each output `out = max(0, u)` whose `u` is not a plain symbol."""
    conditions: dict[Expr, Expr] = {}
    for name, expr in variant.outputs:
        if not isinstance(expr, maximum) or sympy.S.Zero not in expr.args[:2]:
            continue
        inner = expr.args[1] if expr.args[0] == 0 else expr.args[0]
        if not inner.is_Atom:
            conditions[sympy.StrictGreaterThan(inner, 0)] = sympy.StrictGreaterThan(derived.symbols.outputs[name], 0)
    return conditions


def _kink(expr: Expr) -> tuple[Expr, Expr] | None:
    """(value, condition) of `where(condition, value, 0)`, or None."""
    if isinstance(expr, SumTo):
        return None  # fitted to a shape of its own: its factor and another's do not multiply alike
    if isinstance(expr, where) and expr.args[2] == 0:
        condition, value, _ = expr.args
        return value, condition
    return None


def shared_kinks(
    factors: list[Expr], outputs: list[str | None], grads: dict[str, sympy.Symbol], conditions: dict[Expr, Expr]
) -> tuple[list[Expr], list[str | None], list[tuple[sympy.Symbol, Expr]]]:
    """The factors, with those of one kink (Note [shared kinks]) each `share * a_i`; their outputs None
    there; and the shared symbols with their products. `conditions` rewrites a kink's condition."""
    kinks: dict[int, tuple[Expr, Expr]] = {}
    by_condition: dict[tuple[str, Expr], list[int]] = {}
    for i, (factor, output) in enumerate(zip(factors, outputs, strict=True)):
        kink = _kink(factor) if output in grads else None
        if kink is not None and output is not None:
            kinks[i] = kink
            by_condition.setdefault((output, kink[1]), []).append(i)
    factors, outputs = list(factors), list(outputs)
    shared: list[tuple[sympy.Symbol, Expr]] = []
    for (output, condition), members in by_condition.items():
        if len(members) < 2:
            continue
        values = [kinks[i][0] for i in members]
        coefficients = {v.as_coeff_Mul()[0] for v in values}
        k = coefficients.pop() if len(coefficients) == 1 else sympy.S.One
        symbol = sympy.Dummy(f"kink{len(shared)}", real=True)
        if condition in conditions:  # the output's own kink: relu's backward kernel on the saved output
            kink = threshold_backward(k * grads[output], conditions[condition].lhs)
        else:
            kink = where(condition, k * grads[output], 0)
        shared.append((symbol, kink))
        for i, value in zip(members, values, strict=True):
            factors[i], outputs[i] = symbol * (value / k), None
    return factors, outputs, shared
