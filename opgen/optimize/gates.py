"""The gated linear unit as PyTorch's kernels: the tensor nodes, and the lowering that finds them.

`lower_gates` replaces each product `first_half(u, d) * sigmoid(second_half(u, d))` (the two halves
of the same tensor `u` along the same dimension, `x[..., :D // 2] * sigmoid(x[..., D // 2:])` or
`chunk(x, 2, dim=-1)[0] * sigmoid(chunk(x, 2, dim=-1)[1])`, lets inlined) by the node `Glu`,
printed as `F.glu(u, d)`; other factors of the product stay around it. Its gradient (`vjp_pushes`)
is `GluBackward`, printed as `aten.glu_backward(grad, u, d)` (Note [glu under torch.func]).

Note [exact gates]
~~~~~~~~~~~~~~~~~~
Only the kernel's own function is lowered: the gated half is the first, the gate the sigmoid of the
second, and together they are the whole of `u` along `d`. The sigmoid of the first half, halves of
two different tensors, halves of a part (`x[..., :D // 4] * sigmoid(x[..., D // 4:D // 2])`), thirds
and SwiGLU's silu gate stay formulas: PyTorch has no kernel for them, and a narrowed copy of `u` to
feed `F.glu` costs what the kernel saves.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import sympy
from sympy import Expr, S
from sympy.core.symbol import Str

from opgen.formula import functions as fn
from opgen.formula import slicing
from opgen.formula.read import Formulas
from opgen.formula.tensor import BATCH, Shape, TensorOp, dim_size, shape_of
from opgen.nodes.base import Lowered, Shaped
from opgen.optimize.lets import lower_through_lets


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


class Glu(Lowered, _GateOp):
    """`F.glu(u, dim)`: args (u, dim, name of the dimension (a `Str`), whole, carried).

    Note [the dimension of a gate]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    The kernels take `u` and `dim` alone; the halves (the formula forward mode and torch.func
    differentiate) also need the name of the dimension cut. `Glu` holds it as a `Str`, not as its
    size symbol, so that forward, which calls `F.glu`, does not read a size it never uses;
    `GluBackward` holds the size symbol: its formula, under torch.func, reads it in backward.
    """

    nargs = 5

    def elementary(self) -> Expr:
        return self.half(0) * fn.sigmoid(self.half(1))

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return shape_of(self.half(0), table)

    def vjp_pushes(self, grad: Expr) -> list[tuple[Expr, Expr]]:
        """(part, its gradient): `aten.glu_backward`."""
        u, dim, base, whole, carried = self.args
        return [(u, GluBackward(grad, u, dim, dim_size(str(base)), whole, carried))]

    def without(
        self, absent: frozenset[sympy.Symbol], drop: Callable[[Expr, frozenset[sympy.Symbol]], Expr | None]
    ) -> Expr | None:
        """Absent when `u` uses an absent `Tensor?` input: a product of it."""
        return None if self.args[0].free_symbols & absent else self


class GluBackward(_GateOp):
    """`aten.glu_backward(g, u, dim)`, the gradient of `u`: args (g, u, dim, size, whole, carried)."""

    nargs = 6

    @classmethod
    def eval(cls, g: Expr, *args: sympy.Basic) -> Expr | None:
        return S.Zero if g == 0 else None  # Note [kernels of a zero gradient] in opgen.formula.tensor

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return shape_of(self.args[1], table)

    def formula(self) -> Expr:
        """The gradient as a formula of plain torch ops (Note [glu under torch.func] in opgen.emit.gate_print)."""
        g = self.args[0]
        first, second = self.half(0), self.half(1)
        gate = fn.sigmoid(second)
        return _pad(g * gate, first) + _pad(g * first * gate * (1 - gate), second)


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
