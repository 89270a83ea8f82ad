"""The gated linear unit: where the optimizer puts its kernel.

`lower_gates` replaces each product `first_half(u, d) * sigmoid(second_half(u, d))` (the two halves
of the same tensor `u` along the same dimension, `x[..., :D // 2] * sigmoid(x[..., D // 2:])` or
`chunk(x, 2, dim=-1)[0] * sigmoid(chunk(x, 2, dim=-1)[1])`, lets inlined) by the node `Glu`
(opgen.nodes.glu), printed as `F.glu(u, d)`; other factors of the product stay around it.

Note [exact gates]
~~~~~~~~~~~~~~~~~~
Only the kernel's own function is lowered: the gated half is the first, the gate the sigmoid of the
second, and together they are the whole of `u` along `d`. The sigmoid of the first half, halves of
two different tensors, halves of a part (`x[..., :D // 4] * sigmoid(x[..., D // 4:D // 2])`), thirds
and SwiGLU's silu gate stay formulas: PyTorch has no kernel for them, and a narrowed copy of `u` to
feed `F.glu` costs what the kernel saves.
"""

from __future__ import annotations

import sympy
from sympy import Expr
from sympy.core.symbol import Str

from opgen.formula import functions as fn
from opgen.formula import slicing
from opgen.formula.read import Formulas
from opgen.formula.tensor import BATCH
from opgen.nodes.glu import Glu, half
from opgen.optimize.lets import lower_through_lets

# -- matching ------------------------------------------------------------------------------------


def _half_of(expr: Expr, k: int) -> tuple[Expr, ...] | None:
    """(u, dim, size, whole) when `expr` is exactly the `k`-th half of `u` along a dimension."""
    if not isinstance(expr, slicing.Slice) or len(expr.args) != 6:
        return None
    cut = expr.cut
    if (cut.start, cut.stop) != (cut.whole * k / 2, cut.whole * (k + 1) / 2):
        return None
    u, dim, _, _, _, whole = expr.args
    return u, dim, Str(cut.base), whole


def _gated(node: sympy.Mul, batched: frozenset[sympy.Symbol]) -> Expr:
    """`node` with each pair of factors `first_half(u) * sigmoid(second_half(u))` one `Glu` (Note [exact gates])."""
    factors = list(node.args)
    for gate in node.args:
        if not isinstance(gate, fn.sigmoid):
            continue
        whole = _half_of(gate.args[0], 1)
        if whole is None:
            continue
        first = half(whole, 0)
        if first in factors and gate in factors:
            factors.remove(first)
            factors.remove(gate)
            carried = sympy.Integer(bool(batched - whole[0].free_symbols))
            factors.append(Glu(*whole, carried))
    return sympy.Mul(*factors) if len(factors) != len(node.args) else node


def gated(expr: Expr, batched: frozenset[sympy.Symbol]) -> Expr:
    """`expr` with every exact gated linear unit in it a `Glu` node, innermost first; `batched`: the
    inputs that may have batch dimensions."""
    if expr.is_Atom or not expr.args:
        return expr
    args = tuple(gated(a, batched) if isinstance(a, Expr) else a for a in expr.args)
    node = expr.func(*args) if args != expr.args else expr
    return _gated(node, batched) if isinstance(node, sympy.Mul) else node


def lower_gates(formulas: Formulas) -> Formulas:
    """Each definition that holds a gated linear unit (with the lets it uses written out) with its node."""
    inputs = formulas.symbols.inputs.values()
    batched = frozenset(s for s in inputs if (shape := formulas.shapes.get(s, ())) is None or BATCH in shape)
    return lower_through_lets(
        formulas, lambda e: e.has(fn.sigmoid) and e.has(slicing.Slice), lambda e: gated(e, batched), Glu
    )
