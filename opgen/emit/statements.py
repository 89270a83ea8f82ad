"""Assignments of printed formulas, each line short enough for the project's style.

Note [short lines]
~~~~~~~~~~~~~~~~~~
Generated code passes `ruff format --check` at line length 120 without running ruff: the
printer spaces as ruff does (Note [spacing] in opgen.emit.number_print), and no statement is longer
than ruff would leave on one line. A formula whose assignment would pass the line length
at its indentation is cut: its largest parts become named temporaries (`grad_x_t0 = ...`)
until the rest fits. Conditions stay inline (a bool
tensor would give `(cond).to(...)` the wrong dtype, Note in opgen.plan.backward), and so do plain
numbers too short to matter. A single call that cannot be cut further stays as it is. Which parts
a statement computes once because it uses them twice is the plan's decision (opgen.plan.blocks).
"""

from __future__ import annotations

import sympy
from sympy import Expr

from opgen.emit.printer import TorchPrinter
from opgen.formula.kinds import with_definitions
from opgen.nodes.base import UnderTransforms
from opgen.plan.blocks import Block, is_condition
from opgen.spec.names import Namer

LINE_LENGTH = 120
Lines = list[str]


class _Temporaries:
    """`grad_x_t0`, `grad_x_t1`, ...: names for the parts of one assignment, none taken."""

    def __init__(self, var: str, printer: TorchPrinter) -> None:
        self.var = var
        self.namer = Namer({*printer.names.values(), printer.torch, printer.math, var})
        self.count = 0

    def __iter__(self) -> _Temporaries:
        return self

    def __next__(self) -> sympy.Symbol:
        self.count += 1
        return sympy.Symbol(self.namer.fresh(f"{self.var}_t{self.count - 1}"), real=True)


def assign(var: str, expr: sympy.Basic, printer: TorchPrinter, indent: int) -> list[str]:
    """`var = expr` as lines of at most LINE_LENGTH at `indent`."""
    return _short(var, expr, printer, _Temporaries(var, printer), LINE_LENGTH - indent)


def assign_block(
    targets: list[str],
    block: Block,
    printer: TorchPrinter,
    indent: int,
    read: tuple[dict[sympy.Basic, sympy.Basic], ...] = (),
) -> list[str]:
    """`target = value` for each value of the plan's `block` (opgen.plan.blocks), its parts first, each
    named `<first target>_t0`, ...; `read`: what forward has already computed, by the name to read,
    replaced in turn (a part that becomes a name is read in place)."""

    def reading(expr: sympy.Basic) -> sympy.Basic:
        for computed in read:
            expr = expr.xreplace(computed) if computed else expr
        return expr.xreplace(names)

    temporaries = _Temporaries(targets[0], printer)
    width = LINE_LENGTH - indent
    names: dict[sympy.Basic, sympy.Basic] = {}
    lines: list[str] = []
    for symbol, part in block.parts:
        part = reading(part)
        if part.is_Atom:
            names[symbol] = part
            continue
        name = next(temporaries)
        lines += _short(name.name, part, printer, temporaries, width)
        printer = _knowing(printer, name, part)
        names[symbol] = name
    for var, value in zip(targets, block.values, strict=True):
        lines += _short(var, reading(value), printer, temporaries, width)
    return lines


def under_transforms(var: str, node: UnderTransforms, block: Block, printer: TorchPrinter, indent: int) -> list[str]:
    """`var = ` the kernel `node`, or under torch.func transforms or in double backward its formulas
    (`block`): the value itself, or each part of the tuple assigned on its own lines (Note [glu under torch.func] in
    opgen.nodes.glu, Note [layer norm under torch.func] in opgen.nodes.layer_norm)."""
    function, args = node.kernel_call(printer)
    formulas = node.transform_formulas()
    if len(formulas) == 1:
        lines = assign_block([var], block, printer, indent + 4)
    else:
        lines = _tuple_parts(var, formulas, block, printer, indent + 4)
    return [
        f"if {printer.runtime.backward_kernels}():",
        *indent_lines(call_lines(var, function, args, LINE_LENGTH - indent - 4)),
        "else:",
        *indent_lines(lines),
    ]


def _tuple_parts(
    var: str, formulas: list[tuple[Expr | None, Expr | None]], block: Block, printer: TorchPrinter, indent: int
) -> Lines:
    """`var = a, b, c`, the parts assigned first, together (summed to the shape of their input), None
    where a part is."""
    temporaries = _Temporaries(var, printer)
    names = [None if part is None else next(temporaries).name for part, _ in formulas]
    lines = assign_block([name for name in names if name], block, printer, indent)
    for name, (_, into) in zip(names, formulas, strict=True):
        if name is not None and into is not None:
            lines.append(f"{name} = {name}.sum_to_size({printer.doprint_expr(into)}.shape)")
    return [*lines, f"{var} = {', '.join(name or 'None' for name in names)}"]


def call_lines(var: str, function: str, args: list[str], width: int) -> list[str]:
    """`var = function(args)` as ruff formats it in `width` columns: on one line, else the arguments
    on one line of their own, else one argument a line."""
    joined = ", ".join(args)
    if len(var) + len(function) + len(joined) + 5 <= width:
        return [f"{var} = {function}({joined})"]
    if len(joined) + 4 <= width:
        return [f"{var} = {function}(", f"    {joined}", ")"]
    return [f"{var} = {function}(", *(f"    {a}," for a in args), ")"]


def _knowing(printer: TorchPrinter, symbol: sympy.Symbol, expr: sympy.Basic) -> TorchPrinter:
    tensors = with_definitions(printer.tensors, [(symbol, expr)]) - printer.tensors
    return printer.with_symbols({symbol: symbol.name}, tensors)


def _unwrapped(text: str) -> str:
    """`text` without parentheses around all of it (`(-F.threshold(...))`): a right-hand side needs none."""
    if not text.startswith("(") or not text.endswith(")"):
        return text
    depth = 0
    for k, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return text[1:-1] if k == len(text) - 1 else text
    return text


def _short(var: str, expr: sympy.Basic, printer: TorchPrinter, temporaries: _Temporaries, width: int) -> list[str]:
    lines: list[str] = []
    text = _unwrapped(printer.doprint_expr(expr))
    ternary = _ternary_parts(text)
    if len(var) + 3 + len(text) > width and ternary and all(len(p) <= width - 9 for p in ternary):
        value, condition, other = ternary  # as ruff splits a conditional expression
        return [f"{var} = (", f"    {value}", f"    if {condition}", f"    else {other}", ")"]
    while len(var) + 3 + len(text) > width:
        part = _largest_part(expr, printer)
        if part is None:
            break
        symbol = next(temporaries)
        lines += _short(symbol.name, part, printer, temporaries, width)
        printer = _knowing(printer, symbol, part)
        expr = expr.xreplace({part: symbol})
        text = _unwrapped(printer.doprint_expr(expr))
    return [*lines, *_wrapped(var, text, width)]


def _wrapped(var: str, text: str, width: int) -> list[str]:
    """`var = text` in `width` columns as ruff wraps a right-hand side that cannot be cut further."""
    call = _call_parts(text)
    fits = call is not None and len(call[1]) <= width - 4 and len(var) + 4 + len(call[0]) <= width
    if len(var) + 3 + len(text) > width and call is not None and fits:
        return [f"{var} = {call[0]}(", f"    {call[1]}", ")"]  # as ruff splits a call's arguments
    if len(var) + 3 + len(text) > width and len(text) <= width - 4:
        return [f"{var} = (", f"    {text}", ")"]  # as ruff wraps a right-hand side: parts too small to name
    return [f"{var} = {text}"]


def text_lines(var: str, text: str, indent: int) -> list[str]:
    """`var = text`, printed code that is no formula (`t if t is None else t + step`), at `indent`, as ruff
    lays it out: on one line, else bracketed on one line of its own, else a conditional split at `if`
    and `else`, or a call's arguments on a line of their own."""
    width = LINE_LENGTH - indent
    ternary = _ternary_parts(text)
    if len(var) + 3 + len(text) > width and len(text) > width - 4 and ternary:
        value, condition, other = ternary
        return [f"{var} = (", f"    {value}", f"    if {condition}", f"    else {other}", ")"]
    return _wrapped(var, text, width)


def _ternary_parts(text: str) -> tuple[str, str, str] | None:
    """(value, condition, other) when `text` is `value if condition else other` outside any bracket."""
    depth, found = 0, []
    for k, char in enumerate(text):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(char, 0)
        for word in (" if ", " else "):
            if depth == 0 and text.startswith(word, k):
                found.append((word, k))
    if [w for w, _ in found] != [" if ", " else "]:
        return None
    (_, at_if), (_, at_else) = found
    return text[:at_if], text[at_if + 4 : at_else], text[at_else + 6 :]


def _call_parts(text: str) -> tuple[str, str] | None:
    """(function, arguments) when `text` is one call `f.g(args)`, its last bracket closing its first."""
    head, bracket, rest = text.partition("(")
    if not bracket or not text.endswith(")") or not head.replace(".", "").replace("_", "").isalnum():
        return None
    depth = 0
    for k, char in enumerate(text[len(head) :]):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and k != len(text) - len(head) - 1:
            return None
    return head, rest[:-1]


def _parts(expr: sympy.Basic) -> list[sympy.Basic]:
    """The operands of `expr` a temporary may hold; a condition's own operands in its place."""
    found = []
    for arg in expr.args:
        if is_condition(arg):
            found += _parts(arg)
        elif isinstance(arg, Expr) and not arg.is_Atom:
            found.append(arg)
    return found


def _largest_part(expr: sympy.Basic, printer: TorchPrinter) -> sympy.Basic | None:
    """The operand of `expr` that prints longest, if naming it shortens the line."""
    sized = [(len(printer.doprint_expr(p)), sympy.default_sort_key(p), p) for p in _parts(expr)]
    sized = [s for s in sized if s[0] > 12]  # `x + 1` as a temporary only moves the text
    if not sized:
        return None
    return max(sized, key=lambda s: (s[0], s[1]))[2]


def indent_lines(lines: Lines, level: int = 1) -> Lines:
    """`lines` indented `level` deep; empty lines stay empty."""
    return [("    " * level + line) if line else line for line in lines]


def variant_branches(
    bodies: list[tuple[tuple[str, ...], Lines]], optional: list[str], is_none: dict[str, str]
) -> Lines:
    """The body of each variant (the `Tensor?` inputs it lacks, its lines) under `if` branches on
    one optional input at a time, nested, so that a type checker knows in every branch which
    inputs are tensors; no branch where the variants left have the same body."""
    if all(body == bodies[-1][1] for _, body in bodies) or not optional:
        return bodies[-1][1]
    name, rest = optional[0], optional[1:]
    without = [(absent, body) for absent, body in bodies if name in absent]
    present = [(absent, body) for absent, body in bodies if name not in absent]
    if not without or not present:
        return variant_branches(without or present, rest, is_none)
    return [
        f"if {is_none[name]}:",
        *indent_lines(variant_branches(without, rest, is_none)),
        "else:",
        *indent_lines(variant_branches(present, rest, is_none)),
    ]


def size_line(target: str, text: str) -> str:
    """`target = text`, a size of `size_text`; torch leaves `broadcast_shapes` untyped, so a count of
    several inputs is read under the ignore that names that error (Note [typed generated code])."""
    ignore = "  # type: ignore[no-untyped-call, unused-ignore]" if ".broadcast_shapes(" in text else ""
    return f"{target} = {text}{ignore}"
