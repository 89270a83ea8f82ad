"""Scale-free ratios of reductions: cosine similarity written from its definition.

Receives a product node of a (rewritten bottom-up) formula and the static shapes of its symbols;
returns the same value with each vector divided by its largest entry first, or None. Called by
`opgen.optimize.rewrite` for every product (after the softmax rule of `opgen.optimize.reductions`).

Note [scale-free ratios]
~~~~~~~~~~~~~~~~~~~~~~~~
`sum(u*v, d) / (norm(u, d) * norm(v, d))` does not change when `u` (or `v`) is multiplied by any
`c > 0` constant along `d`. In float32 it overflows long before its value does: `norm` squares
its entries (torch.linalg.vector_norm of entries near 1e20 is inf, F.cosine_similarity's too, which
then gives 0), `sum(u*v)` too, and the product of the norms. So

    sum(u*v, d, k) * norm(u, d, k)**-1 * norm(v, d, k)**-1
        -> sum(U*V, d, k) * norm(U, d, k)**-1 * norm(V, d, k)**-1,   U = scaled(u, d)

(`scaled(u, d)` is `u / stop_gradient(amax(abs(u), d, keepdim=true))`: Note [scaled vectors] in
opgen.nodes.scaled)

with every entry of `U` and `V` in [-1, 1]: finite at 1e20 and at 1e-25 (where the squares underflow
to a zero norm, 0/0). The scale is a stop-gradient: the ratio is the same for every scale, so its
derivative in the scale is 0 (Euler: degree-0 homogeneous), and the derivatives of every order in `u`
with the scale held are the formula's own. At a zero vector the scale is 0 and the value NaN, as the formula as
written is (0/0); F.cosine_similarity clamps each norm at eps and gives 0 there.
"""

from __future__ import annotations

import sympy
from sympy import Expr

from opgen.formula.tensor import ReduceNorm, ReduceSum
from opgen.nodes.scaled import scaled
from opgen.optimize import reductions
from opgen.optimize.reductions import Shapes


def _scaled(u: Expr, norm: ReduceNorm) -> Expr:
    return scaled(u, norm.args[1])


def _inverse_norms(node: sympy.Mul) -> list[ReduceNorm]:
    found = []
    for factor in node.args:
        base, power = factor.as_base_exp()
        if power == -1 and isinstance(base, ReduceNorm) and not base.every_dim:
            found.append(base)
    return found


def cosine(node: sympy.Mul) -> Expr | None:
    """`sum(u*v, d) / (norm(u, d) * norm(v, d)) * rest` with each of `u`, `v` divided by its largest
    entry (Note [scale-free ratios])."""
    norms = _inverse_norms(node)
    for total in node.args:
        if not isinstance(total, ReduceSum) or total.operand.has(scaled):
            continue
        for i, first in enumerate(norms):
            for second in norms[i + 1 :]:
                same = first.args[1:] == second.args[1:] == total.args[1:]
                u, v = first.operand, second.operand
                if not same or u == v or sympy.expand(total.operand - u * v) != 0:
                    continue
                big, little = _scaled(u, first), _scaled(v, second)
                rest = [f for f in node.args if f not in (total, first**-1, second**-1)]
                ratio = ReduceSum(big * little, *total.args[1:]) / (
                    ReduceNorm(big, *first.args[1:]) * ReduceNorm(little, *second.args[1:])
                )
                return sympy.Mul(ratio, *rest)
    return None


def product(node: sympy.Mul, shapes: Shapes | None) -> Expr | None:
    """The product rules over reductions: the softmax (`opgen.optimize.reductions`), then `cosine`."""
    return reductions.product(node, shapes) or cosine(node)
