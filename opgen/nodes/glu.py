"""The gated linear unit as PyTorch's kernels: its nodes with their shapes, gradient, formulas and spellings.

`Glu` is `first_half(u, d) * sigmoid(second_half(u, d))`, the two halves of `u` along `d`, printed
as `F.glu(u, d)` (the optimizer finds it: opgen.optimize.gates). Its gradient (`vjp_pushes`) is
`GluBackward`, printed as `aten.glu_backward(grad, u, d)` (Note [glu under torch.func]).

Note [the dimension of a gate]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The kernels take `u` and `dim` alone; the halves (the formula forward mode and torch.func
differentiate) also need the name of the dimension cut. `Glu` holds it as a `Str`, not as its
size symbol, so that forward, which calls `F.glu`, does not read a size it never uses;
`GluBackward` holds the size symbol: its formula, under torch.func, reads it in backward.

Note [glu under torch.func]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
`aten.glu_backward` has second derivatives (`glu_double_backward`) and a forward-mode derivative
(`glu_backward_jvp`), but no batching rule for the latter (torch 2.13): `torch.func.hessian`
and `jacfwd` over a gradient fall back to a loop over the batch, with a warning. Under torch.func
transforms backward takes the gradient's formula instead, `F.pad` of the two halves' gradients,
which every transform handles; a plain backward and double backward (`create_graph`) run the kernel.
"""

from __future__ import annotations

from fractions import Fraction

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn
from opgen.formula import slicing
from opgen.formula.tensor import Shape, TensorOp, dim_size, shape_of
from opgen.nodes.base import Drop, Lowered, Shaped, Shown, Spelled, TorchCode, UnderTransforms


class _GateOp(Shaped, TensorOp):
    """A node over the halves of `u` along `dim`: its last four arguments are (u, dim, the dimension
    cut, the fraction of it `u` holds there), as a `Slice`'s (Note [the dimension of a gate])."""

    def half(self, k: int) -> Expr:
        """The first (k = 0) or second (k = 1) half of `u`."""
        return half(self.args[-5:-1], k)

    @property
    def carried(self) -> bool:
        """Whether the gradient may carry batch dimensions `u` lacks (Note [carried batch dimensions] in
        opgen.derive.vjp): another input has `...` too, and the kernel wants the gradient summed to its output."""
        return bool(self.args[-1])


class Glu(Lowered, Spelled, Shown, _GateOp):
    """`F.glu(u, dim)`: args (u, dim, name of the dimension (a `Str`), whole, carried)."""

    nargs = 5

    def elementary(self) -> Expr:
        return self.half(0) * fn.sigmoid(self.half(1))

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return shape_of(self.half(0), table)

    def vjp_pushes(self, grad: Expr) -> list[tuple[Expr, Expr]]:
        """(part, its gradient): `aten.glu_backward`."""
        u, dim, base, whole, carried = self.args
        return [(u, GluBackward(grad, u, dim, dim_size(str(base)), whole, carried))]

    def without(self, absent: frozenset[sympy.Symbol], drop: Drop) -> Expr | None:
        """Absent when `u` uses an absent `Tensor?` input: a product of it."""
        return None if self.args[0].free_symbols & absent else self

    def _torch(self, printer: TorchCode) -> str:
        return f"{printer.torch}.nn.functional.glu({printer._print(self.args[0])}, {int(self.args[1])})"


class GluBackward(UnderTransforms, Shown, _GateOp):
    """`aten.glu_backward(g, u, dim)`, the gradient of `u`: args (g, u, dim, size, whole, carried)."""

    nargs = 6

    @classmethod
    def eval(cls, g: Expr, *args: sympy.Basic) -> Expr | None:
        return S.Zero if g == 0 else None  # Note [kernels of a zero gradient] in opgen.formula.tensor

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return shape_of(self.args[1], table)

    def kernel_call(self, printer: TorchCode) -> tuple[str, list[str]]:
        """`aten.glu_backward` and its arguments, printed."""
        g, u, dim = self.args[:3]
        grad = printer._print(g)
        if self.carried:  # summed to the output's shape: the kernel wants it
            d, shape = int(dim), f"{printer._postfix(u)}.shape"
            after = f", *{shape}[{d + 1}:]" if d != -1 else ""
            grad = f"{printer._postfix(g)}.sum_to_size(*{shape}[:{d}], {shape}[{d}] // 2{after})"
        return f"{printer.torch}.ops.aten.glu_backward", [grad, printer._print(u), str(int(dim))]

    def transform_formulas(self) -> list[tuple[Expr | None, Expr | None]]:
        """The gradient as a formula of plain torch ops (Note [glu under torch.func])."""
        g = self.args[0]
        first, second = self.half(0), self.half(1)
        gate = fn.sigmoid(second)
        return [(_pad(g * gate, first) + _pad(g * first * gate * (1 - gate), second), None)]

    def elementary(self) -> Expr:
        """The gradient of `u` as a formula: the two halves' gradients, each in its place."""
        ((formula, _),) = self.transform_formulas()
        assert formula is not None
        return formula


def half(whole: tuple[sympy.Basic, ...], k: int) -> Expr:
    """The first (k = 0) or second (k = 1) half of `u` for `whole` = (u, dim, the dimension's name (a `Str`)
    or size, fraction of it `u` holds)."""
    u, dim, base, fraction = whole
    rational = sympy.Rational(fraction)
    w = Fraction(int(rational.p), int(rational.q))
    name = str(base.name).split(":", 1)[-1]
    cut = slicing.Cut(int(dim), name, w * k / 2, w * (k + 1) / 2, w)
    return slicing.make(slicing.Slice, u, cut)


def _pad(grad: Expr, part: Expr) -> Expr:
    assert isinstance(part, slicing.Slice)
    return slicing.make(slicing.Pad, grad, part.cut)
