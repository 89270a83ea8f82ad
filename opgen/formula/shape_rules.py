"""The shape rules of elementwise broadcasting, `@` and `.T`, on static shapes.

Pure functions of shapes (`opgen.formula.dims`), no nodes: `opgen.formula.tensor.shape_of` applies
them to formulas, `opgen.formula.written` and `opgen.formula.read` to shapes as written. Note [batch
dimensions] and Note [vector @ matrix] in `opgen.formula.tensor` say what they accept.
"""

from __future__ import annotations

from opgen.formula.dims import BATCH, Dim, Shape, ShapeError, show, split


def broadcast(a: Shape, b: Shape) -> Shape:
    """The shape of an elementwise result, as PyTorch broadcasts; a mismatch is a `ShapeError`."""
    if a is None or b is None:
        return None
    batch_a, dims_a = split(a)
    batch_b, dims_b = split(b)
    for batch, dims, shape, other_dims, other in ((batch_a, dims_a, a, dims_b, b), (batch_b, dims_b, b, dims_a, a)):
        if batch and len(other_dims) > len(dims):
            # Which dimensions `...` would line up with depends on its length at run time.
            raise ShapeError(
                f"the batch dimensions `...` of {show(shape)} would line up with {other_dims[-len(dims) - 1]} of"
                f" {show(other)}; declare the same dimensions after `...` on both sides"
            )
    n = max(len(dims_a), len(dims_b))
    padded_a = (1,) * (n - len(dims_a)) + dims_a
    padded_b = (1,) * (n - len(dims_b)) + dims_b
    out: list[Dim] = []
    for x, y in zip(padded_a, padded_b, strict=True):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeError(f"cannot broadcast {show(a)} with {show(b)}: dimension {x} does not match {y}")
    return ((BATCH,) if batch_a or batch_b else ()) + tuple(out)


def matmul_shape(a: Shape, b: Shape) -> Shape:
    if a is None or b is None:
        raise ShapeError("`@` needs operands with declared dimensions, e.g. Tensor[N, K]")
    batch_a, dims_a = split(a)
    batch_b, dims_b = split(b)
    if len(dims_a) == 1 and len(dims_b) == 2 and not batch_b:
        # Note [vector @ matrix]: rows of a batch (`F.linear`'s input) times one matrix.
        if dims_a[0] != dims_b[0]:
            raise ShapeError(
                f"`@` of {show(a)} and {show(b)}: the inner dimensions {dims_a[0]} and {dims_b[0]} differ"
                " (is a `.T` missing?)"
            )
        return ((BATCH,) if batch_a else ()) + (dims_b[1],)
    for shape, dims in ((a, dims_a), (b, dims_b)):
        if len(dims) < 2:
            hint = "; a vector [..., K] goes on the left of a plain matrix [K, M]" if len(dims) == 1 else ""
            raise ShapeError(f"`@` needs operands with at least two dimensions; {show(shape)} has {len(dims)}{hint}")
    if dims_a[-1] != dims_b[-2]:
        raise ShapeError(
            f"`@` of {show(a)} and {show(b)}: the inner dimensions {dims_a[-1]} and {dims_b[-2]} differ"
            " (is a `.T` missing?)"
        )
    left = ((BATCH,) if batch_a else ()) + dims_a[:-2]
    right = ((BATCH,) if batch_b else ()) + dims_b[:-2]
    return (broadcast(left, right) or ()) + (dims_a[-2], dims_b[-1])


def transpose_shape(a: Shape) -> Shape:
    if a is None:
        raise ShapeError("`.T` needs an operand with declared dimensions, e.g. Tensor[N, K]")
    batch, dims = split(a)
    if len(dims) < 2:
        raise ShapeError(f"`.T` needs at least two dimensions; {show(a)} has {len(dims)}")
    return a[: len(a) - 2] + (a[-1], a[-2])
