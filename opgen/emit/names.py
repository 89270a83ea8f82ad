"""The names of one op module, and the printer that prints the op's symbols by them.

`make_names` picks every internal name of `ops/<name>.py` (the `ctx`, the gradient variables,
the temporaries, the `ctx` attributes...) so that none equals a name of the spec;
`make_printer` builds the `TorchPrinter` whose symbol table maps the derivation's symbols to
those names. Used by the forward, backward and docstring emitters of `opgen.emit.op`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass

import sympy
from sympy import S

from opgen.emit.annotations import TypeNames, type_names
from opgen.emit.printer import TorchPrinter
from opgen.emit.runtime_names import RuntimeNames
from opgen.formula.dims import size_stem
from opgen.formula.kinds import Mask, with_definitions
from opgen.formula.tensor import BATCH, ShapeError, dim_size, is_dim_size, shape_of
from opgen.plan.backward import BackwardPlan, Plan, Temp
from opgen.plan.forward import filled_shapes
from opgen.records import Derived
from opgen.spec.model import Spec
from opgen.spec.names import Namer, ctx_namer


@dataclass(frozen=True, kw_only=True)
class OpNames:
    """Internal names of one op module, none equal to a spec name (built by keyword: 19 names)."""

    torch: str
    math: str
    function_ref: str  # how the functional refers to the Function class
    functional_ref: str  # how the Module refers to the functional
    ctx: str
    inputs: str
    output: str
    self: str
    grads_in: dict[str, str]  # output -> backward parameter
    grads_out: dict[str, str]  # input -> gradient variable
    ctx_attrs: dict[str, str]  # non-tensor input -> ctx attribute
    shape_attrs: dict[str, str]  # input -> ctx attribute holding its shape
    temps: dict[sympy.Symbol, str]
    size_attrs: dict[str, str]  # named dimension -> ctx attribute holding its size
    size_locals: dict[str, str]  # named dimension -> forward's local variable holding its size
    check_shapes: str  # the module-level helper that checks argument shapes at call time
    proxy: str  # the functional's FX Proxy standing for its call, while torch.fx traces
    runtime: RuntimeNames  # what the module imports from the package's `_runtime.py`
    types: TypeNames  # how annotations write torch.Tensor, Any and the builtins (Note [typed generated code])


def spec_names(spec: Spec) -> set[str]:
    names = {i.name for i in spec.inputs} | {let.name for let in spec.lets} | {o.name for o in spec.outputs}
    if spec.module:
        names |= {a.name for a in spec.module.args}
    return names


def public_names(spec: Spec) -> list[str]:
    return list(spec.public_names)


def make_names(plan: Plan) -> OpNames:
    spec = plan.derived.spec
    user = spec_names(spec)
    namer = Namer(user | set(public_names(spec)))
    torch, math = namer.fresh("torch"), namer.fresh("math")
    function_ref = (
        spec.function_class_name
        if spec.function_class_name not in user
        else namer.fresh("_" + spec.function_class_name)
    )
    functional_ref = spec.name if spec.name not in user else namer.fresh("_" + spec.name)
    ctx, inputs, output, self_ = (namer.fresh(n) for n in ("ctx", "inputs", "output", "self"))
    grads_in = {name: namer.fresh(f"grad_{name}") for name in plan.returned}
    grads_out = {i.name: namer.fresh(f"grad_{i.name}") for i in spec.tensor_inputs}
    temps = temp_names(plan, [variant_temps(bp) for bp in plan.backward], "tmp", namer)
    attrs = ctx_namer()
    ctx_attrs = {n: attrs.fresh(n) for n in plan.ctx_values}
    shape_attrs = {n: attrs.fresh(f"{n}_shape") for n in (*plan.shapes, *plan.gated_residuals, *filled_shapes(plan))}
    size_attrs = {n: attrs.fresh(size_stem(n)) for n in plan.dim_sizes}
    size_locals = {
        d: namer.fresh(size_stem(d)) for d in forward_dims(plan.derived, tuple(r.expr for r in plan.residuals))
    }
    check_shapes = namer.fresh("check_shapes")
    proxy = namer.fresh("proxy")
    types = type_names(torch, namer, set(public_names(spec)) | {function_ref, functional_ref})
    runtime = RuntimeNames(namer)
    return OpNames(
        torch=torch,
        math=math,
        function_ref=function_ref,
        functional_ref=functional_ref,
        ctx=ctx,
        inputs=inputs,
        output=output,
        self=self_,
        grads_in=grads_in,
        grads_out=grads_out,
        ctx_attrs=ctx_attrs,
        shape_attrs=shape_attrs,
        temps=temps,
        size_attrs=size_attrs,
        size_locals=size_locals,
        check_shapes=check_shapes,
        proxy=proxy,
        runtime=runtime,
        types=types,
    )


def let_values(plan: Plan) -> dict[sympy.Basic, str]:
    """Each `let:` of the spec by its value in terms of the inputs: a temporary of backward or jvp
    holding exactly that value takes the let's name (the spec's `diff`, not `tmp0`)."""
    derived = plan.derived
    named: dict[sympy.Basic, str] = {}
    for variant in derived.variants:
        values: dict[sympy.Basic, sympy.Basic] = {}
        for name, expr in variant.lets:
            value = expr.xreplace(values)
            values[derived.symbols.lets[name]] = value
            named.setdefault(value, name)
    return named


# A temporary that is one of these functions of one argument is named after it (`sig = torch.sigmoid(...)`).
FUNCTION_TEMPS = {
    "sigmoid": "sig",
    "tanh": "tanh",
    "exp": "exp",
    "log": "log",
    "softplus": "softplus",
    "logsigmoid": "logsig",
    "erf": "erf",
    "sin": "sin",
    "cos": "cos",
    "expm1": "expm1",
    "log1p": "log1p",
}


def _function_temp(expr: sympy.Basic) -> str | None:
    """What a temporary holding `expr` is called where the printer can tell what it is."""
    if isinstance(expr, sympy.Pow) and expr.exp in (S.Half, -S.Half):
        return "sqrt" if expr.exp == S.Half else "rsqrt"
    if isinstance(expr, sympy.Function) and len(expr.args) == 1:
        return FUNCTION_TEMPS.get(type(expr).__name__)
    return None


def temp_names(plan: Plan, variants: Iterable[Iterable[Temp]], prefix: str, namer: Namer) -> dict[sympy.Symbol, str]:
    """A name for each temporary of the variants' (each variant's temporaries in order, numbered alike
    across variants): the name of the let whose value it holds in every variant (let names are not
    variables of backward or jvp, so the one the spec gave is free), else what it is where that is one
    function (`sig`) held by no other temporary, else `prefix` and its number."""
    lets = let_values(plan)
    values: dict[sympy.Symbol, set[sympy.Basic]] = {}
    kinds: dict[sympy.Symbol, set[str | None]] = {}
    for temps in variants:
        inlined: dict[sympy.Basic, sympy.Basic] = {}
        for temp in temps:
            inlined[temp.symbol] = temp.expr.xreplace(inlined)
            values.setdefault(temp.symbol, set()).add(inlined[temp.symbol])
            kinds.setdefault(temp.symbol, set()).add(_function_temp(temp.expr))
    described = [next(iter(k)) for k in kinds.values() if len(k) == 1]
    unique = {d for d in described if d is not None and described.count(d) == 1 and d not in namer.taken}
    names: dict[sympy.Symbol, str] = {}
    for symbol in sorted(values, key=sympy.default_sort_key):
        held = values[symbol]
        let = lets.get(next(iter(held))) if len(held) == 1 else None
        kind = next(iter(kinds[symbol])) if len(kinds[symbol]) == 1 else None
        if let is not None and let not in names.values():
            namer.taken.discard(let)
            names[symbol] = namer.fresh(let)
        elif kind in unique:
            names[symbol] = namer.fresh(kind)
        else:
            names[symbol] = namer.fresh(f"{prefix}{symbol.name.split(':')[1]}")
    return names


def forward_dims(derived: Derived, residuals: tuple[sympy.Basic, ...] = ()) -> list[str]:
    """Named dimensions whose size a forward formula (or a residual forward computes) uses as a number."""
    formulas = [e for v in derived.variants for _, e in (*v.lets, *v.outputs)] + list(residuals)
    used = {s for e in formulas for s in e.free_symbols if is_dim_size(s)}
    names = {s.name.split(":", 1)[1] for s in used}
    for variant in derived.variants:  # the sizes of the shapes outputs are expanded to
        names |= {str(d) for _, pieces in variant.expand for p in pieces if p.tensor is None for d in p.dims or ()}
    return sorted(names - {"1", BATCH})


def make_printer(
    plan: Plan, names: OpNames, extra: dict[sympy.Symbol, str] | None = None, temps: tuple[Temp, ...] = ()
) -> TorchPrinter:
    """A printer for the op's formulas; `temps` are the temporaries of one backward variant, in order."""
    derived = plan.derived
    symbols = derived.symbols
    table: dict[sympy.Symbol, str] = {}
    for group in (symbols.inputs, symbols.lets, symbols.outputs):
        table |= {s: n for n, s in group.items()}
    table |= {r.symbol: r.name for r in plan.residuals}
    table |= {grad: names.grads_in[name] for name, grad in plan.incoming.items()}
    table |= names.temps
    table |= {dim_size(n): f"{names.ctx}.{attr}" for n, attr in names.size_attrs.items()}
    table |= extra or {}
    # A bool input is a number in formulas; torch refuses `tensor - True`, so it prints as an int
    # (without the builtin `int` where a name of the spec hides it in the function's body).
    hidden = "int" in spec_names(derived.spec)
    for i in derived.spec.inputs:
        if i.type.kind == "bool":
            flag = table[symbols.inputs[i.name]]
            as_int = f"(1 if {flag} else 0)" if hidden else f"{names.types.builtin['int']}({flag})"
            table[symbols.inputs[i.name]] = as_int
    # A `let` or temporary holds a tensor when its formula uses one (in any variant), else a
    # plain number (Note [numbers and tensors]); conditions are never kept in them (plan).
    lets = [(symbols.lets[name], expr) for variant in derived.variants for name, expr in variant.lets]
    residuals = frozenset(s for r in plan.residuals for s in (r.symbol, r.grad))
    tensors = with_definitions(symbols.tensors | residuals, [*lets, *((t.symbol, t.expr) for t in temps)])
    printer = TorchPrinter(
        table,
        tensors,
        torch=names.torch,
        math=names.math,
        functional=f"{names.torch}.nn.functional",
        runtime=names.runtime,
    )
    printer.tensor_shapes = dict(derived.shapes)
    return printer


def with_temp_shapes(printer: TorchPrinter, plan: Plan) -> TorchPrinter:
    """Let the printer know the shape of every temporary (`.T` or `.mT`)."""
    for bp in plan.backward:
        for group in bp.groups:
            for temp in group.temps:
                if isinstance(temp.symbol, Mask):
                    printer.masks[temp.symbol] = temp.expr
                try:
                    printer.tensor_shapes[temp.symbol] = shape_of(temp.expr, printer.tensor_shapes)
                except ShapeError:
                    printer.tensor_shapes[temp.symbol] = None
    return printer


def variant_temps(bp: BackwardPlan) -> tuple[Temp, ...]:
    return tuple(t for group in bp.groups for t in group.temps)


def variant_printer(printer: TorchPrinter, bp: BackwardPlan, names: OpNames) -> TorchPrinter:
    """`printer` knowing which of this variant's temporaries hold tensors (variants number theirs alike)."""
    variant = copy.copy(printer)
    temps = [(t.symbol, t.expr) for t in variant_temps(bp)]
    variant.tensors = with_definitions(printer.tensors - frozenset(names.temps), temps)
    variant.masks = printer.masks | {symbol: expr for symbol, expr in temps if isinstance(symbol, Mask)}
    shapes = dict(printer.tensor_shapes)
    for symbol, expr in temps:  # a temporary's shape, where its formula tells it (Note [negating the smallest factor])
        try:
            shape = shape_of(expr, shapes)
        except ShapeError:
            continue
        if shape is not None:
            shapes[symbol] = shape
    variant.tensor_shapes = shapes
    return variant
