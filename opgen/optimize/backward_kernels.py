"""The backward kernels of the kernel IR: a gradient `g * prime(u)` as one PyTorch backward kernel.

`backward_kernel` turns a gradient `g * prime(u)` of a primitive (opgen.optimize.kernels) into
the node of PyTorch's backward kernel (`silu_backward(g, u)`), or `g * s * (1 - s)` of a saved
sigmoid into `sigmoid_backward(g, s)` (Note [native backward kernels] in opgen.optimize.kernels).
Like the primitives, the nodes hold no code: opgen.emit.kernel_print prints them.

A kernel needs the incoming gradient, which the plan's factors leave out; so before the
plan's common-subexpression elimination, `kernel_factors` writes out every derivative that
cannot become a kernel (one shared between gradients, or one of several terms): the
elimination then sees its parts like those of any formula, and a kernel's arguments too.
"""

from __future__ import annotations

from typing import ClassVar

import sympy
from sympy import Expr, S

from opgen.formula.functions import where
from opgen.nodes.base import Node
from opgen.optimize.kernels import PRIMITIVES, _Prime, _Primitive


class KernelBackward(Node, sympy.Function):
    """`g * prime(u)` by a PyTorch backward kernel: `args` = (g, *the primitive's args)."""

    is_real = True
    primitive: ClassVar[type[_Primitive]]

    @classmethod
    def eval(cls, g: Expr, *args: Expr) -> Expr | None:
        return S.Zero if g == 0 else None  # Note [kernels of a zero gradient] in opgen.formula.tensor

    def elementary(self) -> Expr:
        g, *args = self.args
        return g * _Prime(self.primitive.__name__, *args).elementary()

    def _eval_derivative(self, s: sympy.Symbol) -> Expr:
        return sympy.diff(self.elementary(), s)


# `<primitive>_backward` for each primitive: printed by the printer's `_print_<primitive>_backward`.
BACKWARD: dict[type[_Primitive], type[KernelBackward]] = {
    p: type(f"{name}_backward", (KernelBackward,), {"primitive": p}) for name, p in PRIMITIVES.items()
}


class OutputBackward(Node, sympy.Function):
    """`g * f'` in terms of a saved output of `f`: args (g, output); exactly PyTorch's kernel."""

    is_real = True

    @classmethod
    def eval(cls, g: Expr, output: Expr) -> Expr | None:
        return S.Zero if g == 0 else None  # Note [kernels of a zero gradient] in opgen.formula.tensor

    def _eval_derivative(self, s: sympy.Symbol) -> Expr:
        return sympy.diff(self.elementary(), s)


class sigmoid_backward(OutputBackward):  # noqa: N801
    def elementary(self) -> Expr:
        g, s = self.args
        return g * s * (1 - s)


class tanh_backward(OutputBackward):  # noqa: N801
    def elementary(self) -> Expr:
        g, t = self.args
        return g * (1 - t**2)


class threshold_backward(OutputBackward):  # noqa: N801
    """`g` where the saved output of `max(0, u)` is positive, else 0: relu's backward kernel."""

    def elementary(self) -> Expr:
        g, out = self.args
        return where(sympy.StrictGreaterThan(out, 0), g, S.Zero)


def _factors(expr: Expr) -> tuple[Expr, ...]:
    return expr.args if isinstance(expr, sympy.Mul) else (expr,)


def backward_kernel(total: Expr, tensors: frozenset[sympy.Symbol]) -> Expr | None:
    """The kernel node computing the gradient `total` (`g * prime(u)`, ...), or None.

    `tensors` are the symbols that hold tensors: an output kernel reads a saved tensor.
    """
    factors = _factors(total)
    for k, factor in enumerate(factors):
        rest = [f for i, f in enumerate(factors) if i != k]
        for s in rest:
            if s.is_Symbol and s in tensors and factor == 1 - s:
                return sigmoid_backward(sympy.Mul(*[f for f in rest if f is not s]), s)
        if isinstance(factor, sympy.Add) and len(factor.args) == 2 and S.One in factor.args:
            other = factor.args[0] if factor.args[1] == S.One else factor.args[1]
            base, power = (-other).as_base_exp()
            if power == 2 and base.is_Symbol and base in tensors:
                return tanh_backward(sympy.Mul(*rest), base)
    primes = [f for f in factors if isinstance(f, _Prime)]
    if len(primes) != 1:
        return None
    prime = primes[0]
    return BACKWARD[prime.primitive](total / prime, *prime.args[1:])


def written_out(expr: Expr) -> Expr:
    """`expr` with each derivative of a primitive as its one-call form or its formula."""
    return expr.replace(
        lambda e: isinstance(e, _Prime), lambda e: e.primitive(*e.args[1:]).prime_form() or e.elementary()
    )


def kernel_factors(factors: list[list[Expr]], negations: bool = False) -> list[list[Expr]]:
    """The factors of each gradient's contributions, derivatives that cannot be kernels written out.

    A derivative stays a node where it is a factor of the only contribution of its gradient
    and appears nowhere else: there backward computes `g * prime(u)` by the kernel. With
    `negations`, also where it is the whole factor of two gradients, once negated (a loss's input
    and target): backward computes the kernel once for both (Note [gradients that negate another]).
    """
    count: dict[Expr, int] = {}
    for group in factors:
        for factor in group:
            for prime in factor.atoms(_Prime):
                count[prime] = count.get(prime, 0) + 1
    kept: set[Expr] = set()
    for group in factors:
        if len(group) == 1 and len(group[0].atoms(_Prime)) == 1:
            kept |= {f for f in _factors(group[0]) if isinstance(f, _Prime) and count[f] == 1}
    whole = [group[0] for group in factors if len(group) == 1]
    if negations:
        kept |= {f for f in whole if isinstance(f, _Prime) and count[f] == 2 and -f in whole}
    return [
        [f.replace(lambda e: isinstance(e, _Prime) and e not in kept, written_out) for f in group] for group in factors
    ]
