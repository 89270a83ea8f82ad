"""Derive stage: `Formulas` -> SymPy forward formulas and gradients (`Derived`).

Receives the `Formulas` of a spec (`opgen.formula.read`, possibly rewritten by `opgen.optimize.passes`);
returns `Derived`: for each combination of present/absent `Tensor?` inputs (a `Variant`),
the forward `let`s and outputs as SymPy expressions and, for every Tensor input, its
gradient as contributions `grad_<output> * factor` (or the spec's override). SymPy
differentiates the fully inlined outputs, with PyTorch's conventions at kinks
(`opgen.formula.functions`) and the branches of `where` guarded against NaN (`opgen.derive.guard`,
Note [double where]), and the parts of the outputs that the save stage may make residuals
(`opgen.derive.parts`). It differentiates what it is given and nothing more: the pipeline
decides which formulas (as written, or optimized) to hand it.
"""

from __future__ import annotations

import itertools

import sympy
from sympy import Expr, S

from opgen import limits
from opgen.derive.guard import guard_branches, settle_indicators
from opgen.derive.parts import derive_parts
from opgen.derive.powers import combine_powers
from opgen.derive.vjp import leaf_fit, substitute_outputs, tensor_gradient
from opgen.errors import Loc, Problems, SpecError, located
from opgen.formula import functions as fn
from opgen.formula import tensor, written
from opgen.formula.read import Formulas, Symbols, dimension_names, walk_as_written
from opgen.formula.syntax import holds_tensors, parse_ast
from opgen.nodes.base import Lowered
from opgen.records import Contribution, Derived, Gradient, Variant
from opgen.spec.model import Spec

__all__ = ["Contribution", "Derived", "Gradient", "Symbols", "Variant", "derive", "dimension_names", "drop_terms"]

MAX_OPTIONAL = 3


def drop_terms(expr: Expr, absent: frozenset[sympy.Symbol]) -> Expr | None:
    """`expr` with every additive term that uses an absent symbol removed; None if nothing is left.

    This is what a `Tensor?` input that is None means (spec format section 2): in
    `x * (1 + b)` the term `b` goes and `x` stays; in `x * b` or `exp(b)` the whole
    term goes.
    """
    if not (expr.free_symbols & absent):
        return expr
    if expr in absent:
        return None
    if isinstance(expr, Lowered):  # a lowered node with a term of its own (a layer norm's bias)
        return expr.without(absent, drop_terms)
    if isinstance(expr, sympy.Add):
        kept = [t for t in (drop_terms(a, absent) for a in expr.args) if t is not None]
        return sympy.Add(*kept) if kept else None
    args = [drop_terms(a, absent) if isinstance(a, Expr) else _drop_boolean(a, absent) for a in expr.args]
    if any(a is None for a in args):
        return None
    return expr.func(*args)


def _drop_boolean(expr: sympy.Basic, absent: frozenset[sympy.Symbol]) -> sympy.Basic | None:
    if not (expr.free_symbols & absent):
        return expr
    args = [drop_terms(a, absent) if isinstance(a, Expr) else _drop_boolean(a, absent) for a in expr.args]
    if any(a is None for a in args):
        return None
    return expr.func(*args)


def clean(expr: Expr, loc: Loc, what: str) -> Expr:
    expr = expr.replace(sympy.DiracDelta, lambda *args: S.Zero)
    if expr.has(sympy.Derivative) or expr.has(sympy.Subs):
        raise SpecError(loc, f"{what}: SymPy could not differentiate this formula; give the gradient in `gradients:`")
    if expr.has(sympy.zoo, sympy.nan):
        raise SpecError(loc, f"{what}: the derived formula is undefined (division by zero)")
    return combine_powers(expr)  # Note [power rule]


def _tensor_gradient(
    spec: Spec,
    symbols: Symbols,
    inlined: dict[sympy.Symbol, Expr],
    shapes: dict[sympy.Symbol, tensor.Shape],
    name: str,
) -> Gradient:
    """The gradient of input `name` by reverse mode over the tensor operations (`opgen.derive.vjp`)."""
    x = symbols.inputs[name]
    differentiable = [o for o in spec.outputs if o.differentiable]
    pairs = [
        (guard_branches(inlined[symbols.outputs[o.name]], symbols.tensors), symbols.grads[o.name])
        for o in differentiable
    ]
    loc = differentiable[0].formula.loc
    what = f"gradient of '{name}'"
    with located(loc, what):
        try:
            total = tensor_gradient(pairs, x, shapes, lambda e: clean(settle_indicators(e), loc, what))
            batch_inputs = sum(1 for i in spec.tensor_inputs if i.type.dims and tensor.BATCH in i.type.dims)
            fit = leaf_fit(total, x, shapes, batch_inputs)
        except tensor.ShapeError as error:
            raise SpecError(loc, f"{what}: {error}") from None
    # A non-differentiable output is a constant to double backward: never read in its formula's place.
    outputs = [(symbols.outputs[o.name], inlined[symbols.outputs[o.name]]) for o in spec.outputs if o.differentiable]
    total = substitute_outputs(total, outputs)
    contributions = (Contribution(None, total),) if total != 0 else ()
    return Gradient(name, contributions, False, fit)


def _variant(formulas: Formulas, absent_names: tuple[str, ...], shapes: dict[sympy.Symbol, tensor.Shape]) -> Variant:
    """The forward and the gradients when the `Tensor?` inputs `absent_names` are None."""
    spec, symbols = formulas.spec, formulas.symbols
    absent = {symbols.inputs[n] for n in absent_names}
    forward, inlined = _forward(formulas, absent, absent_names)
    uses_tensor_ops = any(tensor.has_tensor_ops(inlined[symbols.outputs[o.name]]) for o in spec.outputs)
    gradients = []
    for inp in spec.tensor_inputs:
        if inp.name in absent_names:
            continue
        if inp.name in formulas.overrides:
            gradients.append(_override(formulas, inp.name, inlined, frozenset(absent)))
        elif uses_tensor_ops:
            gradients.append(_tensor_gradient(spec, symbols, inlined, shapes, inp.name))
        else:
            gradients.append(_elementwise_gradient(spec, symbols, inlined, inp.name))
    needed = _needed_lets(spec, symbols, forward)
    lets = tuple((n, forward[n]) for n in (let.name for let in spec.lets) if n in needed)
    outputs = tuple((o.name, forward[o.name]) for o in spec.outputs)
    inlined_outputs = tuple((o.name, inlined[symbols.outputs[o.name]]) for o in spec.outputs)
    walk = walk_as_written(spec, symbols, shapes, frozenset(absent))
    expand = _expansions(spec, symbols, list(formulas.definitions), inlined, walk)
    return Variant(absent_names, lets, outputs, inlined_outputs, tuple(gradients), expand)


def _expansions(
    spec: Spec, symbols: Symbols, order: list[str], inlined: dict[sympy.Symbol, Expr], walk: written.Walk
) -> tuple[tuple[str, tuple[written.Piece, ...]], ...]:
    """The outputs of one variant whose simplified formula misses pieces of its shape as written."""
    defined = {**symbols.lets, **symbols.outputs}
    formulas = {let.name: let.formula for let in spec.lets} | {o.name: o.formula for o in spec.outputs}
    found = []
    for name in order:
        pieces = walk.defined[defined[name]] = walk.pieces(parse_ast(formulas[name]))
        if name in symbols.outputs and pieces:
            missing = written.uncovered(inlined[defined[name]], pieces, walk.shapes, walk.inputs)
            if missing:
                found.append((name, missing))
    rank = {o.name: k for k, o in enumerate(spec.outputs)}
    return tuple(sorted(found, key=lambda item: rank[item[0]]))


def _forward(
    formulas: Formulas, absent: set[sympy.Symbol], absent_names: tuple[str, ...]
) -> tuple[dict[str, Expr], dict[sympy.Symbol, Expr]]:
    """Each let and output without the terms of `absent` (a let left empty joins `absent`),
    and each in terms of the inputs only."""
    spec, symbols = formulas.spec, formulas.symbols
    defined = {**symbols.lets, **symbols.outputs}
    forward: dict[str, Expr] = {}
    inlined: dict[sympy.Symbol, Expr] = {}
    for name, definition in formulas.definitions.items():
        kept = drop_terms(definition, frozenset(absent))
        if kept is None:
            if name in symbols.outputs:
                output = spec.outputs[[o.name for o in spec.outputs].index(name)]
                both = " and ".join(absent_names)
                raise SpecError(
                    output.formula.loc,
                    f"output '{name}' has no terms left when {both} {'are' if len(absent_names) > 1 else 'is'} None"
                    " (an optional input drops every term it is in, so a factor of it drops the whole product);"
                    " make it required (`Tensor`), or give the output a term without it",
                )
            absent.add(defined[name])
            continue
        forward[name] = kept
        inlined[defined[name]] = kept.xreplace(inlined)
    tensor_inputs = set(symbols.tensor_inputs)
    for output in spec.outputs:
        limits.check_inlined(inlined[symbols.outputs[output.name]], output.formula.loc, f"output '{output.name}'")
        constant = not (inlined[symbols.outputs[output.name]].free_symbols & tensor_inputs)
        if constant and output.name not in holds_tensors(spec):  # Note [constant outputs] in opgen.emit.forward
            raise SpecError(output.formula.loc, f"output '{output.name}' does not depend on any Tensor input")
    return forward, inlined


# Note [overrides that read an output]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# An override may read an output (`clamp(grad * w * (1 - y**2 / w**2), -c, c)` for `y: tanh(x) * w`).
# Read from the saved output, double backward would differentiate `y` through the op's own backward,
# that is through the override where `y` depends on an overridden input: the second derivative
# would not be that of the override formula (gradgradcheck fails). Such an output is written out as
# its formula in the override; an output of no overridden input is read as saved (its gradient in
# the op is its formula's).


def _override(
    formulas: Formulas, name: str, inlined: dict[sympy.Symbol, Expr], absent: frozenset[sympy.Symbol]
) -> Gradient:
    """The gradient of input `name` as `gradients:` gives it, in terms of the inputs."""
    symbols = formulas.symbols
    lets_inlined = {s: inlined[s] for s in symbols.lets.values() if s in inlined}
    overridden = {symbols.inputs[n] for n in formulas.overrides}
    # Note [overrides that read an output]: written out where an override stands in its own gradient.
    for output in formulas.spec.outputs:
        value = inlined.get(symbols.outputs[output.name])
        if output.differentiable and value is not None and value.free_symbols & overridden:
            lets_inlined[symbols.outputs[output.name]] = value
    written_out = formulas.overrides[name].xreplace(lets_inlined)
    where = next(g.formula.loc for g in formulas.spec.gradients if g.input == name)
    limits.check_inlined(written_out, where, f"the gradient of '{name}'")
    kept = drop_terms(written_out, absent)
    kept = S.Zero if kept is None else guard_branches(kept, symbols.tensors)
    return Gradient(name, (Contribution(None, kept),), True)


def _elementwise_gradient(spec: Spec, symbols: Symbols, inlined: dict[sympy.Symbol, Expr], name: str) -> Gradient:
    """The gradient of input `name`: one contribution per differentiable output that uses it."""
    x = symbols.inputs[name]
    parts = []
    for output in spec.outputs:
        if not output.differentiable:
            continue
        what = f"d {output.name} / d {name}"
        with located(output.formula.loc, what):
            guarded = guard_branches(inlined[symbols.outputs[output.name]], symbols.tensors)
            factor = clean(settle_indicators(fn.real_diff(guarded, x)), output.formula.loc, what)
        if factor != 0:
            parts.append(Contribution(output.name, factor))
    return Gradient(name, tuple(parts), False)


def _needed_lets(spec: Spec, symbols: Symbols, forward: dict[str, Expr]) -> set[str]:
    """The lets the outputs use, directly or through other lets (a dropped term can orphan one)."""
    by_symbol = {s: n for n, s in symbols.lets.items()}
    needed: set[str] = set()
    pending = [forward[o.name] for o in spec.outputs]
    while pending:
        for symbol in pending.pop().free_symbols:
            name = by_symbol.get(symbol)
            if name is not None and name in forward and name not in needed:
                needed.add(name)
                pending.append(forward[name])
    return needed


def forward_only(formulas: Formulas) -> Derived:
    """The outputs of `formulas` with every input present, and no gradient: what the accuracy
    tests' oracle reads of the spec as written (Note [derived twice] in opgen/pipeline.py), for
    the cost of inlining the lets. Raises the `SpecError` that `derive` would record for them."""
    spec, symbols = formulas.spec, formulas.symbols
    forward, inlined = _forward(formulas, set(), ())
    lets = tuple((let.name, forward[let.name]) for let in spec.lets if let.name in forward)
    outputs = tuple((o.name, forward[o.name]) for o in spec.outputs)
    inlined_outputs = tuple((o.name, inlined[symbols.outputs[o.name]]) for o in spec.outputs)
    return Derived(spec, symbols, (Variant((), lets, outputs, inlined_outputs, ()),), dict(formulas.shapes))


def derive(formulas: Formulas, problems: Problems) -> Derived | None:
    """Derive every gradient of the spec `formulas` were read from; record located errors in `problems`."""
    spec, symbols = formulas.spec, formulas.symbols
    shapes = dict(formulas.shapes)  # the tensor gradients add the shapes of their parts
    optional = [i.name for i in spec.tensor_inputs if i.type.optional]
    try:
        if len(optional) > MAX_OPTIONAL:
            loc = spec.input(optional[MAX_OPTIONAL]).loc  # type: ignore[union-attr]
            raise SpecError(loc, f"at most {MAX_OPTIONAL} `Tensor?` inputs are supported per op")
        variants = []
        # Every subset of optional inputs may be None; the all-present variant comes last.
        for flags in itertools.product([True, False], repeat=len(optional)):
            absent = tuple(n for n, is_absent in zip(optional, flags, strict=True) if is_absent)
            variants.append(_variant(formulas, absent, shapes))
        # The parts of the outputs the save stage may make residuals (Note [parts of the outputs]).
        one = variants[0] if len(variants) == 1 else None
        parts = derive_parts(spec, symbols, one.outputs, one.inlined, shapes) if one is not None else ()
    except SpecError as error:
        problems.add(error)
        return None
    return Derived(spec, symbols, tuple(variants), shapes, parts)
