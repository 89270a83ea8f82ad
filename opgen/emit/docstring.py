"""The docstring of an op's functional: the forward formulas and the derived gradients."""

from __future__ import annotations

import itertools

import sympy

from opgen.emit.display import display, display_lines
from opgen.emit.names import OpNames
from opgen.formula import slicing
from opgen.formula.dims import counted
from opgen.formula.read import dimension_names
from opgen.formula.tensor import dim_size
from opgen.nodes.base import Tupled, UnderTransforms
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
    table |= _incoming_names(plan, set(table.values()))
    labels = _gradient_labels([g.input for g in derived.full.gradients], set(table.values()))
    table |= {dim_size(d): d for d in dimension_names(spec)}
    table |= {dim_size(d): _size_doc(d) for d in plan.dim_sizes if counted(d)}
    lines = ["Forward:"]
    full = derived.full
    residuals = {r.symbol: r.expr for r in plan.residuals}  # the code's own: the formulas read what they compute
    for name, expr in [*full.lets, *full.outputs]:
        lines += display_lines(f"    {name}", expr.xreplace(residuals), table, DOC_WIDTH)
    lines.append("")
    lines.append("Gradients:" if not spec.gradients else "Gradients (overrides marked):")
    lets = _inlined_lets(derived)
    hidden = {r.name for r in plan.residuals}  # returned for backward only: the caller never sees them
    for gradient in full.gradients:
        seen = [c for c in gradient.contributions if c.output not in hidden]
        if not seen:
            lines.append(f"    {labels[gradient.input]} = 0")
            continue
        total = sum(((plan.incoming[c.output] * c.factor) if c.output else c.factor for c in seen), sympy.S.Zero)
        total = total.xreplace({r.grad: sympy.S.Zero for r in plan.residuals})
        total = _named(total.xreplace(residuals), lets)
        mark = "  (override)" if gradient.overridden else ""
        for target, part in _in_place(labels[gradient.input], total):
            lines += display_lines(f"    {target}", part, table, DOC_WIDTH - len(mark))
        lines[-1] += mark
    return lines


def _in_place(label: str, total: sympy.Basic) -> list[tuple[str, sympy.Basic]]:
    """`grad_x = total`, or where `total` puts the gradients of the parts of a dimension each in its place
    (the `Pad`s of `x[..., :D // 2]` and `x[..., D // 2:]`), one line per part: `grad_x[..., :D // 2] = ...`."""
    total = total.replace(
        lambda e: isinstance(e, UnderTransforms) and not isinstance(e, Tupled), lambda e: e.elementary()
    )
    parts: dict[slicing.Cut, sympy.Basic] = {}
    for term in sympy.Add.make_args(total):
        coeff, pad = term.as_coeff_Mul()
        if not isinstance(pad, slicing.Pad):
            return [(label, total)]
        parts[pad.cut] = parts.get(pad.cut, sympy.S.Zero) + coeff * pad.args[0]
    cuts = sorted(parts, key=lambda c: c.start)
    same = len({(c.dim, c.base, c.whole) for c in cuts}) == 1
    tiled = (
        cuts[0].start == 0
        and cuts[-1].stop == cuts[0].whole
        and all(a.stop == b.start for a, b in itertools.pairwise(cuts))
    )
    if not (same and tiled):
        return [(label, total)]
    target = sympy.Symbol(label)
    return [(display(slicing.make(slicing.Slice, target, cut), {}), parts[cut]) for cut in cuts]


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


def _named(total: sympy.Basic, lets: dict[sympy.Basic, sympy.Symbol]) -> sympy.Basic:
    """`total` reading each let by its name where it computes the let's formula: whole, or a sum's
    terms among others (`1 - p*t - (1 - p)*(1 - t)` is `1 - p_t`); the later lets, which hold the
    earlier, first. The sums among others only in a gradient of at most SUBS_NODES nodes: SymPy's
    `subs` matches them in time that grows with both (a 40-let chain of sums took seconds)."""
    small = sum(1 for _ in sympy.preorder_traversal(total)) <= SUBS_NODES
    for expr, symbol in reversed(list(lets.items())):
        total = total.xreplace({expr: symbol})
        if small and isinstance(expr, sympy.Add) and total.has(*expr.args):
            total = total.subs(expr, symbol)
    return total


SUBS_NODES = 400


def _inlined_lets(derived: Derived) -> dict[sympy.Basic, sympy.Symbol]:
    """Each `let` of the all-present variant, in terms of inputs only -> its symbol (for docstrings)."""
    inlined: dict[sympy.Basic, sympy.Basic] = {}
    for name, expr in derived.full.lets:
        inlined[derived.symbols.lets[name]] = expr.xreplace(inlined)
    return {expr: symbol for symbol, expr in inlined.items() if not expr.is_Atom}
