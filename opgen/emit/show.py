"""What `opgen show` prints about an op: its formulas, gradients, saved values and kernels.

Receives the `Plan` the pipeline makes for the generated code (nothing is derived again);
returns lines of text. The formulas and gradients are the ones the functional's docstring
shows (opgen.emit.docstring), or their LaTeX; what backward saves is the plan's; a kernel is
an IR node of opgen.nodes.kernels (or a tensor kernel such as `torch.softmax`) printed as
the call the generated code makes.
"""

from __future__ import annotations

import sympy
from sympy.printing.latex import LatexPrinter
from sympy.printing.precedence import PRECEDENCE

from opgen.emit.display import kernels_as_formulas, unguarded
from opgen.emit.docstring import formulas_doc
from opgen.emit.names import make_names, make_printer, variant_printer, variant_temps
from opgen.emit.printer import TorchPrinter
from opgen.formula import functions as fn
from opgen.formula import tensor
from opgen.nodes.kernels import KernelBackward, OutputBackward, Primitive
from opgen.plan.backward import Plan

# The nodes that are one PyTorch kernel each (the rest of a formula is elementwise arithmetic).
_KERNELS: tuple[type[sympy.Basic], ...] = (Primitive, KernelBackward, OutputBackward, tensor.Softmax)
_KERNELS += (tensor.LogSoftmax, tensor.SoftmaxBackward, tensor.LogSoftmaxBackward, tensor.ReduceLogSumExp)


def show(plan: Plan, latex: bool = False) -> list[str]:
    """The lines `opgen show` prints for one op."""
    spec = plan.derived.spec
    names = make_names(plan)
    lines = [f"{spec.name} ({spec.loc.file})"]  # the path as given, as the problems name it
    formulas = _latex(plan) if latex else formulas_doc(plan.derived, plan, names)
    lines += ["  " + line if line else "" for line in formulas]
    lines += ["", "  Saved for backward:", *(f"    {line}" for line in _saved(plan))]
    printer = variant_printer(make_printer(plan, names), plan.backward[-1], names)  # knows backward's temporaries
    lines += ["", "  Kernels:", *(f"    {line}" for line in _kernels(plan, printer))]
    return lines


def _saved(plan: Plan) -> list[str]:
    tensors = [f"{name} (hidden output)" if name in {r.name for r in plan.residuals} else name for name in plan.saved]
    lines = [f"tensors: {', '.join(tensors) or 'none'}"]
    if plan.ctx_values:
        lines.append(f"numbers: {', '.join(plan.ctx_values)}")
    if plan.shapes:
        lines.append(f"shapes of: {', '.join(plan.shapes)}")
    if plan.dim_sizes:
        lines.append(f"sizes of dimensions: {', '.join(plan.dim_sizes)}")
    return lines


def _kernels(plan: Plan, printer: TorchPrinter) -> list[str]:
    """Each kernel call of forward and of backward (all inputs present), in the order of the formulas."""
    full = plan.derived.full
    forward = [expr for _, expr in (*full.lets, *((r.name, r.expr) for r in plan.residuals), *full.outputs)]
    backward: list[sympy.Basic] = [t.expr for t in variant_temps(plan.backward[-1])]
    for grad in plan.backward[-1].grads:
        total = sum((plan.incoming[c.output] * c.factor for c in grad.contributions if c.output), sympy.S.Zero)
        node = plan.kernel(total)
        backward += [node if node is not None else total] + [c.factor for c in grad.contributions if not c.output]
    lines = []
    for where, exprs in (("forward", forward), ("backward", backward)):
        calls = dict.fromkeys(_call(node, printer) for expr in exprs for node in _nodes(expr))
        lines += [f"{where}: {call}" for call in calls]
    return lines or ["none: every formula is elementwise torch arithmetic"]


def _nodes(expr: sympy.Basic) -> list[sympy.Basic]:
    """The kernel nodes of `expr`, outermost first."""
    if isinstance(expr, _KERNELS):
        return [expr]
    return [node for arg in expr.args for node in _nodes(arg)]


def _call(node: sympy.Basic, printer: TorchPrinter) -> str:
    if isinstance(node, KernelBackward) and node.primitive.backward_in_place:
        return f"{node.primitive.__name__}'s derivative, computed in place (Note [forward in place])"
    return printer.doprint_expr(node)


def _latex(plan: Plan) -> list[str]:
    """The forward formulas and the gradients in LaTeX, one `name = formula` per line."""
    derived = plan.derived
    symbols = derived.symbols
    table = {s: _latex_name(n) for group in (symbols.inputs, symbols.lets, symbols.outputs) for n, s in group.items()}
    table |= {r.symbol: _latex_name(r.name) for r in plan.residuals}
    single = len(plan.incoming) == 1
    table |= {s: (r"\bar{g}" if single else rf"\bar{{g}}_{{{_latex_name(o)}}}") for o, s in plan.incoming.items()}
    full = derived.full
    lines = ["Forward:"]
    for name, expr in [*full.lets, *((r.name, r.expr) for r in plan.residuals), *full.outputs]:
        lines.append(f"    {_latex_name(name)} = {_to_latex(expr, table)}")
    lines += ["", "Gradients:"]
    for gradient in full.gradients:
        total = sum(
            ((plan.incoming[c.output] * c.factor) if c.output else c.factor for c in gradient.contributions),
            sympy.S.Zero,
        )
        target = rf"\frac{{\partial L}}{{\partial {_latex_name(gradient.input)}}}"
        lines.append(f"    {target} = {_to_latex(total, table)}")
    return lines


def _latex_name(name: str) -> str:
    head, _, rest = name.partition("_")
    return rf"\mathrm{{{head}}}_{{\mathrm{{{rest}}}}}" if rest else (name if len(name) == 1 else rf"\mathrm{{{name}}}")


def _to_latex(expr: sympy.Basic, table: dict[sympy.Symbol, str]) -> str:
    plain = unguarded(kernels_as_formulas(expr)).replace(
        lambda e: isinstance(e, (fn.maximum, fn.minimum)),
        lambda e: (sympy.Max if isinstance(e, fn.maximum) else sympy.Min)(*e.args[:2], evaluate=False),
    )
    return _LatexPrinter({"symbol_names": table, "mul_symbol": "dot"}).doprint(plain)


class _LatexPrinter(LatexPrinter):
    """SymPy's LaTeX printer, with the tensor nodes of opgen.formula.tensor."""

    def _print_MatMul(self, expr: tensor.MatMul) -> str:
        return " ".join(self.parenthesize(arg, PRECEDENCE["Mul"], strict=True) for arg in expr.args)

    def _print_Transpose(self, expr: tensor.Transpose) -> str:
        return f"{self.parenthesize(expr.args[0], PRECEDENCE['Pow'], strict=True)}^{{T}}"

    def _print_TensorOp(self, expr: tensor.TensorOp) -> str:
        name = (expr.spec_name if isinstance(expr, tensor.ReductionBase) else "") or type(expr).__name__
        args = ", ".join(self._print(arg) for arg in expr.args)
        return rf"\operatorname{{{name}}}\left({args}\right)"
