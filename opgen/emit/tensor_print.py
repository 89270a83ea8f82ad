"""Printing the tensor nodes of `opgen.formula.tensor`: as torch code and as formulas in docstrings.

`TensorPrinting` is mixed into `TorchPrinter`: `a @ b`, `a.T` (`a.transpose(-2, -1)` when the
operand may have batch dimensions), `a.sum(-1, keepdim=True)`, `g.unsqueeze(-1)`, `g.sum(0)`.
`TensorDisplay` is mixed into the docstring printer and writes the spec's own notation.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

import sympy
from sympy.printing.precedence import PRECEDENCE

from opgen.formula import slicing
from opgen.formula.tensor import (
    BATCH,
    BroadcastTo,
    LogSoftmax,
    LogSoftmaxBackward,
    MatMul,
    ReduceLogSumExp,
    ReduceNorm,
    ReduceVar,
    ReductionBase,
    RowsOuter,
    Shape,
    ShapeError,
    Softmax,
    SoftmaxBackward,
    SumDims,
    SumTo,
    TensorOp,
    Transpose,
    Unsqueeze,
    dim_size,
    shape_of,
)


def _holds_matmul(expr: sympy.Basic, seen: dict[int, tuple[sympy.Basic, bool]]) -> bool:
    """Whether `expr` holds a matrix product, once per shared subtree: a deep chain of lets would
    otherwise be walked again at every sum it holds. `seen` is keyed by identity and keeps the
    expressions alive; structural keys would compare deep trees on every lookup."""
    known = seen.get(id(expr))
    if known is None:
        known = (expr, isinstance(expr, MatMul) or any(_holds_matmul(a, seen) for a in expr.args))
        seen[id(expr)] = known
    return known[1]


def _products_first(terms: list[Any], seen: dict[int, tuple[sympy.Basic, bool]]) -> list[Any]:
    """Sum terms with a matrix product first: `input @ weight.T + bias`, as people write it.

    Then a term without a minus sign leads: `x - tanh(x)`, one subtraction, rather than
    `-tanh(x) + x`, a negation and an addition (two passes over a tensor).
    """
    ordered = [t for t in terms if _holds_matmul(t, seen)] + [t for t in terms if not _holds_matmul(t, seen)]
    if ordered and ordered[0].could_extract_minus_sign():
        lead = next((k for k, t in enumerate(ordered) if not t.could_extract_minus_sign()), 0)
        ordered.insert(0, ordered.pop(lead))
    return ordered


def _is_postfix_safe(expr: sympy.Basic) -> bool:
    """Whether `expr` prints as something a method call can follow without parentheses."""
    if isinstance(expr, MatMul):
        return False
    return bool(expr.is_Symbol or isinstance(expr, (sympy.Function, TensorOp)))


def _log_softmax_formula(expr: Softmax | LogSoftmax) -> sympy.Basic:
    """`a - logsumexp(a, dim, keepdim=true)`: how docstrings show a fused softmax, as specs write it."""
    a, dim = expr.args
    return a - ReduceLogSumExp(a, dim, sympy.S.One)


def _reduced_dims_text(expr: ReductionBase) -> str:
    dims = expr.dims
    return str(dims[0]) if len(dims) == 1 else "(" + ", ".join(str(d) for d in dims) + ")"


def _dims_text(expr: SumDims) -> str:
    dims = [int(d) for d in expr.args[1]]
    return str(dims[0]) if len(dims) == 1 else "(" + ", ".join(str(d) for d in dims) + ")"


def _times(fraction: Fraction, size: str) -> str:
    """`fraction` of a dimension's size as integer arithmetic: `0`, `D`, `D // 2`, `3 * D // 4`."""
    if fraction == 0:
        return "0"
    head = size if fraction.numerator == 1 else f"{fraction.numerator} * {size}"
    return head if fraction.denominator == 1 else f"{head} // {fraction.denominator}"


class _TensorNodes:
    """What both printers share: `a @ b`, and sums with their matrix products first."""

    if TYPE_CHECKING:  # provided by the SymPy printer this is mixed into

        def _print(self, expr: Any, **kwargs: Any) -> str: ...

        def parenthesize(self, item: Any, level: int, strict: bool = False) -> str: ...

    def _as_ordered_terms(self, expr: Any, order: Any = None) -> list[Any]:
        if "_matmul_seen" not in self.__dict__:
            self._matmul_seen: dict[int, tuple[sympy.Basic, bool]] = {}
        return _products_first(super()._as_ordered_terms(expr, order=order), self._matmul_seen)  # type: ignore[misc]

    def _print_MatMul(self, expr: MatMul) -> str:
        level = PRECEDENCE["Mul"]
        a, b = (self.parenthesize(arg, level) for arg in expr.args)
        if expr.args[1].is_Pow and expr.args[1].exp.is_negative and not b.startswith("("):
            b = f"({b})"  # printed as a division, which binds as `@`: `x @ 1 / y` is `(x @ 1) / y`
        return f"{a} @ {b}"


class TensorPrinting(_TensorNodes):
    """`_print_<node>` methods for a `CodePrinter` that prints torch code."""

    tensor_shapes: dict[sympy.Symbol, Shape] = {}  # set by the emitter: static shapes of symbols
    if TYPE_CHECKING:
        torch: str  # how the generated file names torch

        def _dtype_source(self, expr: sympy.Basic) -> str: ...

        def is_tensor(self, expr: sympy.Basic) -> bool: ...

    def _postfix(self, expr: sympy.Basic) -> str:
        text = self._print(expr)
        return text if _is_postfix_safe(expr) else f"({text})"

    def _print_Transpose(self, expr: Transpose) -> str:
        operand = expr.args[0]
        try:
            shape = shape_of(operand, self.tensor_shapes)
        except ShapeError:  # a shape we cannot tell: the batch-safe spelling
            shape = None
        plain = shape is not None and len(shape) == 2 and BATCH not in shape
        # `transpose(-2, -1)`, not `.mT`, which the TorchScript-based ONNX exporter lacks
        return f"{self._postfix(operand)}.{'T' if plain else 'transpose(-2, -1)'}"

    def _print_ReductionBase(self, expr: ReductionBase) -> str:
        options = [_reduced_dims_text(expr)] if not expr.every_dim else []
        if isinstance(expr, ReduceVar) and expr.correction != 1:
            options.append(f"correction={expr.correction}")
        if expr.keepdim:
            options.append("keepdim=True")
        if isinstance(expr, ReduceNorm):
            dims = [f"dim={_reduced_dims_text(expr)}"] if not expr.every_dim else []
            keep = ["keepdim=True"] if expr.keepdim else []
            return f"{self.torch}.linalg.vector_norm({', '.join([self._print(expr.operand), *dims, *keep])})"
        return f"{self._postfix(expr.operand)}.{expr.spec_name}({', '.join(options)})"

    def _print_Unsqueeze(self, expr: Unsqueeze) -> str:
        if not self.is_tensor(expr.args[0]):  # a number (a logsumexp of a constant, kept): it broadcasts as it is
            return self._postfix(expr.args[0])  # parenthesized, as it stands where `x.unsqueeze(...)` would
        return f"{self._postfix(expr.args[0])}.unsqueeze({int(expr.args[1])})"

    def _print_Slice(self, expr: slicing.Slice) -> str:
        cut = expr.cut
        size = self._print(dim_size(cut.base))
        start, length = _times(cut.start, size), _times(cut.stop - cut.start, size)
        return f"{self._postfix(expr.args[0])}.narrow({cut.dim}, {start}, {length})"

    def _print_Pad(self, expr: slicing.Pad) -> str:
        """`F.pad` of the part's gradient, expanded along the dimension first where it is narrow."""
        cut, g = expr.cut, expr.args[0]
        size = self._print(dim_size(cut.base))
        text = self._print(g)
        if expr.expands:
            rest = "" if cut.dim == -1 else f", *{self._postfix(g)}.shape[{cut.dim + 1}:]"
            length = _times(cut.stop - cut.start, size)
            text = f"{self._postfix(g)}.expand(*{self._postfix(g)}.shape[:{cut.dim}], {length}{rest})"
        pads = ["0"] * (2 * (-cut.dim - 1)) + [_times(cut.start, size), _times(cut.whole - cut.stop, size)]
        return f"{self.torch}.nn.functional.pad({text}, ({', '.join(pads)}))"

    def _print_RowsOuter(self, expr: RowsOuter) -> str:
        # `a` broadcast to the gradient's rows (its batch may be bigger), then one matrix product; not
        # einsum's "...i,...j->ij", which vmap (batched gradients) cannot run.
        a, g = (self._postfix(arg) for arg in expr.args)
        rows = f"{a}.expand(*{g}.shape[:-1], {a}.shape[-1]).reshape(-1, {a}.shape[-1])"
        return f"{rows}.mT @ {g}.reshape(-1, {g}.shape[-1])"

    def _print_Softmax(self, expr: Softmax) -> str:
        return f"{self.torch}.softmax({self._print(expr.args[0])}, {int(expr.args[1])})"

    def _print_SoftmaxBackward(self, expr: SoftmaxBackward) -> str:
        return self._backward_kernel("_softmax_backward_data", expr)

    def _print_LogSoftmaxBackward(self, expr: LogSoftmaxBackward) -> str:
        return self._backward_kernel("_log_softmax_backward_data", expr)

    def _backward_kernel(self, kernel: str, expr: SoftmaxBackward | LogSoftmaxBackward) -> str:
        g, y, dim = (self._print(a) for a in expr.args)
        return f"{self.torch}.ops.aten.{kernel}({g}, {y}, {dim}, {self._dtype_source(expr.args[1])}.dtype)"

    def _print_LogSoftmax(self, expr: LogSoftmax) -> str:
        return f"{self.torch}.log_softmax({self._print(expr.args[0])}, {int(expr.args[1])})"

    def _print_BroadcastTo(self, expr: BroadcastTo) -> str:
        return f"{self._postfix(expr.args[0])}.expand({self._print(expr.args[1])})"

    def _print_SumTo(self, expr: SumTo) -> str:
        shape = self._print(expr.args[1])
        if len(expr.args) == 2:
            return f"{self._postfix(expr.args[0])}.sum_to_size({shape})"
        sizes = ["1" if flag else f"{shape}[{k}]" for k, flag in enumerate(expr.args[2])]
        narrow = f"({', '.join(sizes)}{',' if len(sizes) == 1 else ''})"
        return f"{self._postfix(expr.args[0])}.sum_to_size({narrow}).expand({shape})"

    def _print_Scalar(self, expr: sympy.Basic) -> str:  # opgen.optimize.spread: computed on its own, first
        inner = expr.args[0]
        return self._print(inner) if inner.is_Atom else f"({self._print(inner)})"

    def _print_SumDims(self, expr: SumDims) -> str:
        keep = ", keepdim=True" if expr.args[2] else ""
        return f"{self._postfix(expr.args[0])}.sum({_dims_text(expr)}{keep})"


class TensorDisplay(_TensorNodes):
    """Docstring notation for the tensor nodes: `input @ weight.T`, `sum(x, dim=-1)`."""

    def parenthesize(self, item: Any, level: int, strict: bool = False) -> str:
        # A log-softmax shows as the difference `a - logsumexp(a, ...)`: inside a product it needs parentheses.
        if isinstance(item, LogSoftmax) and level >= PRECEDENCE["Add"]:
            return f"({self._print(item)})"
        return super().parenthesize(item, level, strict)

    def _print_Transpose(self, expr: Transpose) -> str:
        operand = expr.args[0]
        text = self._print(operand)
        return f"{text if _is_postfix_safe(operand) else f'({text})'}.T"

    def _print_ReductionBase(self, expr: ReductionBase) -> str:
        options = [f"dim={_reduced_dims_text(expr)}"] if not expr.every_dim else []
        if isinstance(expr, ReduceVar) and expr.correction != 1:
            options.append(f"correction={expr.correction}")
        if expr.keepdim:
            options.append("keepdim=true")
        return f"{expr.spec_name}({', '.join([self._print(expr.operand), *options])})"

    def _print_Unsqueeze(self, expr: Unsqueeze) -> str:
        return f"unsqueeze({self._print(expr.args[0])}, dim={int(expr.args[1])})"

    def _print_Slice(self, expr: slicing.Slice) -> str:
        cut = expr.cut
        start = "" if cut.start == 0 else _times(cut.start, cut.base)
        stop = "" if cut.stop == cut.whole else _times(cut.stop, cut.base)
        return f"{self._print(expr.args[0])}[..., {start}:{stop}{', :' * (-cut.dim - 1)}]"

    def _print_Pad(self, expr: slicing.Pad) -> str:
        cut = expr.cut
        start, stop = _times(cut.start, cut.base), _times(cut.stop, cut.base)
        whole = _times(cut.whole, cut.base)
        return f"pad({self._print(expr.args[0])}, dim={cut.dim}, at={start}:{stop}, size={whole})"

    def _print_RowsOuter(self, expr: RowsOuter) -> str:
        return f"sum_rows(outer({self._print(expr.args[0])}, {self._print(expr.args[1])}))"

    def _print_Softmax(self, expr: Softmax) -> str:
        return f"exp({self._print(_log_softmax_formula(expr))})"

    def _print_LogSoftmax(self, expr: LogSoftmax) -> str:
        return self._print(_log_softmax_formula(expr))

    def _print_SoftmaxBackward(self, expr: SoftmaxBackward) -> str:
        return self._print(expr.elementary())

    _print_LogSoftmaxBackward = _print_SoftmaxBackward

    def _print_BroadcastTo(self, expr: BroadcastTo | SumTo) -> str:
        return self._print(expr.args[0])  # the gradient, spread over (or summed to) a shape as an elementwise value is

    _print_SumTo = _print_BroadcastTo
    _print_Scalar = _print_BroadcastTo

    def _print_SumDims(self, expr: SumDims) -> str:
        keep = ", keepdim=true" if expr.args[2] else ""
        return f"sum({self._print(expr.args[0])}, dim={_dims_text(expr)}{keep})"
