"""Derive stage: `Spec` -> SymPy forward formulas and gradients.

Receives a `Spec`; returns `Derived`: for each combination of present/absent `Tensor?`
inputs (a `Variant`), the forward `let`s and outputs as SymPy expressions and, for every
Tensor input, its gradient as contributions `grad_<output> * factor` (or the spec's
override). Formulas are read by `opgen.formula`; SymPy differentiates the fully inlined
outputs, with PyTorch's conventions at kinks (`opgen.functions`) and the branches of
`where` guarded against NaN (`opgen.guard`, Note [double where]).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

import sympy
from sympy import Expr, S

from opgen import limits, tensor
from opgen.errors import Loc, Problems, SpecError, located
from opgen.formula import NUM, Scope, Value, holds_tensors, read_formula
from opgen.guard import guard_branches, settle_indicators
from opgen.kinds import with_definitions
from opgen.model import Spec
from opgen.vjp import LeafFit, leaf_fit, substitute_outputs, tensor_gradient

MAX_OPTIONAL = 3


@dataclass(frozen=True)
class Symbols:
    """The SymPy symbol of every name a spec's formulas can use."""

    inputs: dict[str, sympy.Symbol]
    lets: dict[str, sympy.Symbol]
    outputs: dict[str, sympy.Symbol]
    grads: dict[str, sympy.Symbol]  # output name -> its incoming gradient
    tensor_names: frozenset[str]  # the Tensor inputs

    @property
    def tensors(self) -> frozenset[sympy.Symbol]:
        """Symbols that hold tensors at run time (printed as torch calls)."""
        return frozenset([*self.tensor_inputs, *self.outputs.values(), *self.grads.values()])

    @property
    def tensor_inputs(self) -> list[sympy.Symbol]:
        return [s for n, s in self.inputs.items() if n in self.tensor_names]


@dataclass(frozen=True)
class Contribution:
    """`grad_<output> * factor`, or with `output` None, a whole gradient override."""

    output: str | None
    factor: Expr


@dataclass(frozen=True)
class Gradient:
    input: str
    contributions: tuple[Contribution, ...]
    overridden: bool
    # Formulas with tensor operations: one contribution holding the whole gradient (`output`
    # None), already summed to the input's shape except for what `fit` leaves to run time.
    fit: LeafFit | None = None


@dataclass(frozen=True)
class Variant:
    absent: tuple[str, ...]  # the `Tensor?` inputs that are None
    lets: tuple[tuple[str, Expr], ...]  # in terms of inputs and earlier lets
    outputs: tuple[tuple[str, Expr], ...]  # in terms of inputs, lets and earlier outputs
    inlined: tuple[tuple[str, Expr], ...]  # outputs in terms of inputs only
    gradients: tuple[Gradient, ...]  # one per present Tensor input, in input order


@dataclass(frozen=True)
class Derived:
    spec: Spec
    symbols: Symbols
    variants: tuple[Variant, ...]  # the all-present variant last
    shapes: dict[sympy.Symbol, tensor.Shape]  # static shape of every input, let, output and gradient

    @property
    def has_tensor_ops(self) -> bool:
        """Some formula uses `@`, `.T` or a reduction (gradients by `opgen.vjp`)."""
        return any(g.fit is not None for v in self.variants for g in v.gradients)

    @property
    def full(self) -> Variant:
        return self.variants[-1]


def make_symbols(spec: Spec) -> Symbols:
    def sym(name: str) -> sympy.Symbol:
        return sympy.Symbol(name, real=True)

    symbols = Symbols(
        inputs={i.name: sym(i.name) for i in spec.inputs},
        lets={let.name: sym(let.name) for let in spec.lets},
        outputs={o.name: sym(o.name) for o in spec.outputs},
        # `:` cannot occur in a spec name, so these never collide with one.
        grads={o.name: sym("grad:" + o.name) for o in spec.outputs if o.differentiable},
        tensor_names=frozenset(i.name for i in spec.tensor_inputs),
    )
    return symbols


def forward_scope(spec: Spec, symbols: Symbols) -> Scope:
    names = {n: Value(s, NUM) for n, s in symbols.inputs.items()}
    names |= {n: Value(s, NUM) for n, s in symbols.lets.items()}
    names |= {n: Value(s, NUM) for n, s in symbols.outputs.items()}
    # A named dimension is also a number: its size (`q @ k.T / sqrt(D)`); spec names win.
    for dim in dimension_names(spec):
        names.setdefault(dim, Value(tensor.dim_size(dim), NUM))
    hint = "; `grad` names are only known in `gradients:`" if spec.outputs else ""
    tensors = frozenset(names[n].expr for n in holds_tensors(spec))  # Note [tensor-valued lets]
    return Scope(names, tensors, hint)  # type: ignore[arg-type]


def dimension_names(spec: Spec) -> list[str]:
    """The named dimensions of the Tensor inputs, in order of first appearance."""
    dims: list[str] = []
    for inp in spec.tensor_inputs:
        dims += [d for d in inp.type.dims or () if d != tensor.BATCH and d not in dims]
    return dims


def gradient_scope(spec: Spec, symbols: Symbols) -> Scope:
    scope = forward_scope(spec, symbols)
    names = dict(scope.names)
    for name, grad in symbols.grads.items():
        names["grad_" + name] = Value(grad, NUM)
    if len(symbols.grads) == 1:
        names["grad"] = Value(next(iter(symbols.grads.values())), NUM)
    known = ", ".join(sorted(n for n in names if n.startswith("grad")))
    tensors = scope.tensors | frozenset(symbols.grads.values())
    return Scope(names, tensors, f"; incoming gradients here are: {known}", _unavailable(spec))


def _unavailable(spec: Spec) -> tuple[tuple[str, str], ...]:
    """Incoming-gradient names a `gradients:` formula might reach for that do not exist."""
    differentiable = [o.name for o in spec.outputs if o.differentiable]
    why = [
        (f"grad_{o.name}", f"output '{o.name}' is `differentiable: false`, so it has no incoming gradient")
        for o in spec.outputs
        if not o.differentiable
    ]
    if len(differentiable) > 1:
        choices = " or ".join(f"grad_{n}" for n in differentiable)
        why.append(("grad", f"`grad` is only known when there is one differentiable output; use {choices}"))
    return tuple(why)


def input_shapes(spec: Spec, symbols: Symbols) -> dict[sympy.Symbol, tensor.Shape]:
    """Declared shapes: `Tensor[..., N]` -> ("...", "N"); a plain Tensor's is unknown; numbers are scalars."""
    shapes: dict[sympy.Symbol, tensor.Shape] = {}
    for inp in spec.inputs:
        if inp.is_tensor:
            shapes[symbols.inputs[inp.name]] = inp.type.dims
        else:
            shapes[symbols.inputs[inp.name]] = ()
    return shapes


def _read_definitions(
    spec: Spec, symbols: Symbols, order: list[str] | None = None, shapes: dict[sympy.Symbol, tensor.Shape] | None = None
) -> dict[str, Expr]:
    """Every `let` and output formula as SymPy, in terms of the symbols of the names it uses.

    Read once in spec order without shapes to find the order the formulas depend on each
    other, then again in that order with `shapes`, which gains the shape of each formula read.

    """
    scope = forward_scope(spec, symbols)
    if shapes is not None:
        scope = replace(scope, shapes=shapes)
    defined = {**symbols.lets, **symbols.outputs}
    problems = Problems()
    definitions: dict[str, Expr] = {}
    formulas = {let.name: let.formula for let in spec.lets} | {o.name: o.formula for o in spec.outputs}
    for name in order or list(formulas):
        formula = formulas[name]
        with problems.collect(), located(formula.loc, f"formula of '{name}'"):
            definitions[name] = read_formula(formula, scope, NUM)  # type: ignore[assignment]
            if shapes is not None:
                definitions[name] = tensor.fuse_softmax(definitions[name])
                shapes[defined[name]] = tensor.shape_of(definitions[name], shapes)
    if problems:
        raise _Many(problems)
    return definitions


class _Many(Exception):
    def __init__(self, problems: Problems) -> None:
        super().__init__("several problems")
        self.problems = problems


def _definition_order(spec: Spec, symbols: Symbols, definitions: dict[str, Expr]) -> list[str]:
    """Lets and outputs in an order where each comes after what it uses; cycles are errors."""
    defined = {**symbols.lets, **symbols.outputs}
    by_symbol = {s: n for n, s in defined.items()}
    locs: dict[str, Loc] = {let.name: let.formula.loc for let in spec.lets}
    locs |= {o.name: o.formula.loc for o in spec.outputs}
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "active":
            cycle = path[path.index(name) :] + [name]
            raise SpecError(locs[cycle[0]], f"'{cycle[0]}' depends on itself: {' -> '.join(cycle)}")
        state[name] = "active"
        uses = sorted((by_symbol[s] for s in definitions[name].free_symbols if s in by_symbol), key=list(defined).index)
        for used in uses:
            visit(used, [*path, name])
        state[name] = "done"
        order.append(name)

    for name in definitions:
        visit(name, [])
    return order


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


def _clean(expr: Expr, loc: Loc, what: str) -> Expr:
    expr = expr.replace(sympy.DiracDelta, lambda *args: S.Zero)
    if expr.has(sympy.Derivative) or expr.has(sympy.Subs):
        raise SpecError(loc, f"{what}: SymPy could not differentiate this formula; give the gradient in `gradients:`")
    if expr.has(sympy.zoo, sympy.nan):
        raise SpecError(loc, f"{what}: the derived formula is undefined (division by zero)")
    return expr


def _tensor_gradient(
    spec: Spec,
    symbols: Symbols,
    inlined: dict[sympy.Symbol, Expr],
    shapes: dict[sympy.Symbol, tensor.Shape],
    name: str,
) -> Gradient:
    """The gradient of input `name` by reverse mode over the tensor operations (`opgen.vjp`)."""
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
            total = tensor_gradient(pairs, x, shapes, lambda e: _clean(settle_indicators(e), loc, what))
            batch_inputs = sum(1 for i in spec.tensor_inputs if i.type.dims and tensor.BATCH in i.type.dims)
            fit = leaf_fit(total, x, shapes, batch_inputs)
        except tensor.ShapeError as error:
            raise SpecError(loc, f"{what}: {error}") from None
    outputs = [(symbols.outputs[o.name], inlined[symbols.outputs[o.name]]) for o in spec.outputs]
    total = substitute_outputs(total, outputs)
    contributions = (Contribution(None, total),) if total != 0 else ()
    return Gradient(name, contributions, False, fit)


def _variant(
    spec: Spec,
    symbols: Symbols,
    definitions: dict[str, Expr],
    order: list[str],
    overrides: dict[str, Expr],
    absent_names: tuple[str, ...],
    shapes: dict[sympy.Symbol, tensor.Shape],
) -> Variant:
    absent = {symbols.inputs[n] for n in absent_names}
    defined = {**symbols.lets, **symbols.outputs}
    forward: dict[str, Expr] = {}
    inlined: dict[sympy.Symbol, Expr] = {}
    for name in order:
        kept = drop_terms(definitions[name], frozenset(absent))
        symbol = defined[name]
        if kept is None:
            if name in symbols.outputs:
                output = spec.outputs[[o.name for o in spec.outputs].index(name)]
                raise SpecError(
                    output.formula.loc, f"output '{name}' has no terms left when {' and '.join(absent_names)} is None"
                )
            absent.add(symbol)
            continue
        forward[name] = kept
        inlined[symbol] = kept.xreplace(inlined)
    tensor_inputs = set(symbols.tensor_inputs)
    for output in spec.outputs:
        limits.check_inlined(inlined[symbols.outputs[output.name]], output.formula.loc, f"output '{output.name}'")
        if not (inlined[symbols.outputs[output.name]].free_symbols & tensor_inputs):
            raise SpecError(output.formula.loc, f"output '{output.name}' does not depend on any Tensor input")
    gradients = []
    uses_tensor_ops = any(tensor.has_tensor_ops(inlined[symbols.outputs[o.name]]) for o in spec.outputs)
    for inp in spec.tensor_inputs:
        if inp.name in absent_names:
            continue
        x = symbols.inputs[inp.name]
        if inp.name in overrides:
            override = overrides[inp.name]
            lets_inlined = {
                symbols.lets[n]: e
                for n, e in ((n, inlined.get(symbols.lets[n])) for n in symbols.lets)
                if e is not None
            }
            written_out = override.xreplace(lets_inlined)
            where = next(g.formula.loc for g in spec.gradients if g.input == inp.name)
            limits.check_inlined(written_out, where, f"the gradient of '{inp.name}'")
            kept = drop_terms(written_out, frozenset(absent))
            kept = S.Zero if kept is None else guard_branches(kept, symbols.tensors)
            contributions = (Contribution(None, kept),)
            gradients.append(Gradient(inp.name, contributions, True))
            continue
        if uses_tensor_ops:
            gradients.append(_tensor_gradient(spec, symbols, inlined, shapes, inp.name))
            continue
        parts = []
        for output in spec.outputs:
            if not output.differentiable:
                continue
            what = f"d {output.name} / d {inp.name}"
            with located(output.formula.loc, what):
                guarded = guard_branches(inlined[symbols.outputs[output.name]], symbols.tensors)
                factor = _clean(settle_indicators(sympy.diff(guarded, x)), output.formula.loc, what)
            if factor != 0:
                parts.append(Contribution(output.name, factor))
        gradients.append(Gradient(inp.name, tuple(parts), False))
    needed = _needed_lets(spec, symbols, forward)
    lets = tuple((n, forward[n]) for n in (let.name for let in spec.lets) if n in needed)
    outputs = tuple((o.name, forward[o.name]) for o in spec.outputs)
    inlined_outputs = tuple((o.name, inlined[symbols.outputs[o.name]]) for o in spec.outputs)
    return Variant(absent_names, lets, outputs, inlined_outputs, tuple(gradients))


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


Rewrite = Callable[[Expr, frozenset[sympy.Symbol]], Expr]


def _unchanged(expr: Expr, numbers: frozenset[sympy.Symbol]) -> Expr:
    return expr


def _plain_numbers(symbols: Symbols, read: dict[str, Expr]) -> frozenset[sympy.Symbol]:
    """The symbols that hold plain numbers (Note [numbers and tensors]): non-tensor inputs,
    named dimension sizes, and lets made only of them."""
    lets = [(symbols.lets[name], expr) for name, expr in read.items() if name in symbols.lets]  # dependency order
    tensors = with_definitions(symbols.tensors, lets)
    used = set().union(*(expr.free_symbols for expr in read.values()))
    return frozenset(s for s in used | set(symbols.inputs.values()) | set(symbols.lets.values()) if s not in tensors)


def derive(spec: Spec, problems: Problems, rewrite: Rewrite = _unchanged) -> Derived | None:
    """Derive every gradient of `spec`; record located errors in `problems`.

    `rewrite` is applied to each formula as read, with the symbols that hold plain numbers,
    before it is differentiated (the pipeline passes the stable rewrites and the lowering
    to native kernels, so gradients come from stable functions and native backward kernels).
    """
    symbols = make_symbols(spec)
    try:
        definitions = _read_definitions(spec, symbols)
    except _Many as many:
        problems.errors.extend(many.problems.errors)
        return None
    shapes = input_shapes(spec, symbols)
    try:
        order = _definition_order(spec, symbols, definitions)
        read = _read_definitions(spec, symbols, order, shapes)
        numbers = _plain_numbers(symbols, read)
        definitions = {name: rewrite(expr, numbers) for name, expr in read.items()}
    except _Many as many:
        problems.errors.extend(many.problems.errors)
        return None
    except SpecError as error:
        problems.add(error)
        return None
    for output in spec.outputs:
        if output.differentiable:
            shapes[symbols.grads[output.name]] = shapes[symbols.outputs[output.name]]
    overrides: dict[str, Expr] = {}
    scope = gradient_scope(spec, symbols)
    scope = replace(scope, shapes=shapes)
    before = len(problems.errors)
    for override in spec.gradients:
        with problems.collect(), located(override.formula.loc, f"gradient of '{override.input}'"):
            formula = read_formula(override.formula, scope, NUM)
            overrides[override.input] = rewrite(formula, numbers)  # type: ignore[arg-type]
    if len(problems.errors) > before:
        return None
    optional = [i.name for i in spec.tensor_inputs if i.type.optional]
    try:
        if len(optional) > MAX_OPTIONAL:
            loc = spec.input(optional[MAX_OPTIONAL]).loc  # type: ignore[union-attr]
            raise SpecError(loc, f"at most {MAX_OPTIONAL} `Tensor?` inputs are supported per op")
        variants = []
        # Every subset of optional inputs may be None; the all-present variant comes last.
        for flags in itertools.product([True, False], repeat=len(optional)):
            absent = tuple(n for n, is_absent in zip(optional, flags, strict=True) if is_absent)
            variants.append(_variant(spec, symbols, definitions, order, overrides, absent, shapes))
    except SpecError as error:
        problems.add(error)
        return None
    return Derived(spec, symbols, tuple(variants), shapes)
