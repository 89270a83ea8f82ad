"""Layer norm as PyTorch's kernels: its nodes with their shapes, gradient, formulas and spellings.

`LayerNorm` is `(u - mean(u)) / sqrt(var(u, correction=0) + eps) * w + b` over the last dim(s),
printed as `torch.layer_norm` (the optimizer finds it: opgen.optimize.norms). Its gradient
(`vjp_pushes`) is `LayerNormGrads`, `native_layer_norm_backward`: one kernel for the input, weight
and bias gradients, reading the mean and the reciprocal std that forward's `native_layer_norm`
gives (`LayerNormStats`, read as `Item`s: Note [layer norm statistics]). `Rstd` is the reciprocal
root of a reduction an RMS norm keeps (Note [saved rstd] in opgen.optimize.norms).

Note [layer norm statistics]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The backward kernel needs the mean and 1/std of each row: `[..., 1]`, tiny next to the input,
and a pass over the input to recompute (on CPU `var_mean` alone costs three times the kernel).
The gradients read them as `Item(LayerNormStats(u, eps, shape), 1 or 2)`; `opgen.optimize.save`
makes them residuals (hidden outputs) when forward computes the layer norm anyway, and forward
then gets them from the same `native_layer_norm` call as the output (or as the let, or the part
of an output, that is that layer norm: `relu(ln) + 2 * ln` calls it once: `statistics_lines`).
They are outputs autograd does not differentiate (`detached`): PyTorch's double backward of the
kernel (`layer_norm_double_backward`) already accounts for their dependence on the input, as
PyTorch's own layer norm saves them. Without residuals, backward recomputes them.

Note [layer norm under torch.func]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
PyTorch's forward-mode derivative of `native_layer_norm_backward` misses how the weight's
gradient depends on the input (`torch.func.hessian` of `F.layer_norm` disagrees with reverse
over reverse in that block, torch 2.13), and its double backward is right but not differentiable
again (the third derivative of `F.layer_norm` in the input is not that of its formula): under
torch.func transforms and in double backward (`create_graph=True`), backward takes the gradients'
formulas (`transform_formulas`), from the input alone and in elementary ops, instead of the kernel
and the saved statistics.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import sympy
from sympy import Expr, S

from opgen.formula.tensor import ReduceMean, ReduceVar, Shape, TensorOp, shape_of
from opgen.nodes.base import Drop, Lowered, Printer, Shaped, Shown, Spelled, TorchCode, Tupled, UnderTransforms


class LayerNorm(Lowered, Spelled, Shown, TensorOp):
    """`(u - mean) * rstd * w + b` over the trailing dims whose sizes are `shape` (a Tuple of size symbols):
    args (u, w, b, eps, shape); `w` is 1 and `b` 0 when absent (printed None)."""

    nargs = 5

    def elementary(self) -> Expr:
        u, w, b, eps, shape = self.args
        dims = trailing_dims(shape)
        centered = u - ReduceMean(u, dims, S.One)
        return centered / sympy.sqrt(ReduceVar(u, dims, S.One, S.Zero) + eps) * w + b

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return shape_of(self.args[0], table)

    def vjp_pushes(self, grad: Expr) -> list[tuple[Expr, Expr]]:
        """(part, its gradient) for each argument: `native_layer_norm_backward`."""
        u, w, b, eps, shape = self.args
        stats = LayerNormStats(u, eps, shape)
        grads = LayerNormGrads(grad, u, Item(stats, sympy.Integer(1)), Item(stats, sympy.Integer(2)), w, b, shape, eps)
        pushes = [(u, Item(grads, S.Zero))]
        if w != 1:
            pushes.append((w, Item(grads, S.One)))
        if b != 0:
            pushes.append((b, Item(grads, sympy.Integer(2))))
        return pushes

    def without(self, absent: frozenset[sympy.Symbol], drop: Drop) -> Expr | None:
        """The node when the `Tensor?` inputs `absent` are None: its bias is a term, the rest factors."""
        u, w, b, eps, shape = self.args
        if any(a.free_symbols & absent for a in (u, w, eps)):
            return None
        bias = drop(b, absent)
        return LayerNorm(u, w, S.Zero if bias is None else bias, eps, shape)

    def _torch(self, printer: TorchCode) -> str:
        return _call(printer, "layer_norm", self)


class LayerNormStats(Shaped, Spelled, Tupled, TensorOp):
    """`torch.native_layer_norm(u, shape, None, None, eps)`: (normalized, mean, rstd); args (u, eps, shape)."""

    nargs = 3

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return self.item_shape(0, table)  # a tuple: as its first tensor

    def item_shape(self, index: int, table: dict[sympy.Symbol, Shape]) -> Shape:
        full = shape_of(self.args[0], table)
        if index == 0 or full is None:
            return full
        count = len(self.args[2])
        return full[: len(full) - count] + (1,) * count

    def plain(self) -> LayerNorm:
        """The layer norm without weight and bias these are the statistics of."""
        u, eps, shape = self.args
        return LayerNorm(u, S.One, S.Zero, eps, shape)

    def part_formula(self, index: int) -> Expr:
        """The normalized input, the mean, or the reciprocal standard deviation."""
        u, eps, shape = self.args
        dims = trailing_dims(shape)
        if index == 0:
            return self.plain()
        if index == 1:
            return ReduceMean(u, dims, S.One)
        return (ReduceVar(u, dims, S.One, S.Zero) + eps) ** -S.Half

    def _torch(self, printer: TorchCode) -> str:
        return _call(printer, "native_layer_norm", self.plain())


class LayerNormGrads(Shaped, UnderTransforms, Tupled, TensorOp):
    """`native_layer_norm_backward`: (grad of u, of w, of b); args (g, u, mean, rstd, w, b, shape, eps)."""

    nargs = 8

    @property
    def eps(self) -> Expr:
        return self.args[7]

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return self.item_shape(0, table)  # a tuple: as its first tensor

    def item_shape(self, index: int, table: dict[sympy.Symbol, Shape]) -> Shape:
        return shape_of(self.args[index if index == 0 else index + 3], table)

    def kernel_call(self, printer: TorchCode) -> tuple[str, list[str]]:
        """`aten.native_layer_norm_backward` and its arguments, printed."""
        g, u, mean, rstd, w, b, shape, _ = self.args
        args = [printer._print(a) for a in (g, u)] + [_shape(printer, shape), printer._print(mean)]
        args += [printer._print(rstd), _optional(printer, w, S.One), _optional(printer, b, S.Zero)]
        args.append(f"[True, {w != 1}, {b != 0}]")
        return f"{printer.torch}.ops.aten.native_layer_norm_backward", args

    def transform_formulas(self) -> list[tuple[Expr | None, Expr | None]]:
        """The gradients' formulas from the input alone (Note [layer norm under torch.func])."""
        g, u, _, _, w, b, shape, eps = self.args
        dims = trailing_dims(shape)
        rstd = (ReduceVar(u, dims, S.One, S.Zero) + eps) ** -S.Half
        xhat = (u - ReduceMean(u, dims, S.One)) * rstd  # not torch.layer_norm, whose derivatives are PyTorch's
        gxhat = g * w
        centered = gxhat - ReduceMean(gxhat, dims, S.One) - xhat * ReduceMean(gxhat * xhat, dims, S.One)
        grad_u = rstd * centered
        grad_w = (None, None) if w == 1 else (g * xhat, w)
        grad_b = (None, None) if b == 0 else (g, b)
        return [(grad_u, None), grad_w, grad_b]

    def part_formula(self, index: int) -> Expr | None:
        """The gradient of the input, the weight or the bias, as a formula."""
        return self.transform_formulas()[index][0]


class Item(Shaped, Spelled, Shown, TensorOp):
    """One tensor of a node that returns several: args (node, index)."""

    nargs = 2

    @property
    def detached(self) -> bool:
        """A statistic autograd does not differentiate (Note [layer norm statistics])."""
        return isinstance(self.args[0], LayerNormStats) and int(self.args[1]) != 0

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        node = self.args[0]
        if not isinstance(node, (LayerNormStats, LayerNormGrads)):
            return None  # of a temporary holding the tuple (emit): a tensor of a shape known at run time
        return node.item_shape(int(self.args[1]), table)

    def _torch(self, printer: TorchCode) -> str:
        return f"{printer._postfix(self.args[0])}[{int(self.args[1])}]"

    def _docstring(self, printer: Printer) -> str:
        node = self.args[0]
        if isinstance(node, Tupled):  # the formula of the entry
            return printer._print(node.part_formula(int(self.args[1])))
        return f"{printer._print(node)}[{int(self.args[1])}]"


class Rstd(Shaped, Spelled, Shown, TensorOp):
    """`base**(-1/2)` kept as a statistic autograd does not differentiate (Note [saved rstd] in
    opgen.optimize.norms): args (base,)."""

    nargs = 1

    @property
    def detached(self) -> bool:
        return True

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return shape_of(self.args[0], table)

    def elementary(self) -> Expr:
        return self.args[0] ** -S.Half

    def _torch(self, printer: TorchCode) -> str:
        return f"{printer.torch}.rsqrt({printer._print(self.args[0])})"


def trailing_dims(shape: sympy.Tuple) -> sympy.Basic:
    count = len(shape)
    return sympy.Integer(-1) if count == 1 else sympy.Tuple(*(sympy.Integer(d) for d in range(-count, 0)))


# -- spelling ----------------------------------------------------------------------------------------


def _shape(printer: TorchCode, shape: sympy.Tuple) -> str:
    sizes = [printer._print(s) for s in shape]
    return f"({sizes[0]},)" if len(sizes) == 1 else f"({', '.join(sizes)})"


def _optional(printer: TorchCode, value: sympy.Basic, absent: sympy.Basic) -> str:
    return "None" if value == absent else printer._print(value)


def _call(printer: TorchCode, function: str, expr: LayerNorm) -> str:
    """`torch.layer_norm(...)` or `torch.native_layer_norm(...)` (its value, mean and 1/std) of the node."""
    u, w, b, eps, shape = expr.args
    args = [printer._print(u), _shape(printer, shape), _optional(printer, w, S.One), _optional(printer, b, S.Zero)]
    return f"{printer.torch}.{function}({', '.join(args)}, {printer._print(eps)})"


# -- forward's statistics (Note [layer norm statistics]) ---------------------------------------------


class Residual(Protocol):
    """What forward reads of a residual (opgen.records.Residual)."""

    @property
    def name(self) -> str: ...

    @property
    def expr(self) -> Expr: ...


class Fresh(Protocol):
    """Names none of the generated function's takes (opgen.spec.names.Namer)."""

    def fresh(self, base: str) -> str: ...


Pending = dict[sympy.Basic, dict[int, str]]  # statistics -> residual name of the mean (1) and rstd (2)


def saved_statistics(residuals: Iterable[Residual]) -> Pending:
    """Each layer norm's statistics forward saves, with the residual names of its mean (1) and rstd (2)."""
    by_stats: Pending = {}
    for residual in residuals:
        if isinstance(residual.expr, Item) and residual.expr.detached:
            by_stats.setdefault(residual.expr.args[0], {})[int(residual.expr.args[1])] = residual.name
    return by_stats


def _of(stats: sympy.Basic, expr: sympy.Basic) -> bool:
    """Whether `expr` is a layer norm whose statistics are `stats`."""
    return isinstance(expr, LayerNorm) and (expr.args[0], expr.args[3], expr.args[4]) == tuple(stats.args)


def _statistics_line(
    name: str, stats: LayerNormStats, names: dict[int, str], node: LayerNorm | None, printer: TorchCode
) -> str:
    """`name, mean, rstd = native_layer_norm(...)` of `node` (`_` and the plain layer norm without one)."""
    call = _call(printer, "native_layer_norm", node if node is not None else stats.plain())
    return f"{name}, {names.get(1, '_')}, {names.get(2, '_')} = {call}"


def let_statistics(name: str, expr: sympy.Basic, pending: Pending, printer: TorchCode) -> tuple[str, set[str]] | None:
    """The let `name` as the call that also gives saved statistics, if it is that layer norm, with the
    residuals it assigns (`pending` loses them)."""
    for stats, names in pending.items():
        if _of(stats, expr):
            assert isinstance(stats, LayerNormStats) and isinstance(expr, LayerNorm)
            del pending[stats]
            return _statistics_line(name, stats, names, expr, printer), set(names.values())
    return None


def statistics_lines(
    pending: Pending, outputs: Sequence[tuple[str, sympy.Basic]], printer: TorchCode, fresh: Fresh
) -> tuple[list[str], set[str], dict[sympy.Basic, sympy.Symbol]]:
    """The statements computing the saved statistics no let gave: each with the layer norm of an output
    in one call, when an output is that layer norm or holds it (`relu(ln) + 2 * ln`); the residuals
    and outputs they assign; and each layer norm computed as a part, with the name holding it (a name
    from `fresh`), for the outputs to read."""
    lines, done, parts = [], set(), {}
    for stats, names in pending.items():
        assert isinstance(stats, LayerNormStats)
        found = [(name, e) for name, e in outputs if _of(stats, e) and name not in done]
        inner = [e for _, e in outputs for e in sympy.preorder_traversal(e) if _of(stats, e) and e not in parts]
        name, node = found[0] if found else ("_", None)
        if not found and inner:
            node = inner[0]
            parts[node] = sympy.Symbol(fresh.fresh("normed"), real=True)
            name = parts[node].name
        assert node is None or isinstance(node, LayerNorm)
        lines.append(_statistics_line(name, stats, names, node, printer))
        done |= {name, *names.values()} - {"_", *(s.name for s in parts.values())}
    return lines, done, parts
