"""Parts of a named dimension: `x[..., :D // 2]`, `x[..., D // 2:]`, `chunk(x, 2, dim=-1)[1]`.

Receives the syntax tree of an index or a `chunk` pick and the static shape of what it indexes;
returns a `Cut` (which dimension, which fraction of it) or raises a `CutError` naming the node at
fault, which the formula reader locates. The nodes `Slice` (the part) and `Pad` (its gradient: the
part put back among zeros) are linear tensor nodes: `opgen.derive.vjp` and `opgen.derive.jvp` give
their derivatives, `opgen.emit.tensor_print` prints them as `x.narrow(...)` and `F.pad(...)`, both
differentiable, so double backward, `torch.func` and `torch.compile` see plain torch ops.

Note [slices of a dimension]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The bounds of a slice are written in the size of the dimension sliced: `:D // 2`, `D // 3:2 * D // 3`,
`D - D // 4:`, each a fraction of `D` (0 to the whole), read here by exact arithmetic on that one name,
never evaluated. A fixed number (`:3`), another dimension or input, `/` (a float) are refused: the
part's size must be a named fraction of `D` (Note [parts of a dimension] in opgen.formula.dims), which
is what the shape checks, broadcasting and the gradients rely on. `chunk(x, k, dim=d)[i]` is the
`i`-th of `k` equal parts, `torch.chunk`'s pick when `k` divides the size. One dimension is cut per
index; any number of `:` and one `...` place it, as in Python.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from fractions import Fraction
from math import lcm

import sympy
from sympy import Expr

from opgen.formula.dims import BATCH, Shape, dim_size, part_dim, part_of, show, split
from opgen.formula.syntax import int_literal
from opgen.formula.tensor import ShapedOp, Unsqueeze, pull_number
from opgen.nodes.base import Lowered

EXAMPLE = "x[..., :D // 2] or x[..., D // 2:]"


class CutError(Exception):
    """A cut that is not allowed, with the node to blame."""

    def __init__(self, node: ast.AST, message: str) -> None:
        super().__init__(message)
        self.node = node


@dataclass(frozen=True)
class Cut:
    """The entries `start` to `stop` (fractions of dimension `base`'s size) of the dimension `dim`
    (from the end) of an operand that holds the fraction `whole` of `base` there."""

    dim: int
    base: str
    start: Fraction
    stop: Fraction
    whole: Fraction


class _Part(ShapedOp):
    """(operand, dim, size of the base dimension, start, stop, whole): see `Cut`."""

    nargs = (6, 7)

    @classmethod
    def eval(cls, operand: Expr, *rest: sympy.Basic) -> Expr | None:
        return pull_number(cls, operand, *rest)

    @property
    def cut(self) -> Cut:
        _, dim, size, start, stop, whole = self.args[:6]
        return Cut(int(dim), size.name.split(":", 1)[1], *(Fraction(int(f.p), int(f.q)) for f in (start, stop, whole)))

    def with_entry(self, operand: Shape, entry: str) -> Shape:
        assert operand is not None
        k = len(operand) + self.cut.dim
        return operand[:k] + (entry,) + operand[k + 1 :]


class Slice(_Part):
    """The part `start:stop` of the operand along `dim`: `x.narrow(dim, start, length)`."""

    def static_shape(self, operand: Shape) -> Shape:
        cut = self.cut
        return self.with_entry(operand, part_dim(cut.base, cut.stop - cut.start))


class Pad(_Part):
    """A gradient of the part `start:stop` put back in place, zeros elsewhere: `F.pad`. Its operand
    may be narrow (size 1 along `dim`, Note [narrow gradients]): then a seventh argument, 1, says
    it is expanded to the part first (the shapes of the temporaries it may be printed through are
    not known to the printer)."""

    @property
    def expands(self) -> bool:
        return len(self.args) == 7 and bool(self.args[6])

    def static_shape(self, operand: Shape) -> Shape:
        cut = self.cut
        return self.with_entry(operand, part_dim(cut.base, cut.whole))


def make(kind: type[_Part], operand: Expr, cut: Cut, *expands: sympy.Integer) -> Expr:
    fractions = (sympy.Rational(f.numerator, f.denominator) for f in (cut.start, cut.stop, cut.whole))
    return kind(operand, sympy.Integer(cut.dim), dim_size(cut.base), *fractions, *expands)


def pad(grad: Expr, shape: Shape, cut: Cut) -> Expr:
    """`Pad` of `grad`, of static shape `shape`: given the dimension first if it stops before it, and
    marked to be expanded where it is narrow there."""
    if reaches(shape, cut.dim):
        return make(Pad, grad, cut)
    return make(Pad, with_rank(grad, shape, cut.dim), cut, sympy.Integer(1))


def reaches(shape: Shape, dim: int) -> bool:
    """Whether `shape` has a dimension at `dim` (from the end) that is not 1: not narrow there."""
    if shape is None:
        return True
    named = split(shape)[1]
    return len(named) >= -dim and named[dim] != 1


def with_rank(expr: Expr, shape: Shape, dim: int) -> Expr:
    """`expr` with size-1 dimensions put in front until it has one at `dim` (from the end)."""
    assert shape is not None
    for k in range(len(split(shape)[1]), -dim):
        expr = Unsqueeze(expr, sympy.Integer(-k - 1))
    return expr


def divisors(exprs: list[Expr]) -> dict[str, int]:
    """What each dimension must be divisible by for the parts the formulas cut of it, by name."""
    found: dict[str, int] = {}
    for expr in exprs:
        # a lowered node (a gated linear unit) as the formula it computes: its parts
        expr = expr.replace(lambda e: isinstance(e, Lowered), lambda e: e.elementary())
        for node in expr.atoms(_Part):
            cut = node.cut
            k = lcm(cut.start.denominator, cut.stop.denominator, cut.whole.denominator)
            found[cut.base] = lcm(found.get(cut.base, 1), k)
    return {name: k for name, k in sorted(found.items()) if k > 1}


# -- reading -------------------------------------------------------------------------------------


def index_cut(node: ast.Subscript, shape: Shape, dims: frozenset[str]) -> Cut:
    """The cut `x[...]` makes; `dims` are the spec's dimension names."""
    items = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
    ellipsis = [k for k, item in enumerate(items) if isinstance(item, ast.Constant) and item.value is Ellipsis]
    cuts = [k for k, item in enumerate(items) if isinstance(item, ast.Slice) and not _full(item)]
    for item in items:
        if isinstance(item, ast.Slice) and item.step is not None:
            raise CutError(item.step, f"a slice takes no step; write {EXAMPLE}")
        if not isinstance(item, ast.Slice) and not (isinstance(item, ast.Constant) and item.value is Ellipsis):
            raise CutError(item, f"an index picks a part of a named dimension by slices, e.g. {EXAMPLE}")
    if len(ellipsis) > 1:
        raise CutError(node, "an index may hold one `...`")
    if len(cuts) != 1:
        what = "no part" if not cuts else "parts of several dimensions"
        raise CutError(node, f"this index cuts {what}; cut one dimension at a time, e.g. {EXAMPLE}")
    position = cuts[0]
    if ellipsis and ellipsis[0] < position:
        dim = position - len(items)  # counted from the end
    else:
        dim = position  # counted from the front
    entry_dim = _dim_in(node, shape, dim, len(items) - len(ellipsis))
    item = items[position]
    assert isinstance(item, ast.Slice)
    base, whole = _cut_entry(node, shape, entry_dim)
    start = Fraction(0) if item.lower is None else _bound(item.lower, base, dims)
    stop = whole if item.upper is None else _bound(item.upper, base, dims)
    if not 0 <= start < stop <= whole:
        text = f"{ast.unparse(item)}"
        raise CutError(item, f"the slice `{text}` is empty or reaches outside {part_dim(base, whole)} of {show(shape)}")
    return Cut(entry_dim, base, start, stop, whole)


def chunk_cut(call: ast.Call, index: ast.expr, shape: Shape) -> Cut:
    """The cut `chunk(x, k, dim=d)[i]` makes: the `i`-th of `k` equal parts along `d`."""
    usage = "chunk() takes a tensor, how many parts and `dim=`, and one part is picked: chunk(x, 2, dim=-1)[0]"
    if len(call.args) != 2 or [kw.arg for kw in call.keywords] != ["dim"]:
        raise CutError(call, usage)
    parts, dim, pick = int_literal(call.args[1]), int_literal(call.keywords[0].value), int_literal(index)
    if parts is None or parts < 1:
        raise CutError(call.args[1], "the number of parts of chunk() must be a whole number such as 2")
    if dim is None:
        raise CutError(call.keywords[0].value, "`dim` of chunk() must be a whole number such as -1")
    if pick is None or not -parts <= pick < parts:
        raise CutError(index, f"pick one of the {parts} parts of chunk() by a whole number from 0 to {parts - 1}")
    dim = _dim_in(call, shape, dim, 1)
    base, whole = _cut_entry(call, shape, dim)
    pick %= parts
    return Cut(dim, base, whole * pick / parts, whole * (pick + 1) / parts, whole)


def _full(item: ast.Slice) -> bool:
    return item.lower is None and item.upper is None and item.step is None


def _dim_in(node: ast.AST, shape: Shape, dim: int, written: int) -> int:
    """`dim` (from the front when >= 0) as a dimension from the end of `shape`."""
    if shape is None or shape == ():
        raise CutError(node, "a part of a dimension needs an operand with declared dimensions, e.g. Tensor[..., D]")
    batch, named = split(shape)
    if written > len(named) and not batch or written > len(shape):
        raise CutError(node, f"the index has {written} entries; {show(shape)} has {len(named)} named dimensions")
    if dim >= 0 and batch:
        raise CutError(
            node, f"with batch dimensions `...` cut from the end: x[..., :D // 2] cuts the last of {show(shape)}"
        )
    if not -len(named) <= dim < len(named):
        raise CutError(node, f"dim={dim} is not a dimension of {show(shape)}")
    return dim - len(named) if dim >= 0 else dim


def _cut_entry(node: ast.AST, shape: Shape, dim: int) -> tuple[str, Fraction]:
    assert shape is not None
    entry = shape[dim]
    if entry == BATCH or not isinstance(entry, str):
        raise CutError(node, f"only a named dimension can be cut; {show(shape)} has {entry} there")
    return part_of(entry)


def _bound(node: ast.expr, base: str, dims: frozenset[str]) -> Fraction:
    """A bound as the fraction of `base`'s size it is (Note [slices of a dimension])."""
    linear = _linear(node, base, dims)
    others = sorted(set(linear) - {base, ""})
    if others:
        raise CutError(node, f"a cut of {base} has bounds written in {base}, not {others[0]}, e.g. `{base} // 2`")
    if "" in linear:
        what = "not a fixed number" if len(linear) == 1 else "with no number added"
        raise CutError(node, f"a slice bound is a fraction of {base}'s size such as `{base} // 2`, {what}")
    return linear.get(base, Fraction(0))


def _linear(node: ast.expr, base: str, dims: frozenset[str]) -> dict[str, Fraction]:
    """`node` as a sum of dimension sizes times fractions ("" for a plain number)."""
    if isinstance(node, ast.Name):
        if node.id not in dims:
            raise CutError(node, f"'{node.id}' is not a dimension; the bounds of a cut are written in {base}")
        return {node.id: Fraction(1)}
    number = int_literal(node)
    if number is not None:
        return {"": Fraction(number)} if number else {}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return {k: -v for k, v in _linear(node.operand, base, dims).items()}
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        left, right = _linear(node.left, base, dims), _linear(node.right, base, dims)
        sign = 1 if isinstance(node.op, ast.Add) else -1
        total = {k: left.get(k, Fraction(0)) + sign * right.get(k, Fraction(0)) for k in {*left, *right}}
        return {k: v for k, v in total.items() if v}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        left, right = _linear(node.left, base, dims), _linear(node.right, base, dims)
        factor, other = (left, right) if set(left) <= {""} else (right, left)
        if not set(factor) <= {""}:
            raise CutError(node, f"a slice bound multiplies {base} by a whole number only")
        return {k: v * factor.get("", Fraction(0)) for k, v in other.items() if factor}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
        divisor = int_literal(node.right)
        if isinstance(node.right, ast.Name):
            what = "a dimension" if node.right.id in dims else "not known when the op is generated"
            raise CutError(
                node.right, f"'{node.right.id}' is {what}; a cut divides by a whole number, e.g. `{base} // 2`"
            )
        if divisor is None or divisor < 1:
            raise CutError(node.right, f"`//` in a slice bound divides by a whole number >= 1, e.g. `{base} // 2`")
        return {k: v / divisor for k, v in _linear(node.left, base, dims).items()}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        raise CutError(node, f"a slice bound is a whole number: write `//`, e.g. `{base} // 2`")
    raise CutError(node, f"a slice bound is a fraction of {base} written with + - * //, e.g. `{base} // 2`")
