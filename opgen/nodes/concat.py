"""Joining tensors: `cat([a, b, ...], dim=d)` along a named dimension and `stack([a, b, ...], dim=d)` along a new one.

Note [concatenation]
~~~~~~~~~~~~~~~~~~~~
Rotary embeddings rotate the two halves of the last dimension, `cat([-x2, x1], dim=-1)` with
`x1 = x[..., :D // 2]` and `x2 = x[..., D // 2:]`. The pieces are parts of one named dimension
(Note [parts of a dimension] in opgen.formula.dims), or copies of it: the joined dimension is the
sum of their fractions, so the halves of `D` join to `D` (and broadcast with `x` again), two
copies of `K` to `2*K//1`. Every other dimension of the pieces must be the same (torch.cat does
not broadcast), and the pieces tensors; anything else is a located error.

`Cat(dim, size, whole, cuts, *pieces)` is a `Lowered` node: forward computes `torch.cat`, and its
formula (`elementary()`) is the sum of each piece put in its place among zeros (`Pad`, opgen.formula
.slicing), so that its gradient is each piece's part of the incoming gradient (`grad.narrow(...)`)
and its tangent the sum of the padded tangents: differentiable torch ops, so double backward,
torch.func and torch.compile take them as any other.

`stack([a, b, ...], dim=d)` (torch.stack) joins pieces of one shape along a new dimension of
literal size, the number of pieces (Note [literal sizes] in opgen.formula.dims), at `d` of the
result: `Stack` is `Lowered` the same way, its formula the sum of each piece put at its index
among zeros (`PutAt`, Note [integer indexing] in opgen.nodes.index), so its gradient is each
piece's pick of the incoming gradient. `stack([x, y], dim=-1)[..., 0]` is `x` again.
"""

from __future__ import annotations

from fractions import Fraction

import sympy
from sympy import Expr
from sympy.core.symbol import Str

from opgen.formula import slicing
from opgen.formula.dims import BATCH, Shape, ShapeError, part_dim, part_of, show, split
from opgen.formula.tensor import TensorOp, shape_of
from opgen.nodes.base import Drop, Lowered, Printer, Shown, Spelled, TorchCode
from opgen.nodes.index import PutAt

USAGE = "{name}() takes a list of tensors and `dim=`, e.g. {name}([-x2, x1], dim=-1)"


def cat_cuts(shapes: list[Shape], dim: int) -> tuple[Shape, list[slicing.Cut]]:
    """The shape of the concatenation of pieces of `shapes` along `dim`, and where each piece goes."""
    if not shapes:
        raise ShapeError(USAGE.format(name="cat"))
    first = shapes[0]
    if any(s is None for s in shapes) or first is None:
        raise ShapeError("cat() needs pieces with declared dimensions, e.g. Tensor[..., D]")
    batch, named = split(first)
    if dim >= 0 and batch:
        raise ShapeError(
            f"with batch dimensions `...` cat() counts `dim` from the end: dim=-1 is the last of {show(first)}"
        )
    if not -len(named) <= dim < len(named):
        raise ShapeError(f"dim={dim} is not a dimension of {show(first)}")
    dim = dim - len(named) if dim >= 0 else dim
    bases = []
    for shape in shapes:
        assert shape is not None
        if len(shape) != len(first) or any(
            a != b for k, (a, b) in enumerate(zip(shape, first, strict=True)) if k != len(first) + dim
        ):
            raise ShapeError(
                f"cat() joins pieces that differ only along dim={dim}: {show(first)} and {show(shape)} "
                "(it does not broadcast, as torch.cat)"
            )
        entry = shape[dim]
        if entry == BATCH or not isinstance(entry, str):
            raise ShapeError(f"cat() joins along a named dimension; {show(shape)} has {entry} at dim={dim}")
        bases.append(part_of(entry))
    names = sorted({base for base, _ in bases})
    if len(names) > 1:
        raise ShapeError(
            f"cat() joins parts of one named dimension (x[..., :D // 2] and x[..., D // 2:]); these are parts of "
            f"{' and '.join(names)}"
        )
    whole = sum((fraction for _, fraction in bases), Fraction(0))
    cuts, start = [], Fraction(0)
    for base, fraction in bases:
        cuts.append(slicing.Cut(dim, base, start, start + fraction, whole))
        start += fraction
    return first[:dim] + (part_dim(names[0], whole),) + first[len(first) + dim + 1 :], cuts


def _rational(f: Fraction) -> sympy.Rational:
    return sympy.Rational(f.numerator, f.denominator)


class _Joined(Lowered, Spelled, Shown, TensorOp):
    """A join of pieces, its first argument the dim and its `head` first arguments no pieces; torch's `word`."""

    head = 1
    word = ""

    @property
    def pieces(self) -> tuple[Expr, ...]:
        return tuple(self.args[self.head :])

    def without(self, absent: frozenset[sympy.Symbol], drop: Drop) -> Expr | None:
        """Gone when a piece is (a term of a `Tensor?` input that is None): the rest no longer fills the dimension."""
        pieces = [drop(p, absent) for p in self.pieces]
        return None if any(p is None for p in pieces) else self.func(*self.args[: self.head], *pieces)

    def _joined(self, printer: Printer, name: str) -> str:
        pieces = ", ".join(printer._print(p) for p in self.pieces)
        return f"{name}([{pieces}], dim={int(self.args[0])})"

    def _torch(self, printer: TorchCode) -> str:
        return self._joined(printer, f"{printer.torch}.{self.word}")

    def _docstring(self, printer: Printer) -> str:
        return self._joined(printer, self.word)


class Cat(_Joined):
    """`torch.cat(pieces, dim=dim)`: args (dim, the base dimension's name, starts, stops, whole, *pieces), the
    starts and stops Tuples of the fractions of the base each piece covers (Note [concatenation]). The name is
    a `Str`, no symbol: torch.cat needs no size, and forward defines only the sizes it uses."""

    @classmethod
    def of(cls, pieces: list[Expr], cuts: list[slicing.Cut]) -> Expr:
        cut = cuts[0]
        starts = sympy.Tuple(*(_rational(c.start) for c in cuts))
        stops = sympy.Tuple(*(_rational(c.stop) for c in cuts))
        return cls(sympy.Integer(cut.dim), Str(cut.base), starts, stops, _rational(cut.whole), *pieces)

    head, word = 5, "cat"

    @property
    def cuts(self) -> list[slicing.Cut]:
        dim, base, starts, stops, whole = self.args[:5]
        fraction = [Fraction(int(f.p), int(f.q)) for f in (*starts, *stops, whole)]
        count = len(starts)
        return [slicing.Cut(int(dim), base.name, fraction[k], fraction[count + k], fraction[-1]) for k in range(count)]

    def elementary(self) -> Expr:
        return sympy.Add(*(slicing.make(slicing.Pad, p, c) for p, c in zip(self.pieces, self.cuts, strict=True)))

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return cat_cuts([shape_of(p, table) for p in self.pieces], int(self.args[0]))[0]


def stack_shape(shapes: list[Shape], dim: int) -> tuple[Shape, int]:
    """The shape of the stack of pieces of `shapes` along a new dimension at `dim` of the result, and that
    dimension counted from the end."""
    first = shapes[0]
    if first is None or any(s != first for s in shapes):
        raise ShapeError(
            "stack() joins pieces of one shape with declared dimensions (it does not broadcast, as torch.stack); "
            + ", ".join(show(s) for s in shapes)
        )
    if len(shapes) < 2:
        raise ShapeError("stack() of one tensor is a dimension of size 1: write unsqueeze(x, dim=-1)")
    batch, named = split(first)
    if dim >= 0 and batch:
        raise ShapeError("with batch dimensions `...` stack() counts `dim` from the end: dim=-1 puts the new one last")
    if not -len(named) - 1 <= dim <= len(named):
        raise ShapeError(f"dim={dim} is not a place for a new dimension of {show(first)}")
    dim = dim - len(named) - 1 if dim >= 0 else dim
    at = len(first) + dim + 1
    return first[:at] + (str(len(shapes)),) + first[at:], dim


class Stack(_Joined):
    """`torch.stack(pieces, dim=dim)`: args (dim from the end of the result, *pieces) (Note [concatenation])."""

    head, word = 1, "stack"

    def elementary(self) -> Expr:
        dim, size = self.args[0], sympy.Integer(len(self.pieces))
        return sympy.Add(*(PutAt(p, dim, sympy.Integer(k), size) for k, p in enumerate(self.pieces)))

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return stack_shape([shape_of(p, table) for p in self.pieces], int(self.args[0]))[0]
