"""Plan stage: what CSE leaves among the formulas of backward or forward mode, made right: the
conditions it found, put back inline with the temporaries they leave (Note [conditions shared by
gradients]), and sums that are multiples of a temporary (Note [sums that are multiples of a
temporary])."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import sympy
from sympy import Expr

from opgen.formula.kinds import Mask


@dataclass(frozen=True)
class Temp:
    symbol: sympy.Symbol
    expr: sympy.Basic
    kernel: bool = False  # `g * prime(u)` may print as a backward kernel (Note [gradients that negate another])


@dataclass(frozen=True)
class TempGroup:
    """Temporaries needed by exactly the gradients (or the tangents) of `users`."""

    users: tuple[str, ...]
    temps: tuple[Temp, ...]


def inline_conditions(
    replacements: list[tuple[sympy.Symbol, sympy.Basic]],
    exprs: list[Expr],
    masks: bool = False,
) -> tuple[list[Temp], list[Expr]]:
    """Put boolean temporaries back where they are used, and those that are a number.

    Note [conditions computed once]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    A condition CSE finds several times (`where(x > 0, rsqrt(where(x > 0, x, 1)) / 2, 0)`, a guard
    and the branch it guards; the ties of `max(l1, l2)` in two gradients) was a full-size comparison
    per use. With `masks`, it is computed once, a `Mask` temporary: a bool tensor, which the printer
    never takes a dtype from (`(cond).to(...)`, the numbers of `where(cond, 2, 0)` take theirs from
    the comparison it holds). Without (forward mode), conditions stay inline.
    A number is one when CSE rebuilt a part the reader kept unevaluated (`grad * where(n > n, 1, 0)`
    is 0): put back, the nodes that read it fold (Note [kernels of a zero gradient] in
    opgen.formula.tensor) where `tmp0 = 0` would meet `tmp0 @ x` at run time.
    """
    temps: list[Temp] = []
    inline: dict[sympy.Symbol, sympy.Basic] = {}
    names = sympy.numbered_symbols("tmp:", cls=sympy.Symbol, real=True, start=len(replacements))
    for symbol, expr in replacements:
        expr = expr.xreplace(inline)
        if expr.is_number:
            inline[symbol] = expr
        elif not isinstance(expr, sympy.logic.boolalg.Boolean) or isinstance(expr, Expr):
            temps.append(Temp(symbol, expr))
        elif masks and symbol not in exprs:
            inline[symbol] = Mask(symbol.name)
            temps.append(Temp(inline[symbol], expr))
        else:
            sides, expr = _condition_sides(expr, {t.expr: t.symbol for t in temps}, names)
            temps += sides
            inline[symbol] = expr
    return temps, [e.xreplace(inline) for e in exprs]


def _condition_sides(
    condition: sympy.Basic, known: dict[sympy.Basic, sympy.Symbol], names: Iterator[sympy.Symbol]
) -> tuple[list[Temp], sympy.Basic]:
    """Note [conditions shared by gradients]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    A condition CSE found in several gradients (`margin - x*y > 0` of a hinge, in `grad_x` and
    `grad_y`) is put back inline (a bool temporary would misprint `(cond).to(...)`), and with it
    the arithmetic CSE had hidden inside it: each gradient computed `margin - x*y` again. The
    operands of its comparisons that are computed (not a name, not a number) become temporaries
    of their own, computed once; only the comparison repeats."""
    temps: list[Temp] = []
    replace: dict[sympy.Basic, sympy.Basic] = {}
    for node in sympy.preorder_traversal(condition):
        if not isinstance(node, sympy.core.relational.Relational):
            continue
        for side in node.args:
            if side.is_Atom or side.is_number or side in replace:
                continue
            if side not in known:
                known[side] = next(names)
                temps.append(Temp(known[side], side))
            replace[side] = known[side]
    return temps, condition.xreplace(replace)


def read_multiples(temps: list[Temp], exprs: list[Expr]) -> tuple[list[Temp], list[Expr]]:
    """Note [sums that are multiples of a temporary]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    SymPy multiplies a number into a sum (`2*(x - y)` is `2*x - 2*y`), so CSE does not see the
    temporary `x - y` in it, and the printer, which takes the number out again, computed `x - y`
    a second time (the derivative of `(x - y)**2` beside `abs(x - y)`). A sum that is a number
    times an earlier temporary's sum, or its negation, reads that temporary."""
    sums: dict[sympy.Basic, sympy.Symbol] = {}

    def multiple(node: sympy.Basic) -> sympy.Basic:
        number, rest = node.primitive()
        for sign in (1, -1):
            if sign * rest in sums:
                return sign * number * sums[sign * rest]
        return node

    def read(expr: sympy.Basic) -> sympy.Basic:
        if not sums:
            return expr
        return expr.replace(lambda e: isinstance(e, sympy.Add), multiple)

    done: list[Temp] = []
    for temp in temps:
        done.append(Temp(temp.symbol, read(temp.expr), temp.kernel))
        if isinstance(temp.expr, sympy.Add):
            sums.setdefault(temp.expr, temp.symbol)
    return done, [read(e) for e in exprs]


def cse_as_written(
    exprs: list[sympy.Basic], symbols: Iterator[sympy.Symbol]
) -> tuple[list[tuple[sympy.Symbol, sympy.Basic]], list[sympy.Basic]]:
    """Note [comparisons CSE would decide]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    `sympy.cse(order='canonical')` of `exprs`, with every comparison the reader kept unevaluated
    (`x != x`, which keeps the shape of `where(x != x, 0.5, 0.25)`) held as it is: CSE rebuilds the
    formulas and would decide it, and `sum(where(x != x, 0.5, 0.25))` became `sum(0.25)`, a reduction
    of a number that lost the count it sums over (forward mode printed `(0.25).sum(-1)`)."""
    decided = {
        node
        for e in exprs
        for node in sympy.preorder_traversal(e)
        if isinstance(node, sympy.core.relational.Relational) and node.func(*node.args) != node
    }
    held = {node: sympy.Dummy("held") for node in sorted(decided, key=sympy.default_sort_key)}
    exprs = _one_side(exprs)
    replacements, reduced = sympy.cse([e.xreplace(held) for e in exprs], symbols=symbols, order="canonical")
    back = {d: node for node, d in held.items()}
    return [(s, e.xreplace(back)) for s, e in replacements], [e.xreplace(back) for e in reduced]


def _one_side(exprs: list[sympy.Basic]) -> list[sympy.Basic]:
    """`b < a` written `a > b` where the formulas compare both ways (max's and min's ties of the same
    pair), so CSE sees one comparison (Note [conditions computed once])."""
    relations = {
        n for e in exprs for n in sympy.preorder_traversal(e) if isinstance(n, sympy.core.relational.Relational)
    }
    turned = {}
    for node in sorted(relations, key=sympy.default_sort_key):
        twin = node.reversed
        if twin in relations and twin not in turned and twin != node:
            turned[node] = twin
    return [e.xreplace(turned) for e in exprs] if turned else exprs
