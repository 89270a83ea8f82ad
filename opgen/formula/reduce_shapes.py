"""What a reduction does to a static shape: which dims it reduces, the shape it leaves, how many entries it takes.

Receives a shape (`opgen.formula.dims`) and the `dim=` of a reduction as written (one or several
whole numbers, or None for every dimension); returns negative dim indices, the reduced shape and
the count `mean`, `var` and `std` divide by, or raises a `ShapeError` the reader locates.

Note [reductions over every dimension]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
`sum(x)` without `dim=` reduces every dimension to a scalar. For a shape without `...` the dims
are written out (`dim=(-2, -1)`), so `keepdim=true` and `mean`'s count work as for named dims;
with `...` the node holds the empty Tuple and prints `x.sum()`; `keepdim=true` is refused there
(the rank is only known at run time) and so is `mean`/`var`/`std`, whose count would need the
batch size (as `mean` over a batch dimension always was). `logsumexp` keeps its required `dim=`.
Such a node is one number for the whole batch: a gradient reaching it with batch dimensions (the
output was broadcast against a bigger batch) is summed to a scalar before it passes on, since
batch dimensions carried further would line up with the operand's own (Note [carried batch
dimensions] in opgen.derive.vjp).
"""

from __future__ import annotations

from sympy import Expr, S

from opgen.formula.dims import BATCH, Shape, ShapeError, dim_size, show, split


def reduce_dim(a: Shape, dim: int, what: str) -> int:
    """`dim` as a negative index into `a`; a dimension that is not there is a `ShapeError`."""
    if a is None:
        raise ShapeError(f"{what} needs an operand with declared dimensions, e.g. Tensor[..., N]")
    batch, dims = split(a)
    rank = len(dims)
    if batch and dim >= 0:
        raise ShapeError(f"{what}: with batch dimensions `...` count dim from the end (dim=-1: the last of {show(a)})")
    if not -rank <= dim < rank:
        raise ShapeError(f"{what}: dim={dim} is not a dimension of {show(a)}, which has {rank} dimensions")
    return dim - rank if dim >= 0 else dim


def reduce_dims(a: Shape, dims: tuple[int, ...] | None, keepdim: bool, what: str) -> tuple[int, ...]:
    """`dims` (None: every dimension) as increasing negative indices into `a`; () for every dimension
    of a shape with batch dimensions (Note [reductions over every dimension])."""
    if a is None and dims is None and not keepdim:  # every dimension of a plain Tensor: a scalar
        return ()
    if a is None:
        also = "; over every dimension leave out `dim=` and `keepdim=`" if dims is None or keepdim else ""
        raise ShapeError(f"{what} needs an operand with declared dimensions, e.g. Tensor[..., N]{also}")
    batch, named = split(a)
    if dims is None:
        if not batch:
            return tuple(range(-len(named), 0))
        if keepdim:
            raise ShapeError(
                f"{what} over every dimension of {show(a)} with keepdim=true: the number of batch dimensions `...` is"
                " only known at run time; name the dims (dim=(-2, -1)) or leave keepdim out"
            )
        return ()
    found = [reduce_dim(a, d, what) for d in dims]
    if len(set(found)) != len(found):
        raise ShapeError(f"{what}: dim={dims} names a dimension of {show(a)} twice")
    return tuple(sorted(found))


def reduce_shape(a: Shape, dims: tuple[int, ...], keepdim: bool) -> Shape:
    """The shape of a reduction of `a` over `dims` (negative; () for every dimension)."""
    if not dims:
        return ()
    assert a is not None
    reduced = {len(a) + d for d in dims}
    if keepdim:
        return tuple(1 if k in reduced else d for k, d in enumerate(a))
    return tuple(d for k, d in enumerate(a) if k not in reduced)


def dims_count(a: Shape, dims: tuple[int, ...], what: str) -> Expr:
    """How many entries a reduction over `dims` of `a` takes together: a product of dimension sizes."""
    assert a is not None
    batch, named = split(a)
    if not dims and batch:
        raise ShapeError(f"{what} over the batch dimensions `...` is not supported; name the dimensions")
    count: Expr = S.One
    for d in dims or range(-len(named), 0):
        entry = a[d]
        if entry == BATCH:
            raise ShapeError(f"{what} over a batch dimension `...` is not supported; name the dimension")
        if entry != 1:
            count *= dim_size(str(entry))
    return count


def unsqueeze_dim(a: Shape, dim: int) -> int:
    """`dim` of `unsqueeze(a, dim=...)` counted from the end (-1: a new last dimension), checked."""
    if not a:  # a plain Tensor (unknown rank) or a number
        raise ShapeError("unsqueeze() needs a tensor operand with declared dimensions, e.g. Tensor[..., N, K]")
    batch, dims = split(a)
    rank = len(dims)
    if batch and dim >= 0:
        raise ShapeError(
            f"unsqueeze(): with batch dimensions `...` count dim from the end (dim=-1: after the last of {show(a)})"
        )
    if not -rank - 1 <= dim <= rank:
        raise ShapeError(f"unsqueeze(): dim={dim} is not a place in {show(a)}, which has {rank} dimensions")
    return dim - rank - 1 if dim >= 0 else dim


def unsqueeze_shape(a: Shape, dim: int) -> Shape:
    """`a` with a dimension of size 1 at `dim` (from the end, as `unsqueeze_dim` gives it)."""
    assert a is not None and dim < 0
    k = len(a) + dim + 1
    return a[:k] + (1,) + a[k:]
