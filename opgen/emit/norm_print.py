"""Printing the layer norm nodes (opgen.optimize.norms) as PyTorch's kernels, and as formulas in docstrings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sympy
from sympy import S

from opgen.formula.tensor import ReduceMean, ReduceVar
from opgen.optimize.norms import Item, LayerNorm, LayerNormGrads, LayerNormStats, Rstd, trailing_dims
from opgen.optimize.save import Residual
from opgen.spec.names import Namer

if TYPE_CHECKING:
    from opgen.emit.runtime_names import RuntimeNames


class NormPrinting:
    """`torch.layer_norm(...)`, `torch.native_layer_norm(...)`, `aten.native_layer_norm_backward(...)`."""

    if TYPE_CHECKING:  # provided by TorchPrinter
        torch: str
        runtime: RuntimeNames

        def _print(self, expr: Any, **kwargs: Any) -> str: ...

        def _postfix(self, expr: sympy.Basic) -> str: ...

    def _norm_shape(self, shape: sympy.Tuple) -> str:
        sizes = [self._print(s) for s in shape]
        return f"({sizes[0]},)" if len(sizes) == 1 else f"({', '.join(sizes)})"

    def _optional(self, value: sympy.Basic, absent: sympy.Basic) -> str:
        return "None" if value == absent else self._print(value)

    def _print_LayerNorm(self, expr: LayerNorm) -> str:
        u, w, b, eps, shape = expr.args
        args = [self._print(u), self._norm_shape(shape), self._optional(w, S.One), self._optional(b, S.Zero)]
        return f"{self.torch}.layer_norm({', '.join(args)}, {self._print(eps)})"

    def _print_LayerNormStats(self, expr: LayerNormStats) -> str:
        u, eps, shape = expr.args
        return self.native_layer_norm(LayerNorm(u, S.One, S.Zero, eps, shape))

    def native_layer_norm(self, expr: LayerNorm) -> str:
        """`torch.native_layer_norm(...)` of the node: its value, mean and 1/std."""
        u, w, b, eps, shape = expr.args
        args = [self._print(u), self._norm_shape(shape), self._optional(w, S.One), self._optional(b, S.Zero)]
        return f"{self.torch}.native_layer_norm({', '.join(args)}, {self._print(eps)})"

    def norm_backward_call(self, expr: LayerNormGrads) -> tuple[str, list[str]]:
        """`aten.native_layer_norm_backward` and its arguments, printed."""
        g, u, mean, rstd, w, b, shape, _ = expr.args
        args = [self._print(a) for a in (g, u)] + [self._norm_shape(shape), self._print(mean), self._print(rstd)]
        args += [self._optional(w, S.One), self._optional(b, S.Zero), f"[True, {w != 1}, {b != 0}]"]
        return f"{self.torch}.ops.aten.native_layer_norm_backward", args

    def _print_LayerNormGrads(self, expr: LayerNormGrads) -> str:
        """The kernel, or under torch.func transforms the formulas (Note [layer norm under torch.func]);
        `opgen.emit.statements.assign` writes the two as an `if` statement instead."""
        function, args = self.norm_backward_call(expr)
        parts = [self._norm_part(part, into) for part, into in norm_backward_formulas(expr)]
        kernel = f"{function}({', '.join(args)})"
        return f"({kernel} if not {self.runtime.transforms_active}() else ({', '.join(parts)}))"

    def _print_Rstd(self, expr: Rstd) -> str:
        return f"{self.torch}.rsqrt({self._print(expr.args[0])})"

    def _norm_part(self, part: sympy.Expr | None, into: sympy.Expr | None) -> str:
        if part is None:
            return "None"
        return self._print(part) if into is None else f"{self._postfix(part)}.sum_to_size({self._print(into)}.shape)"

    def _print_Item(self, expr: Item) -> str:
        return f"{self._postfix(expr.args[0])}[{int(expr.args[1])}]"


def norm_backward_formulas(expr: LayerNormGrads) -> list[tuple[sympy.Expr | None, sympy.Expr | None]]:
    """Note [layer norm under torch.func]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    PyTorch's forward-mode derivative of `native_layer_norm_backward` misses how the weight's
    gradient depends on the input (`torch.func.hessian` of `F.layer_norm` disagrees with reverse
    over reverse in that block, torch 2.13): under torch.func transforms backward takes the
    gradients' formulas, from the input alone, instead of the kernel and the saved statistics.
    Each is (formula, the input whose shape it is summed to, or None), or (None, None) for an absent one.
    """
    g, u, _, _, w, b, shape, eps = expr.args
    dims = trailing_dims(shape)
    xhat = LayerNorm(u, S.One, S.Zero, eps, shape)
    rstd = (ReduceVar(u, dims, S.One, S.Zero) + eps) ** -S.Half
    gxhat = g * w
    centered = gxhat - ReduceMean(gxhat, dims, S.One) - xhat * ReduceMean(gxhat * xhat, dims, S.One)
    grad_u = sympy.Mul(rstd, centered, evaluate=False)
    grad_w = (None, None) if w == 1 else (g * xhat, w)
    grad_b = (None, None) if b == 0 else (g, b)
    return [(grad_u, None), grad_w, grad_b]


def saved_statistics(residuals: tuple[Residual, ...]) -> dict[sympy.Basic, dict[int, str]]:
    """Each layer norm's statistics forward saves, with the residual names of its mean (1) and rstd (2)."""
    by_stats: dict[sympy.Basic, dict[int, str]] = {}
    for residual in residuals:
        if isinstance(residual.expr, Item) and residual.expr.detached:
            by_stats.setdefault(residual.expr.args[0], {})[int(residual.expr.args[1])] = residual.name
    return by_stats


def _of(stats: sympy.Basic, expr: sympy.Basic) -> bool:
    """Whether `expr` is a layer norm whose statistics are `stats`."""
    return isinstance(expr, LayerNorm) and (expr.args[0], expr.args[3], expr.args[4]) == tuple(stats.args)


def statistics_line(
    name: str, stats: sympy.Basic, names: dict[int, str], node: sympy.Basic | None, printer: NormPrinting
) -> str:
    """`name, mean, rstd = native_layer_norm(...)` of `node` (`_` and the plain layer norm without one)."""
    u, eps, shape = stats.args
    node = node if node is not None else LayerNorm(u, S.One, S.Zero, eps, shape)
    return f"{name}, {names.get(1, '_')}, {names.get(2, '_')} = {printer.native_layer_norm(node)}"


def let_statistics(
    name: str, expr: sympy.Basic, pending: dict[sympy.Basic, dict[int, str]], printer: NormPrinting
) -> tuple[str, set[str]] | None:
    """The let `name` as the call that also gives saved statistics, if it is that layer norm, with the
    residuals it assigns (`pending` loses them)."""
    for stats, names in pending.items():
        if _of(stats, expr):
            del pending[stats]
            return statistics_line(name, stats, names, expr, printer), set(names.values())
    return None


def statistics_lines(
    pending: dict[sympy.Basic, dict[int, str]],
    outputs: tuple[tuple[str, sympy.Basic], ...],
    printer: NormPrinting,
    fresh: Namer,
) -> tuple[list[str], set[str], dict[sympy.Basic, sympy.Symbol]]:
    """The statements computing the saved statistics no let gave (Note [layer norm statistics]): each with
    the layer norm of an output in one call, when an output is that layer norm or holds it
    (`relu(ln) + 2 * ln`); the residuals and outputs they assign; and each layer norm computed as a
    part, with the name holding it (a name from `fresh`), for the outputs to read."""
    lines, done, parts = [], set(), {}
    for stats, names in pending.items():
        found = [(name, e) for name, e in outputs if _of(stats, e) and name not in done]
        inner = [e for _, e in outputs for e in sympy.preorder_traversal(e) if _of(stats, e) and e not in parts]
        name, node = found[0] if found else ("_", None)
        if not found and inner:
            node = inner[0]
            parts[node] = sympy.Symbol(fresh.fresh("normed"), real=True)
            name = parts[node].name
        lines.append(statistics_line(name, stats, names, node, printer))
        done |= {name, *names.values()} - {"_", *(s.name for s in parts.values())}
    return lines, done, parts


class NormDisplay:
    """The nodes as the formulas they compute."""

    if TYPE_CHECKING:

        def _print(self, expr: Any, **kwargs: Any) -> str: ...

    def _print_LayerNorm(self, expr: LayerNorm) -> str:
        return self._print(expr.elementary())

    def _print_Rstd(self, expr: Rstd) -> str:
        return f"1/sqrt({self._print(expr.args[0])})"

    def _print_LayerNormStats(self, expr: LayerNormStats) -> str:
        return f"layer_norm_stats({self._print(expr.args[0])})"

    def _print_LayerNormGrads(self, expr: LayerNormGrads) -> str:
        return f"layer_norm_backward({self._print(expr.args[0])}, {self._print(expr.args[1])})"

    def _print_Item(self, expr: Item) -> str:
        return f"{self._print(expr.args[0])}[{int(expr.args[1])}]"
