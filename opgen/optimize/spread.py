"""Gradients of whole reductions of plain Tensors, spread without a full-size copy where they can be.

Note [spread gradients]
~~~~~~~~~~~~~~~~~~~~~~~
The gradient of `mean(f(x, t))` over every dimension of plain Tensors reaches `f` as
`BroadcastTo(g, size:@x,t)`: the incoming scalar expanded to the broadcast shape of the inputs
(Note [counts of unknown shapes] in opgen.formula.dims). Printed as it stands, a product
`2*(x - t) * BroadcastTo(g, S) / count` divides the expanded gradient by the count, which makes
a full-size tensor of copies of one number before the product reads it: a pass and a buffer as
large as the inputs, for nothing. In a product:

- every factor that is a plain number at run time (a count, a float input, a constant) goes
  inside the expand, where it costs one scalar operation: `BroadcastTo(g / count, S)`;
- when the other factors are elementwise in exactly the plain Tensors whose broadcast `S` is,
  their product already has the shape `S`, and `g` broadcasts against it as it is: the expand
  goes. The scalar stays one node (`Scalar`), printed in brackets, so that it is computed on
  its own before it meets the full-size factors: `(2*x - 2*t) * (g / count)`, not
  `g * (2*x - 2*t) / count`, which divides a full-size product.

Both are the same values; the shape of the product is unchanged.
"""

from __future__ import annotations

from dataclasses import replace

import sympy
from sympy import Expr

from opgen.derive.gradients import Derived
from opgen.formula.dims import counted
from opgen.formula.tensor import BroadcastTo, Shape, TensorOp, shape_of
from opgen.nodes.base import Shaped


class Scalar(Shaped, sympy.Function):
    """A product of the incoming gradient of a whole reduction and plain numbers: one element,
    computed before it meets full-size tensors (Note [spread gradients]); its value is its argument's."""

    nargs = 1
    is_real = True

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return shape_of(self.args[0], table)

    def fdiff(self, argindex: int = 1) -> Expr:
        return sympy.S.One

    def _eval_evalf(self, prec: int) -> Expr | None:
        return self.args[0].evalf(prec)


def _plain_tensors(expr: Expr, shapes: dict[sympy.Symbol, Shape]) -> frozenset[str] | None:
    """The plain Tensors `expr` is elementwise in (their broadcast is its shape), or None if it holds a
    tensor operation or a tensor of declared shape."""
    if any(isinstance(node, TensorOp) for node in sympy.preorder_traversal(expr)):
        return None
    tensors = [s for s in expr.free_symbols if isinstance(s, sympy.Symbol) and s in shapes]
    if any(shapes[s] is not None for s in tensors):
        return None
    return frozenset(s.name for s in tensors)


def _is_number(expr: Expr, shapes: dict[sympy.Symbol, Shape]) -> bool:
    return not (expr.free_symbols & shapes.keys()) and not expr.has(TensorOp)


def _spread_product(node: sympy.Mul, shapes: dict[sympy.Symbol, Shape]) -> Expr | None:
    spread = [f for f in node.args if isinstance(f, BroadcastTo)]
    if len(spread) != 1:
        return None
    (target,) = spread
    grad, shape = target.args
    numbers = [f for f in node.args if f is not target and _is_number(f, shapes)]
    rest = [f for f in node.args if f is not target and f not in numbers]
    if not numbers and not rest:
        return None
    inside = sympy.Mul(grad, *numbers)
    names = counted(str(shape).removeprefix("size:"))
    reached = _plain_tensors(sympy.Mul(*rest), shapes) if rest else None
    if names is not None and reached is not None and reached == frozenset(names):
        return sympy.Mul(Scalar(inside) if numbers else inside, *rest)
    if not numbers:
        return None
    return sympy.Mul(BroadcastTo(inside, shape), *rest)


def spread(expr: Expr, shapes: dict[sympy.Symbol, Shape]) -> Expr:
    """`expr` with each product holding an expanded gradient rewritten (Note [spread gradients])."""
    if not expr.has(BroadcastTo):
        return expr

    def rule(node: sympy.Basic) -> sympy.Basic:
        found = _spread_product(node, shapes) if isinstance(node, sympy.Mul) else None
        return found if found is not None else node

    return sympy.bottom_up(expr, rule)


def spread_gradients(derived: Derived) -> Derived:
    """`derived` with its whole-reduction gradients spread without copies (Note [spread gradients])."""
    shapes = derived.shapes
    variants = []
    for variant in derived.variants:
        gradients = tuple(
            replace(g, contributions=tuple(replace(c, factor=spread(c.factor, shapes)) for c in g.contributions))
            for g in variant.gradients
        )
        variants.append(replace(variant, gradients=gradients))
    return replace(derived, variants=tuple(variants))
