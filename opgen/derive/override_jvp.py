"""Forward mode of a gradient override: the Jacobian an override `grad * h` stands for.

Used by opgen.derive.jvp for each overridden input: receives the override (a `Gradient`) and the
names of the differentiable outputs; returns each output's `h_o`, or raises `Refused` when the
override has no Jacobian.

Note [jvp of an override]
~~~~~~~~~~~~~~~~~~~~~~~~~
An override `x: grad * h` (linear in the incoming gradients: `sum_o grad_o * h_o`) says the
Jacobian of each output `o` with respect to `x` is, as far as backward is concerned, `h_o`
elementwise. Forward mode uses the same Jacobian: the tangent of `o` along `x` is
`h_o * tangent_x` (broadcast as the forward broadcasts), so `jvp` and `vjp` are transposes of
each other, as for any PyTorch op (for `sign_ste`: `(abs(x) <= 1) * tangent_x`). For a `Tensor[]`
input, `sum(grad * h)` is the same override, the sum written out (PACT's clip), and so is a sum of
such sums times numbers (`-sum(grad * h) / k`, a learnable threshold's gradient scaled down). An override
that is not linear in the incoming gradients (`clamp(grad, -c, c)`) or uses a tensor
operation of it has no such Jacobian: forward mode along that input is refused at call time,
naming the spec and the input.
"""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.derive.gradients import Derived, Gradient
from opgen.formula.tensor import ReduceSum, TensorOp


class Refused(Exception):
    """Forward mode along one input cannot be derived; the message says why."""


def _scalar_sums(expr: Expr, grads: set[sympy.Symbol], tensors: frozenset[sympy.Symbol]) -> Expr:
    """The override of a scalar input with each `c * sum(grad * h)` as `c * grad * h`, summed to the input's
    shape as any override is (PACT's clip, `-sum(grad * h)` of a learnable threshold), `c` a number; as
    written where a term is anything else."""
    terms = []
    for term in sympy.Add.make_args(expr):
        coeff, total = term.as_independent(ReduceSum, as_Add=False)
        if not (isinstance(total, ReduceSum) and total.every_dim and total.operand.free_symbols & grads):
            return expr
        if coeff.free_symbols & tensors:  # `t * sum(grad * h)` is not `sum(t * grad * h)`
            return expr
        terms.append(coeff * total.operand)
    return sympy.Add(*terms)


def override_terms(derived: Derived, gradient: Gradient, names: list[str]) -> dict[str, Expr]:
    """Each output's `h_o` of an override `sum_o grad_o * h_o` (Note [jvp of an override])."""
    grads = {name: derived.symbols.grads[name] for name in names}
    expr = gradient.contributions[0].factor if gradient.contributions else S.Zero
    if derived.shapes.get(derived.symbols.inputs[gradient.input]) == ():
        expr = _scalar_sums(expr, set(grads.values()), derived.symbols.tensors)
    linear = expr.atoms(TensorOp) == {op for op in expr.atoms(TensorOp) if not (op.free_symbols & set(grads.values()))}
    factors = {name: sympy.diff(expr, g) for name, g in grads.items()} if linear else {}
    rest = expr - sum((g * factors[name] for name, g in grads.items()), S.Zero) if linear else expr
    at_zero = rest.xreplace({g: S.Zero for g in grads.values()}) if linear else expr
    if not linear or any(f.free_symbols & set(grads.values()) for f in factors.values()) or at_zero != 0:
        raise Refused(
            "its gradient override is not `grad * h` for some h (linear in the incoming gradient), so it has no"
            " Jacobian to push a tangent through; use reverse mode, or write the override as grad * h"
        )
    return {name: f for name, f in factors.items() if f != 0}
