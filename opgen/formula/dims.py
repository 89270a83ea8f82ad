"""Static shapes of tensor formulas: dimension names, the batch marker `...`, and the size of a dimension.

The vocabulary `opgen.formula.tensor` (nodes and their shapes) and `opgen.formula.reduce_shapes`
(what a reduction does to a shape) share: a shape is a tuple of dimension names, literal `1`s
and, first, an optional `BATCH` (Note [batch dimensions] in `opgen.formula.tensor`); `None` is
the unknown shape of a plain `Tensor`.
"""

from __future__ import annotations

from typing import Union

import sympy

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


def dim_size(name: str) -> sympy.Symbol:
    """The size of the named dimension `name`, a positive integer known at call time."""
    return sympy.Symbol("size:" + name, integer=True, positive=True)


def is_dim_size(symbol: sympy.Basic) -> bool:
    return isinstance(symbol, sympy.Symbol) and symbol.name.startswith("size:")
