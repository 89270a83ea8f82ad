"""Lowering a pattern that spans `let`s: each definition read with the lets it uses written out."""

from __future__ import annotations

from collections.abc import Callable

import sympy
from sympy import Expr

from opgen.formula.read import Formulas


def lower_through_lets(
    formulas: Formulas, applies: Callable[[Expr], bool], lower: Callable[[Expr], Expr], node: type
) -> Formulas:
    """Each definition that, with the lets it uses written out (`applies` to it), holds a `node` once `lower`ed,
    with that lowered form; any let it still contains whole folded back to its name."""
    lets = {formulas.symbols.lets[n] for n in formulas.definitions if n in formulas.symbols.lets}
    inlined: dict[sympy.Symbol, Expr] = {}
    definitions = dict(formulas.definitions)
    for name, expr in formulas.definitions.items():
        full = expr.xreplace(inlined)
        symbol = formulas.symbols.lets.get(name)
        if symbol is not None:
            inlined[symbol] = full
        if not applies(full):
            continue
        lowered = lower(full)
        if lowered.has(node):
            folds = {value: s for s, value in inlined.items() if not value.is_Atom and s is not symbol and s in lets}
            definitions[name] = lowered.xreplace(folds)
    return Formulas(formulas.spec, formulas.symbols, definitions, formulas.overrides, formulas.numbers, formulas.shapes)
