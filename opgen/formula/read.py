"""Read stage: `Spec` -> its formulas as SymPy (`Formulas`), in the order they depend on each other.

Receives a `Spec`; returns `Formulas`: the SymPy symbol of every name, each `let` and output
formula read by `opgen.formula.reader` (in an order where each comes after what it uses), each
gradient override, the static shape of every input, let and output, and which symbols hold
plain numbers. The formulas are as the spec wrote them: `opgen.optimize.passes` may rewrite them,
and `opgen.derive.gradients` differentiates them; the pipeline runs both (the as-written derivation
is the accuracy oracle of the generated tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import sympy
from sympy import Expr

from opgen.errors import Loc, Problems, SpecError, located
from opgen.formula import functions as fn
from opgen.formula import shape_rules, tensor, written
from opgen.formula.dims import part_of
from opgen.formula.kinds import with_definitions
from opgen.formula.reader import Scope, read_formula
from opgen.formula.softmax_forms import fuse_softmax
from opgen.formula.syntax import holds_tensors, parse_ast
from opgen.formula.vocabulary import NUM, Value
from opgen.spec.model import Spec


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
class Formulas:
    """A spec's formulas as SymPy expressions, before they are differentiated."""

    spec: Spec
    symbols: Symbols
    definitions: dict[str, Expr]  # every let and output, each after the names it uses
    overrides: dict[str, Expr]  # input -> its gradient as `gradients:` gives it
    numbers: frozenset[sympy.Symbol]  # the symbols that hold plain numbers (Note [numbers and tensors])
    shapes: dict[sympy.Symbol, tensor.Shape]  # static shape of every input, let, output and incoming gradient

    def transformed(self, change: Callable[[Expr, frozenset[sympy.Symbol]], Expr]) -> Formulas:
        """These formulas with `change(expr, numbers)` applied to every definition and override."""
        definitions = {name: change(expr, self.numbers) for name, expr in self.definitions.items()}
        overrides = {name: change(expr, self.numbers) for name, expr in self.overrides.items()}
        return replace(self, definitions=definitions, overrides=overrides)


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
    flags = frozenset(i.name for i in spec.inputs if i.type.kind == "bool")
    inputs = tuple(symbols.inputs[i.name] for i in spec.tensor_inputs)
    return Scope(names, tensors, hint, conditions=flags, inputs=inputs)


def dimension_names(spec: Spec) -> list[str]:
    """The named dimensions of the Tensor inputs, in order of first appearance."""
    dims: list[str] = []
    for inp in spec.tensor_inputs:
        for d in inp.type.dims or ():  # `2*H` brings `H` (Note [multiples of a dimension])
            d = part_of(d)[0] if not d.isdigit() else d
            if d != tensor.BATCH and d not in dims:
                dims.append(d)
    return dims


def gradient_scope(spec: Spec, symbols: Symbols) -> Scope:
    scope = forward_scope(spec, symbols)
    names = dict(scope.names)
    # An input, let or output keeps its name: with an input `grad`, the incoming gradient is `grad_y`.
    for name, grad in symbols.grads.items():
        names.setdefault("grad_" + name, Value(grad, NUM))
    if len(symbols.grads) == 1:
        names.setdefault("grad", Value(next(iter(symbols.grads.values())), NUM))
    known = ", ".join(sorted(n for n in names if n.startswith("grad")))
    tensors = scope.tensors | frozenset(symbols.grads.values())
    return Scope(names, tensors, f"; incoming gradients here are: {known}", _unavailable(spec), inputs=scope.inputs)


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
    defined = {**symbols.lets, **symbols.outputs}
    walk = walk_as_written(spec, symbols, shapes or {}, frozenset())
    if shapes is not None:
        scope = replace(scope, shapes=shapes, written=lambda node: walk.pieces(node) or frozenset())
    else:  # a first reading, in spec order: any let or output may turn out to be a condition
        scope = replace(scope, conditions=scope.conditions | frozenset(defined))
    problems = Problems()
    definitions: dict[str, Expr] = {}
    formulas = {let.name: let.formula for let in spec.lets} | {o.name: o.formula for o in spec.outputs}
    for name in order or list(formulas):
        formula = formulas[name]
        with problems.collect(), located(formula.loc, f"formula of '{name}'"):
            definitions[name] = read_formula(formula, scope, NUM)
            values = {**(scope.values or {}), defined[name]: definitions[name].xreplace(scope.values or {})}
            scope = replace(scope, values=values)
            if shapes is not None:
                definitions[name] = fuse_softmax(definitions[name])
                # The shape as written (Note [shapes as written]), which a simplified formula may lack.
                pieces = walk.defined[defined[name]] = walk.pieces(parse_ast(formula))
                as_written = written.broadcast_all(pieces or frozenset())
                shapes[defined[name]] = shape_rules.broadcast(tensor.shape_of(definitions[name], shapes), as_written)
                if name in definitions and _is_condition(definitions[name], scope):
                    scope = replace(scope, conditions=scope.conditions | {name})
    if problems:
        raise _Many(problems)
    return definitions


# Note [named conditions]
# ~~~~~~~~~~~~~~~~~~~~~~~
# A condition used as a number is 1 where it holds and 0 elsewhere, so a let or an output
# whose formula is a condition (`small: abs(x - t) < delta`) holds 1/0, and so does a `bool`
# input. Such a name may stand where a condition is wanted (`where(small, a, b)`, `~flag`,
# `small & (x > 0)`) and reads as `name == 1`, what `where(small == true, a, b)` reads as. A
# name holding any other number (a Tensor input, `x * 2`) stays an error there: which of its
# values would count as true is not for opgen to guess. The first reading, in spec order,
# lets every let and output pass (it only orders the formulas); the second, in the order they
# depend on each other, knows which ones are conditions.


def _is_condition(expr: Expr, scope: Scope) -> bool:
    """Whether a let or output read as `expr` holds a condition as 1/0 (Note [named conditions])."""
    if isinstance(expr, fn.where) and expr.args[1:] == (sympy.S.One, sympy.S.Zero):
        return True
    return any(expr == scope.names[name].expr for name in scope.conditions if name in scope.names)


def condition_names(spec: Spec, symbols: Symbols, definitions: dict[str, Expr]) -> frozenset[str]:
    """The names that hold a condition as 1/0, for `gradients:` formulas (Note [named conditions])."""
    scope = forward_scope(spec, symbols)
    for name, expr in definitions.items():  # in the order they depend on each other
        if _is_condition(expr, scope):
            scope = replace(scope, conditions=scope.conditions | {name})
    return scope.conditions


def walk_as_written(
    spec: Spec, symbols: Symbols, shapes: dict[sympy.Symbol, tensor.Shape], absent: frozenset[sympy.Symbol]
) -> written.Walk:
    """A reader of the shapes the formulas broadcast to as written (Note [shapes as written])."""
    names = {n: v.expr for n, v in forward_scope(spec, symbols).names.items()}
    return written.Walk(names, frozenset(symbols.tensor_inputs), shapes, absent)


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


def _plain_numbers(symbols: Symbols, read: dict[str, Expr]) -> frozenset[sympy.Symbol]:
    """The symbols that hold plain numbers (Note [numbers and tensors]): non-tensor inputs,
    named dimension sizes, and lets made only of them."""
    lets = [(symbols.lets[name], expr) for name, expr in read.items() if name in symbols.lets]  # dependency order
    tensors = with_definitions(symbols.tensors, lets)
    used = set().union(*(expr.free_symbols for expr in read.values()))
    return frozenset(s for s in used | set(symbols.inputs.values()) | set(symbols.lets.values()) if s not in tensors)


def read(spec: Spec, problems: Problems) -> Formulas | None:
    """Read every formula of `spec`; record located errors in `problems` and return None on any."""
    symbols = make_symbols(spec)
    try:
        definitions = _read_definitions(spec, symbols)
        shapes = input_shapes(spec, symbols)
        order = _definition_order(spec, symbols, definitions)
        definitions = _read_definitions(spec, symbols, order, shapes)
    except _Many as many:
        problems.errors.extend(many.problems.errors)
        return None
    except SpecError as error:
        problems.add(error)
        return None
    for output in spec.outputs:
        if output.differentiable:
            shapes[symbols.grads[output.name]] = shapes[symbols.outputs[output.name]]
    scope = replace(gradient_scope(spec, symbols), shapes=shapes)
    scope = replace(scope, conditions=condition_names(spec, symbols, definitions))
    overrides: dict[str, Expr] = {}
    before = len(problems.errors)
    for override in spec.gradients:
        with problems.collect(), located(override.formula.loc, f"gradient of '{override.input}'"):
            overrides[override.input] = read_formula(override.formula, scope, NUM)
    if len(problems.errors) > before:
        return None
    return Formulas(spec, symbols, definitions, overrides, _plain_numbers(symbols, definitions), shapes)
