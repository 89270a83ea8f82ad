"""Python syntax trees of formulas -> source text as `ruff format` writes it, in lines that fit.

`ast.unparse` writes valid Python, but not the project's style: `x ** 3` where ruff writes
`x**3`, `-x ** 2` for ruff's `-(x**2)`, `1.2e+16` for `1.2e16`, and one line of any length.
`source` prints an expression of the formula language's nodes (and what
`opgen.formula.reference` builds from them) as ruff would; `fitted` lays a statement out in
lines of at most LINE_LENGTH (Note [fitted statements]).

Note [fitted statements]
~~~~~~~~~~~~~~~~~~~~~~~~
A statement `head + expression` that does not fit on one line is laid out in the first way
of these that fits, each what `ruff format` itself leaves as it is:

1. a call, its arguments on one line of their own: `y = f(\\n    a, b\\n)`;
2. a chain of two or more operators of one precedence, in parentheses on a line of its own:
   `y = (\\n    a + b - c\\n)`;
3. otherwise its longest part becomes a named temporary (`y_t0 = ...`, itself fitted) and the
   statement is tried again. A part that cannot be cut further stays as it is.

Ruff's own further layouts (one operand or argument a line) are never needed, so they are not
reproduced here; `tests/test_generated_style.py` runs ruff over packages of long formulas.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable

from opgen.spec.quote import float_literal, string

LINE_LENGTH = 120  # ruff's, as the project sets it

# Python's binding strengths (the grammar's order), higher binds tighter.
_COMPARE, _BIT_OR, _BIT_XOR, _BIT_AND, _ADD, _MUL, _UNARY, _POW, _CALL, _ATOM = 5, 6, 7, 8, 10, 11, 12, 13, 15, 16
_BINARY = {
    ast.BitOr: (_BIT_OR, "|"),
    ast.BitXor: (_BIT_XOR, "^"),
    ast.BitAnd: (_BIT_AND, "&"),
    ast.Add: (_ADD, "+"),
    ast.Sub: (_ADD, "-"),
    ast.Mult: (_MUL, "*"),
    ast.Div: (_MUL, "/"),
    ast.MatMult: (_MUL, "@"),
    ast.FloorDiv: (_MUL, "//"),
    ast.Mod: (_MUL, "%"),
    ast.Pow: (_POW, "**"),
}
_UNARY_TEXT = {ast.USub: "-", ast.UAdd: "+", ast.Invert: "~"}
_COMPARE_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def precedence(node: ast.expr) -> int:
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)][0]
    if isinstance(node, ast.UnaryOp):
        return _UNARY
    if isinstance(node, ast.Compare):
        return _COMPARE
    if isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        return _CALL
    return _ATOM


def _simple_operand(node: ast.expr) -> bool:
    """An operand `**` hugs (Note [spacing] in opgen.emit.number_print): a name, a number, a dotted
    name, either negated; a power of such operands on the right."""
    if isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not):
        return _simple_operand(node.operand)
    if isinstance(node, ast.Attribute):
        return _simple_operand(node.value) and not isinstance(node.value, ast.Constant)
    return isinstance(node, ast.Name) or (isinstance(node, ast.Constant) and not isinstance(node.value, str))


def _simple_bound(node: ast.expr) -> bool:
    """A slice bound ruff writes without spaces around `:`: a name, a number, a dotted name, negated or not."""
    if isinstance(node, ast.UnaryOp):
        return _simple_bound(node.operand)
    if isinstance(node, ast.Attribute):
        return _simple_bound(node.value)
    return isinstance(node, (ast.Name, ast.Constant))


def _hugged(node: ast.BinOp) -> bool:
    right = node.right
    right_simple = _simple_operand(right) or (
        isinstance(right, ast.BinOp) and isinstance(right.op, ast.Pow) and _hugged(right)
    )
    return _simple_operand(node.left) and precedence(node.left) > _POW and right_simple


class _Source:
    def __init__(self, math_name: str) -> None:
        self.math = math_name

    def text(self, node: ast.expr) -> str:
        method: Callable[[ast.expr], str] | None = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            raise ValueError(f"no source rule for {type(node).__name__}")
        return method(node)

    def wrapped(self, node: ast.expr, parens: bool) -> str:
        return f"({self.text(node)})" if parens else self.text(node)

    def _Constant(self, node: ast.Constant) -> str:  # noqa: N802
        value = node.value
        if isinstance(value, float) and not math.isfinite(value):
            return f"{self.math}.nan" if math.isnan(value) else f"{self.math}.inf"
        if isinstance(value, str):
            return string(value)
        if value is Ellipsis:
            return "..."
        return float_literal(value) if isinstance(value, float) else repr(value)

    def _Name(self, node: ast.Name) -> str:  # noqa: N802
        return node.id

    def _Attribute(self, node: ast.Attribute) -> str:  # noqa: N802
        value = node.value
        parens = precedence(value) < _CALL or (isinstance(value, ast.Constant) and isinstance(value.value, int))
        return f"{self.wrapped(value, parens)}.{node.attr}"

    def _Subscript(self, node: ast.Subscript) -> str:  # noqa: N802
        index = node.slice
        items = index.elts if isinstance(index, ast.Tuple) and len(index.elts) > 1 else [index]
        text = ", ".join(self.text(item) for item in items)
        return f"{self.wrapped(node.value, precedence(node.value) < _CALL)}[{text}]"

    def _Slice(self, node: ast.Slice) -> str:  # noqa: N802 - `x[..., : D // 2]`, spaced as ruff does
        bounds = [node.lower, node.upper] + ([node.step] if node.step else [])
        texts = ["" if b is None else self.text(b) for b in bounds]
        if not any(b is not None and not _simple_bound(b) for b in bounds):
            return ":".join(texts)
        return " : ".join(texts).replace("  ", " ").strip()

    def _Call(self, node: ast.Call) -> str:  # noqa: N802
        args = [self.text(a) for a in node.args] + [f"{k.arg}={self.text(k.value)}" for k in node.keywords]
        return f"{self.wrapped(node.func, precedence(node.func) < _CALL)}({', '.join(args)})"

    def _Tuple(self, node: ast.Tuple) -> str:  # noqa: N802 - a reduction's `dim=(-2, -1)`
        items = [self.text(item) for item in node.elts]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"

    def _List(self, node: ast.List) -> str:  # noqa: N802 - the pieces of `torch.cat([-x2, x1], dim=-1)`
        return "[" + ", ".join(self.text(item) for item in node.elts) + "]"

    def _UnaryOp(self, node: ast.UnaryOp) -> str:  # noqa: N802
        operand = node.operand
        power = isinstance(operand, ast.BinOp) and isinstance(operand.op, ast.Pow)
        # ruff writes a negated power `-(x**2)`, though Python needs no parentheses there
        return _UNARY_TEXT[type(node.op)] + self.wrapped(operand, power or precedence(operand) < _UNARY)

    def _BinOp(self, node: ast.BinOp) -> str:  # noqa: N802
        prec, op = _BINARY[type(node.op)]
        if prec == _POW:  # right-associative; its right operand may be negated, `2**-x`
            left = self.wrapped(node.left, precedence(node.left) <= _POW)
            right = self.wrapped(node.right, precedence(node.right) < _UNARY)
            return f"{left}**{right}" if _hugged(node) else f"{left} ** {right}"
        left = self.wrapped(node.left, precedence(node.left) < prec)
        return f"{left} {op} {self.wrapped(node.right, precedence(node.right) <= prec)}"

    def _Compare(self, node: ast.Compare) -> str:  # noqa: N802
        parts = [self.wrapped(node.left, precedence(node.left) <= _COMPARE)]
        for op, right in zip(node.ops, node.comparators, strict=True):
            parts.append(f"{_COMPARE_TEXT[type(op)]} {self.wrapped(right, precedence(right) <= _COMPARE)}")
        return " ".join(parts)


def source(node: ast.expr, math_name: str = "math") -> str:
    """`node` as `ruff format` writes it on one line; `math_name` names the `math` module (for infinities)."""
    return _Source(math_name).text(node)


def _chain(node: ast.expr) -> int:
    """How many operators of `node`'s own precedence join its operands (0: not an operator chain)."""
    if isinstance(node, ast.Compare):
        return len(node.ops)
    if not isinstance(node, ast.BinOp) or isinstance(node.op, ast.Pow):
        return 0
    prec = precedence(node)
    return 1 + sum(_chain(side) for side in (node.left, node.right) if precedence(side) == prec)


def _parts(node: ast.expr) -> list[ast.expr]:
    """The operands and arguments of `node` a temporary may hold (not names or numbers)."""
    found = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.keyword):
            child = child.value
        if isinstance(child, (ast.Name, ast.Constant, ast.Attribute)) or not isinstance(child, ast.expr):
            continue
        found.append(child)
    return found


def fitted(head: str, node: ast.expr, indent: int, fresh: Callable[[str], str], math_name: str = "math") -> list[str]:
    """`head + node` as lines of at most LINE_LENGTH at `indent`, with the temporaries it needs before
    it (Note [fitted statements]), named `fresh("<target>_t0")`, ...; `head` is `NAME = ` or `return `.
    The parts moved into temporaries are taken out of `node`."""
    stem = head.removesuffix(" = ") if head.endswith(" = ") else "value"
    return _Fitter(_Source(math_name), indent, lambda: fresh(stem)).lines(head, node)


class _Fitter:
    def __init__(self, printer: _Source, indent: int, fresh: Callable[[], str]) -> None:
        self.printer = printer
        self.indent = indent
        self.fresh = fresh

    def lines(self, head: str, node: ast.expr) -> list[str]:
        text = self.printer.text(node)
        width = LINE_LENGTH - self.indent
        if len(head) + len(text) <= width:
            return [head + text]
        inner, pad, close = width - 4, "\n" + " " * (self.indent + 4), "\n" + " " * self.indent
        if isinstance(node, ast.Call):
            printer = self.printer
            args = [printer.text(a) for a in node.args] + [f"{k.arg}={printer.text(k.value)}" for k in node.keywords]
            call = f"{head}{printer.wrapped(node.func, precedence(node.func) < _CALL)}("
            if len(call) <= width and len(", ".join(args)) <= inner:
                return [f"{call}{pad}{', '.join(args)}{close})"]
        if _chain(node) >= 2 and head.endswith("= ") and len(text) <= inner and len(head) + 1 <= width:
            return [f"{head}({pad}{text}{close})"]
        sized = [(len(self.printer.text(p)), k, p) for k, p in enumerate(_parts(node))]
        sized = [s for s in sized if s[0] > 12]  # naming `x + 1` only moves text
        if not sized:
            return [head + text]
        part = max(sized, key=lambda s: (s[0], -s[1]))[2]  # the longest; the first of equals
        name = self.fresh()
        before = self.lines(f"{name} = ", part)
        return before + self.lines(head, _replaced(node, part, ast.Name(name, ast.Load())))


def _replaced(tree: ast.expr, old: ast.expr, new: ast.expr) -> ast.expr:
    """`tree` with the node `old` (by identity) replaced by `new`, in place."""

    class Swap(ast.NodeTransformer):
        def visit(self, node: ast.AST) -> ast.AST:
            return new if node is old else super().visit(node)

    return Swap().visit(tree)  # type: ignore[return-value]
