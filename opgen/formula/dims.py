"""Static shapes of tensor formulas: dimension names, the batch marker `...`, and the size of a dimension.

The vocabulary `opgen.formula.tensor` (nodes and their shapes) and `opgen.formula.reduce_shapes`
(what a reduction does to a shape) share: a shape is a tuple of dimension names, literal `1`s
and, first, an optional `BATCH` (Note [batch dimensions] in `opgen.formula.tensor`); `None` is
the unknown shape of a plain `Tensor`.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Union

import sympy

from opgen.formula import functions as fn  # `floor`, which prints as an integer

BATCH = "..."
Dim = Union[str, int]  # noqa: UP007 - a runtime alias, also on Python 3.9 tooling  # a dimension name, the literal 1, or BATCH (first only)
Shape = Union[tuple[Dim, ...], None]  # noqa: UP007


class ShapeError(Exception):
    """Shapes that do not fit; the parser adds where."""


def show(shape: Shape) -> str:
    if shape is None:
        return "[any shape]"
    return "[" + ", ".join(str(d) for d in shape) + "]"


def split(shape: tuple[Dim, ...]) -> tuple[bool, tuple[Dim, ...]]:
    """(has leading batch dimensions, the dimensions after them)."""
    if shape[:1] == (BATCH,):
        return True, shape[1:]
    return False, shape


def dim_size(name: str) -> sympy.Expr:
    """The size of the named dimension `name`, a positive integer known at call time; of a part
    of one (`D//2`, Note [parts of a dimension]), that integer of the whole's size; of a literal
    size (`4`, Note [literal sizes]), that number."""
    if name.isdigit():
        return sympy.Integer(int(name))
    base, fraction = part_of(name)
    size = sympy.Symbol("size:" + base, integer=True, positive=True)
    if fraction == 1:
        return size
    return fn.floor(sympy.Rational(fraction.numerator, fraction.denominator) * size)


# Note [literal sizes]
# ~~~~~~~~~~~~~~~~~~~~
# `Tensor[..., 4]` declares a dimension of a fixed size (a box's four coordinates): the shape keeps it
# as the name `4`, which broadcasts with `4` alone, its size is the number 4 (never read at call
# time), the call-time check asks for exactly 4, and a formula picks one entry of it by an integer
# index, `b[..., 0]` (opgen.nodes.index). Sizes 0 and 1 are refused where the type is read.


# Note [multiples of a dimension]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# `Tensor[..., 2*H]` declares a dimension of twice the size `H` (a GLU's input, whose halves are
# `H` wide): the shape names it `2*H`, the part `x[..., :H]` is written in `H` and named `H`, so it
# broadcasts with other `H` dimensions. `H` is known at call time as that size halved (the check asks
# for a size 2 divides), and formulas may use it as a number. Two copies of `K` joined by `cat` make
# a `2*K` the same way.


# Note [parts of a dimension]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# `x[..., :D // 2]` and `chunk(x, 2, dim=-1)[1]` have a dimension that is a part of `D`: the shape
# names it `D//2` (`3*D//4` for three quarters), so two halves of `D` broadcast together and a half
# never does with `D`. The call-time check asks that `D` be divisible by what the formulas split it
# into, so every part is exactly the fraction of `D` its name says.


def part_dim(base: str, fraction: Fraction) -> str:
    """The name of `fraction` of the dimension `base`: `D//2`, `3*D//4`, `D` itself for all of it, `2*H`
    for twice it (Note [multiples of a dimension])."""
    if fraction == 1:
        return base
    if fraction.denominator == 1:
        return f"{fraction.numerator}*{base}"
    head = f"{fraction.numerator}*{base}" if fraction.numerator != 1 else base
    return f"{head}//{fraction.denominator}"


def part_of(name: str) -> tuple[str, Fraction]:
    """(the dimension, the fraction of it) that a dimension name stands for: `3*D//4` -> (D, 3/4)."""
    head, slashes, denominator = name.partition("//")
    if not slashes:
        factor, star, base = name.partition("*")
        return (base, Fraction(int(factor))) if star and factor.isdigit() else (name, Fraction(1))
    numerator, star, base = head.rpartition("*")
    return base, Fraction(int(numerator) if star else 1, int(denominator))


def count_size(tensors: tuple[str, ...]) -> sympy.Symbol:
    """How many entries the broadcast of the tensor inputs `tensors` has, known at call time.

    Note [counts of unknown shapes]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    `mean((x - t)**2)` of plain `Tensor`s (or over every dimension of a `Tensor[..., D]`) divides
    by a count no named dimension gives. Its operand is elementwise in the inputs it reaches
    without passing a reduction, so its shape is their broadcast: the count is a size like a
    named dimension's (`size:#x,t`), taken at call time as
    `torch.broadcast_shapes(x.shape, t.shape).numel()` and kept on ctx like the others. The
    gradient of such a reduction reaches each input through its operand; where the operand's
    derivative does not span the broadcast (`sum(x**2 + t)`, `t` smaller than `x`: d/dt is 1), it
    is first expanded to that broadcast shape (`broadcast_shape`, `BroadcastTo`), so summing it to
    each input's shape at run time counts every entry it was broadcast to.

    An operand over a batch that passes through tensor operations (`mean(relu(norm(a - p, dim=-1) -
    norm(a - n, dim=-1) + m))`, a triplet loss of `Tensor[..., D]`s) has the batch of the inputs it
    reaches, so its count is the size of their batches' broadcast (`size:%a,n,p`, taken as
    `torch.broadcast_shapes(a.shape[:-1], ...).numel()`) times its named dimensions' sizes.
    """
    return sympy.Symbol("size:#" + ",".join(tensors), integer=True, positive=True)


def batch_count_size(tensors: tuple[str, ...]) -> sympy.Symbol:
    """How many entries the broadcast of the batch dimensions `...` of the tensor inputs `tensors` has,
    known at call time (Note [counts of unknown shapes]): `torch.broadcast_shapes(a.shape[:-1], ...)`."""
    return sympy.Symbol("size:%" + ",".join(tensors), integer=True, positive=True)


def broadcast_shape(tensors: tuple[str, ...]) -> sympy.Symbol:
    """The shape the tensor inputs `tensors` broadcast to, known at call time (Note [counts of unknown shapes])."""
    return dim_size("@" + ",".join(tensors))  # a size symbol, kept on ctx the same way


def counted(dim: str) -> tuple[str, ...] | None:
    """The tensors whose broadcast a `count_size` counts or a `broadcast_shape` is; None for a named dimension."""
    return tuple(dim[1:].split(",")) if dim[:1] in ("#", "%", "@") else None


def size_stem(dim: str) -> str:
    """A name for the ctx attribute holding the size `dim`: the dimension's own, or `count`/`shape`."""
    tensors = counted(dim)
    if tensors is None:
        return dim
    stem = {"#": "count", "%": "batch_count"}.get(dim[:1], "shape")
    return f"{tensors[0]}_{stem}" if len(tensors) == 1 else stem


def is_dim_size(symbol: sympy.Basic) -> bool:
    return isinstance(symbol, sympy.Symbol) and symbol.name.startswith("size:")
