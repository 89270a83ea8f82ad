"""Printing the gated linear unit nodes (opgen.optimize.gates) as PyTorch's kernels, and as formulas in docstrings.

Note [glu under torch.func]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
`aten.glu_backward` has second derivatives (`glu_double_backward`) and a forward-mode derivative
(`glu_backward_jvp`), but no batching rule for the latter (torch 2.13): `torch.func.hessian`
and `jacfwd` over a gradient fall back to a loop over the batch, with a warning. Under torch.func
transforms backward takes the gradient's formula instead, `F.pad` of the two halves' gradients,
which every transform handles; a plain backward and double backward (`create_graph`) run the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opgen.optimize.gates import Glu, GluBackward

if TYPE_CHECKING:
    from opgen.emit.printer import TorchPrinter
    from opgen.emit.runtime_names import RuntimeNames


class GatePrinting:
    """`torch.nn.functional.glu(u, dim)`, `torch.ops.aten.glu_backward(g, u, dim)`."""

    if TYPE_CHECKING:  # provided by TorchPrinter
        torch: str
        runtime: RuntimeNames

        def _print(self, expr: Any, **kwargs: Any) -> str: ...

        def _postfix(self, expr: Any) -> str: ...

    def _print_Glu(self, expr: Glu) -> str:
        return f"{self.torch}.nn.functional.glu({self._print(expr.args[0])}, {int(expr.args[1])})"

    def glu_backward_call(self, expr: GluBackward) -> tuple[str, list[str]]:
        """`aten.glu_backward` and its arguments, printed."""
        g, u, dim = expr.args[:3]
        grad = self._print(g)
        if expr.carried:  # summed to the output's shape: the kernel wants it
            d, shape = int(dim), f"{self._postfix(u)}.shape"
            after = f", *{shape}[{d + 1}:]" if d != -1 else ""
            grad = f"{self._postfix(g)}.sum_to_size(*{shape}[:{d}], {shape}[{d}] // 2{after})"
        return f"{self.torch}.ops.aten.glu_backward", [grad, self._print(u), str(int(dim))]

    def _print_GluBackward(self, expr: GluBackward) -> str:
        """The kernel, or under torch.func transforms the formula (Note [glu under torch.func]);
        `glu_backward_lines` writes the two as an `if` statement instead."""
        function, args = self.glu_backward_call(expr)
        kernel = f"{function}({', '.join(args)})"
        formula = self._print(expr.formula())
        return f"({kernel} if not {self.runtime.transforms_active}() else {formula})"


Assign = Callable[..., list[str]]  # opgen.emit.statements.assign
CallLines = Callable[[str, str, list[str], int], list[str]]


def glu_backward_lines(
    var: str, expr: GluBackward, printer: TorchPrinter, indent: int, assign: Assign, call_lines: CallLines, width: int
) -> list[str]:
    """`var = ` the kernel, or under torch.func transforms the formula (Note [glu under torch.func])."""
    function, args = printer.glu_backward_call(expr)
    return [
        f"if not {printer.runtime.transforms_active}():",
        *("    " + line for line in call_lines(var, function, args, width - indent - 4)),
        "else:",
        *("    " + line for line in assign(var, expr.formula(), printer, indent + 4, shared=True)),
    ]


class GateDisplay:
    """The nodes as the formulas they compute."""

    if TYPE_CHECKING:

        def _print(self, expr: Any, **kwargs: Any) -> str: ...

    def _print_Glu(self, expr: Glu) -> str:
        return self._print(expr.elementary())

    def _print_GluBackward(self, expr: GluBackward) -> str:
        return f"glu_backward({self._print(expr.args[0])}, {self._print(expr.args[1])}, dim={int(expr.args[2])})"
