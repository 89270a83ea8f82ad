"""Printing the layer norm nodes (opgen.optimize.norms) as PyTorch's kernels, and as formulas in docstrings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sympy
from sympy import S

from opgen.optimize.norms import Item, LayerNorm, LayerNormGrads, LayerNormStats
from opgen.optimize.save import Residual


class NormPrinting:
    """`torch.layer_norm(...)`, `torch.native_layer_norm(...)`, `aten.native_layer_norm_backward(...)`."""

    if TYPE_CHECKING:  # provided by TorchPrinter
        torch: str

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

    def _print_LayerNormGrads(self, expr: LayerNormGrads) -> str:
        g, u, mean, rstd, w, b, shape, _ = expr.args
        mask = f"[True, {w != 1}, {b != 0}]"
        args = [self._print(a) for a in (g, u)] + [self._norm_shape(shape), self._print(mean), self._print(rstd)]
        args += [self._optional(w, S.One), self._optional(b, S.Zero), mask]
        kernel = f"{self.torch}.ops.aten.native_layer_norm_backward({', '.join(args)})"
        return f"({kernel} if not {self.torch}._C._are_functorch_transforms_active() else {self._formula(expr)})"

    def _formula(self, expr: LayerNormGrads) -> str:
        """Note [layer norm under torch.func]
        ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
        PyTorch's forward-mode derivative of `native_layer_norm_backward` misses how the weight's
        gradient depends on the input (`torch.func.hessian` of `F.layer_norm` disagrees with reverse
        over reverse in that block, torch 2.13): under torch.func transforms backward takes the
        gradients' formulas, from the input alone, instead of the kernel and the saved statistics.
        """
        g, u, _, _, w, b, shape, _ = expr.args
        dims = "-1" if len(shape) == 1 else "(" + ", ".join(str(d) for d in range(-len(shape), 0)) + ")"
        eps = self._print(expr.eps)
        x, grad = self._print(u), self._print(g)
        xhat = f"{self.torch}.layer_norm({x}, {self._norm_shape(shape)}, None, None, {eps})"
        rstd = f"{self.torch}.rsqrt({x}.var({dims}, correction=0, keepdim=True) + {eps})"
        gxhat = grad if w == 1 else f"{grad} * {self._print(w)}"
        centered = f"{gxhat} - ({gxhat}).mean({dims}, keepdim=True)"
        gx = f"{rstd} * ({centered} - {xhat} * ({gxhat} * {xhat}).mean({dims}, keepdim=True))"
        gw = "None" if w == 1 else f"({grad} * {xhat}).sum_to_size({self._print(w)}.shape)"
        gb = "None" if b == 0 else f"{grad}.sum_to_size({self._print(b)}.shape)"
        return f"({gx}, {gw}, {gb})"

    def _print_Item(self, expr: Item) -> str:
        return f"{self._postfix(expr.args[0])}[{int(expr.args[1])}]"


def statistics_lines(
    residuals: tuple[Residual, ...], outputs: tuple[tuple[str, sympy.Basic], ...], printer: NormPrinting
) -> tuple[list[str], set[str]]:
    """The statements computing the saved statistics (Note [layer norm statistics]): each with the output that
    is the same layer norm, when there is one, in one call; and the residuals and outputs they assign."""
    lines, done = [], set()
    by_stats: dict[sympy.Basic, dict[int, str]] = {}
    for residual in residuals:
        if isinstance(residual.expr, Item) and residual.expr.detached:
            by_stats.setdefault(residual.expr.args[0], {})[int(residual.expr.args[1])] = residual.name
    for stats, names in by_stats.items():
        u, eps, shape = stats.args
        found = [
            (name, e)
            for name, e in outputs
            if isinstance(e, LayerNorm) and (e.args[0], e.args[3], e.args[4]) == (u, eps, shape) and name not in done
        ]
        name, node = found[0] if found else ("_", LayerNorm(u, S.One, S.Zero, eps, shape))
        targets = [name, names.get(1, "_"), names.get(2, "_")]
        lines.append(f"{', '.join(targets)} = {printer.native_layer_norm(node)}")
        done |= {t for t in targets if t != "_"}
    return lines, done


class NormDisplay:
    """The nodes as the formulas they compute."""

    if TYPE_CHECKING:

        def _print(self, expr: Any, **kwargs: Any) -> str: ...

    def _print_LayerNorm(self, expr: LayerNorm) -> str:
        return self._print(expr.elementary())

    def _print_LayerNormStats(self, expr: LayerNormStats) -> str:
        return f"layer_norm_stats({self._print(expr.args[0])})"

    def _print_LayerNormGrads(self, expr: LayerNormGrads) -> str:
        return f"layer_norm_backward({self._print(expr.args[0])}, {self._print(expr.args[1])})"

    def _print_Item(self, expr: Item) -> str:
        return f"{self._print(expr.args[0])}[{int(expr.args[1])}]"
