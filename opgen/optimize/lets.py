"""Lowering a pattern that spans `let`s: each definition read with the lets it uses written out."""

from __future__ import annotations

from collections.abc import Callable

import sympy
from sympy import Expr

from opgen.formula.read import Formulas


def through_lets(formulas: Formulas, choose: Callable[[Expr, Expr], Expr | None]) -> Formulas:
    """Each definition read with the lets it uses written out (`full`); where `choose(full, written)`
    gives a new form, that form replaces it, with any let it still contains whole folded back to its name."""
    inlined: dict[sympy.Symbol, Expr] = {}
    definitions = dict(formulas.definitions)
    for name, expr in formulas.definitions.items():
        full = expr.xreplace(inlined)
        symbol = formulas.symbols.lets.get(name)
        if symbol is not None:
            inlined[symbol] = full
        chosen = choose(full, expr)
        if chosen is not None:
            folds = {value: s for s, value in inlined.items() if not value.is_Atom and s is not symbol}
            definitions[name] = chosen.xreplace(folds)
    return Formulas(formulas.spec, formulas.symbols, definitions, formulas.overrides, formulas.numbers, formulas.shapes)


def lower_through_lets(
    formulas: Formulas, applies: Callable[[Expr], bool], lower: Callable[[Expr], Expr], node: type
) -> Formulas:
    """Each definition that, with the lets it uses written out (`applies` to it), holds a `node` once `lower`ed,
    with that lowered form."""

    def choose(full: Expr, written: Expr) -> Expr | None:
        lowered = lower(full) if applies(full) else None
        return lowered if lowered is not None and lowered.has(node) else None

    return through_lets(formulas, choose)
