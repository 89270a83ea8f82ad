"""The docstring of an op's functional: the forward formulas and the derived gradients."""

from __future__ import annotations

import sympy

from opgen.emit.display import display_lines
from opgen.emit.names import OpNames
from opgen.formula.dims import counted
from opgen.formula.read import dimension_names
from opgen.formula.tensor import dim_size
from opgen.plan.backward import Plan
from opgen.records import Derived

DOC_WIDTH = 120 - 4  # the functional's docstring is indented once


def _size_doc(dim: str) -> str:
    """`numel(x, t)`: how a count of a reduction over plain Tensors reads (Note [counts of unknown shapes])."""
    what = "batch_numel" if dim.startswith("%") else "numel"  # the entries of their batches `...`
    return f"{what}({', '.join(counted(dim) or ())})"


def formulas_doc(derived: Derived, plan: Plan, names: OpNames) -> list[str]:
    """The forward formulas and the derived gradients, for docstrings."""
    spec = derived.spec
    symbols = derived.symbols
    table = {s: n for group in (symbols.inputs, symbols.lets, symbols.outputs) for n, s in group.items()}
    table |= {r.symbol: r.name for r in plan.residuals}
    table |= _incoming_names(plan, set(table.values()))
    labels = _gradient_labels([g.input for g in derived.full.gradients], set(table.values()))
    table |= {dim_size(d): d for d in dimension_names(spec)}
    table |= {dim_size(d): _size_doc(d) for d in plan.dim_sizes if counted(d)}
    lines = ["Forward:"]
    full = derived.full
    residuals = [(r.name, r.expr) for r in plan.residuals]
    for name, expr in [*full.lets, *residuals, *full.outputs]:
        lines += display_lines(f"    {name}", expr, table, DOC_WIDTH)
    lines.append("")
    lines.append("Gradients:" if not spec.gradients else "Gradients (overrides marked):")
    lets = _inlined_lets(derived)  # gradients through tensor operations name the lets they reuse
    hidden = {r.name for r in plan.residuals}  # returned for backward only: the caller never sees them
    for gradient in full.gradients:
        seen = [c for c in gradient.contributions if c.output not in hidden]
        if not seen:
            lines.append(f"    {labels[gradient.input]} = 0")
            continue
        total = sum(((plan.incoming[c.output] * c.factor) if c.output else c.factor for c in seen), sympy.S.Zero)
        total = total.xreplace({r.grad: sympy.S.Zero for r in plan.residuals})
        if gradient.fit is not None:
            total = total.xreplace(lets)
        mark = "  (override)" if gradient.overridden else ""
        lines += display_lines(f"    {labels[gradient.input]}", total, table, DOC_WIDTH - len(mark))
        lines[-1] += mark
    return lines


def _incoming_names(plan: Plan, taken: set[str]) -> dict[sympy.Basic, str]:
    """How the docstring names each output's incoming gradient: `grad` (one output) or `grad_y`, else
    (an input, let or output of that name: `grad * grad` would read as the input squared) the name
    with `_` appended until it is none of them."""
    single = len([o for o in plan.incoming if o not in {r.name for r in plan.residuals}]) == 1
    names: dict[sympy.Basic, str] = {}
    for output, symbol in plan.incoming.items():
        name = "grad" if single and "grad" not in taken else f"grad_{output}"
        while name in taken:
            name += "_"
        names[symbol] = name
    return names


def _gradient_labels(inputs: list[str], taken: set[str]) -> dict[str, str]:
    """How the docstring names each input's gradient: `grad_x`, else (an input, let, output or incoming
    gradient of that name: `grad_x = grad*grad_x` would read as a definition of itself) the name with `_`
    appended until it is none of them, as the backward's local for it."""
    labels = {name: f"grad_{name}" for name in inputs if f"grad_{name}" not in taken}
    taken = taken | set(labels.values())  # another input's own label (`grad_x_` of an input `x_`) stays
    for name in inputs:
        if name not in labels:
            label = f"grad_{name}_"
            while label in taken:
                label += "_"
            labels[name] = label
            taken.add(label)
    return labels


def _inlined_lets(derived: Derived) -> dict[sympy.Basic, sympy.Symbol]:
    """Each `let` of the all-present variant, in terms of inputs only -> its symbol (for docstrings)."""
    inlined: dict[sympy.Basic, sympy.Basic] = {}
    for name, expr in derived.full.lets:
        inlined[derived.symbols.lets[name]] = expr.xreplace(inlined)
    return {expr: symbol for symbol, expr in inlined.items() if not expr.is_Atom}
