"""Save-versus-recompute: which tensors backward reads, chosen by the spec's policy.

Receives `Derived` (after the rewrites and the lowering) and a policy; returns `Derived`
whose gradients read the op's outputs instead of recomputing them where the policy says
so. `plan` then saves exactly the inputs and outputs the gradients use.

Two ways to write each gradient are weighed: as derived (from the inputs), and with every
recomputation of an output replaced by the output itself -- the output's formula where it
appears whole (`sigmoid(x)` -> `y`), or a costly call the output holds linearly
(`y = x - tanh(x)` gives `tanh(x) -> x - y`). The second is never slower; it may save more.

Note [save policies]
~~~~~~~~~~~~~~~~~~~~
- `balanced` (the default): least memory among the ways whose estimated time is within
  10% of the fastest;
- `memory`: least memory, then least time;
- `speed`: least time, then least memory.
Memory counts the tensors saved for backward; time is a cost model of the forward and
backward formulas, each distinct subexpression counted once (as CSE will leave it), with
weights from measurements of 1M-element float32 kernels on one CPU thread (`COST`).

Note [hidden outputs]
~~~~~~~~~~~~~~~~~~~~~
A third way saves an intermediate that forward computes anyway (`tanh(x)` in `x - tanh(x)`)
as a residual (JAX `custom_vjp`'s `(out, residuals)`): the Function returns it after the
spec's outputs and the functional drops it; backward reads it from `ctx.saved_tensors` like
any output, and since it is an output of the Function, autograd differentiates through it
for double backward (its own gradient term `grad_saved * d tanh(x)/dx` is part of backward).
It is never stashed on `ctx`, and never added to the `Spec`: `choose_saved` returns the
residuals beside `Derived`, and `plan` carries them to the emitters. It is offered when it
frees backward from every input, for elementwise ops with one variant.
"""

from __future__ import annotations

import re
from dataclasses import replace

import sympy
from sympy import Expr

from opgen.derive.gradients import Contribution, Derived, Symbols, Variant
from opgen.formula import functions as fn
from opgen.formula.kinds import is_tensor_valued
from opgen.formula.syntax import is_elementwise
from opgen.formula.tensor import ReduceAmax, shape_of
from opgen.nodes.kernels import TENSOR_ARG, Prime, SavedMask
from opgen.optimize import cancellation, norms, save_tensors
from opgen.records import Residual
from opgen.spec.model import POLICIES

SLACK = 1.10  # `balanced`: at most this much slower than the fastest way

# Relative time of one elementwise kernel (an add or multiply is 1).
COST: dict[type, float] = {
    fn.sigmoid: 2,
    sympy.exp: 6,
    sympy.log: 6,
    fn.log1p: 6,
    fn.expm1: 6,
    sympy.sin: 6,
    sympy.cos: 6,
    sympy.tan: 6,
    sympy.atan: 6,
    sympy.erf: 10,
    sympy.erfc: 10,
    fn.softplus: 10,
    sympy.tanh: 20,
    sympy.sinh: 10,
    sympy.cosh: 10,
    cancellation.where: 8,  # the conjugate form: a root, a quotient and a select (Note [conjugate form])
    **save_tensors.COST,  # a pass over a tensor (Note [saved tensor operations] in opgen.optimize.save_tensors)
}
DEFAULT_COST = 1.0
CALL_COST = 3.0  # functions without an entry (where, native kernels, ...)


def cost(exprs: list[Expr]) -> float:
    """Estimated time of evaluating `exprs` once, sharing common subexpressions."""
    seen: set[sympy.Basic] = set()
    total = 0.0
    for expr in exprs:
        for node in sympy.preorder_traversal(expr):
            if node.is_Atom or node in seen or not isinstance(node, Expr):
                continue
            seen.add(node)
            if isinstance(node, sympy.Function):
                total += COST.get(type(node), CALL_COST)
            else:
                total += DEFAULT_COST * max(1, len(node.args) - 1)
    return total


def _saved(exprs: list[Expr], symbols: Symbols, residuals: tuple[Residual, ...] = ()) -> int:
    tensors = set(symbols.tensor_inputs) | set(symbols.outputs.values()) | {r.symbol for r in residuals}
    return len(set().union(*(e.free_symbols for e in exprs)) & tensors) if exprs else 0


def _costly_calls(factors: list[Expr], symbols: Symbols) -> set[Expr]:
    """The costly tensor-valued calls of `factors` (a call with no entry in COST costs CALL_COST: the
    remainder in a wrapped phase is worth keeping); a call of plain numbers is a `math` call on a
    number (Note [numbers and tensors]), never worth saving or taking from an output."""
    calls = {c for f in factors for c in f.atoms(sympy.Function) if COST.get(type(c), CALL_COST) > DEFAULT_COST}
    return {c for c in calls if is_tensor_valued(c, symbols.tensors)}


def _recomputations(variant: Variant, symbols: Symbols, factors: list[Expr]) -> dict[Expr, Expr]:
    """What in `factors` each differentiable output can stand in for (module docstring)."""
    swap: dict[Expr, Expr] = {}
    calls = _costly_calls(factors, symbols)
    compared = _compared(factors)
    for name, expr in variant.inlined:
        if name not in symbols.grads:
            continue  # a non-differentiable output is a constant to double backward: never a stand-in
        output = symbols.outputs[name]
        if not expr.is_Atom and not _tied(expr, compared):
            swap[expr] = output
        # Only calls on the output's spine of sums and products can be held linearly: one walk
        # finds them, so a deep chain of calls costs no rebuilding of the formula per call.
        for call in sorted(calls & _spine(expr), key=sympy.default_sort_key):
            parts = _linear(expr, call)
            if parts is None or parts[0] == 0 or _tied(call, compared):
                continue
            if call not in compared or parts == (1, 0):
                coeff, rest = parts
                swap.setdefault(call, (output - rest) / coeff)
    return swap


def _tied(expr: Expr, compared: set[Expr]) -> bool:
    """A maximum in a tie mask: it stays recomputed from the operand it is compared with (Note [ties
    with the maximum] in opgen.derive.vjp); forward may compute that operand otherwise, to the last bit."""
    return isinstance(expr, ReduceAmax) and expr in compared


def _compared(factors: list[Expr]) -> set[Expr]:
    """What the factors compare exactly (amax's tie mask `a == amax(a)`): a stand-in computed as
    `(output - rest) / coeff` differs from it by rounding, and then no entry ties, so such a call
    is replaced by an output only where the output is the call itself."""
    seen: set[sympy.Basic] = set()
    found: set[Expr] = set()
    stack: list[tuple[sympy.Basic, bool]] = [(f, False) for f in factors]
    while stack:  # each distinct node once: shared subexpressions are walked once, not once per use
        node, inside = stack.pop()
        if (node, inside) in seen:
            continue
        seen.add((node, inside))
        inside = inside or isinstance(node, sympy.core.relational.Relational)
        if inside:
            found.add(node)
        stack.extend((arg, inside) for arg in node.args)
    return found


def _spine(expr: Expr) -> set[Expr]:
    """The nodes reached from `expr` through sums and products only."""
    found = {expr}
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        for arg in expr.args:
            found |= _spine(arg)
    return found


def _linear(expr: Expr, call: Expr) -> tuple[Expr, Expr] | None:
    """`(c, rest)` when `expr` is `c * call + rest`, `c` a number and `rest` free of `call`; else None.

    Read off the sums and products that lead to `call`, not by differentiating: `call` inside
    any other node (`floor(call)`, whose derivative is 0 almost everywhere) is not linear.
    """
    if expr == call:
        return sympy.S.One, sympy.S.Zero
    if not expr.has(call):
        return sympy.S.Zero, expr
    if isinstance(expr, sympy.Add):
        parts = [_linear(term, call) for term in expr.args]
        if any(p is None for p in parts):
            return None
        return sympy.Add(*(p[0] for p in parts if p)), sympy.Add(*(p[1] for p in parts if p))
    if isinstance(expr, sympy.Mul):
        inner = [f for f in expr.args if f.has(call)]
        numbers = [f for f in expr.args if not f.has(call)]
        if len(inner) != 1 or not all(f.is_number for f in numbers):
            return None
        part = _linear(inner[0], call)
        scale = sympy.Mul(*numbers)
        return None if part is None else (scale * part[0], scale * part[1])
    return None


def _hidden_calls(derived: Derived, factors: list[Expr]) -> list[Expr]:
    """Costly calls that forward computes anyway and whose saving frees backward from the inputs.

    Only for elementwise specs with one variant and derived gradients, whose outputs all
    carry gradients, and not in fused mode (Note [hidden outputs]).
    """
    spec = derived.spec
    if len(derived.variants) != 1 or spec.gradients or not all(o.differentiable for o in spec.outputs):
        return []
    if spec.optimize.fuse:
        return []  # fused backward takes saved inputs and outputs, not a second incoming gradient
    if not is_elementwise(spec):
        return []
    calls = _costly_calls(factors, derived.symbols)
    # Forward computes the call once, as the residual, where an output's own formula has it
    # (the residual takes its place there), and never inside a `let`, which computes it already.
    calls = {c for c in calls if any(e.has(c) and e != c for _, e in derived.full.outputs)}
    lets: dict[sympy.Symbol, Expr] = {}
    for name, expr in derived.full.lets:
        lets[derived.symbols.lets[name]] = expr.xreplace(lets)
    calls = {c for c in calls if not any(e.has(c) for e in lets.values())}
    parts = {p.expr for p in derived.parts if not p.tensor_op}  # what derive differentiated
    calls &= parts
    return sorted(calls, key=sympy.default_sort_key)


def _hide(derived: Derived, calls: list[Expr]) -> tuple[Derived, tuple[Residual, ...]]:
    """`derived` whose gradients read each of `calls` as a residual, and the residuals."""
    spec, variant = derived.spec, derived.full
    taken = {i.name for i in spec.inputs} | {let.name for let in spec.lets} | {o.name for o in spec.outputs}
    residuals = []
    for call in calls:
        name = f"saved_{type(call).__name__}"
        while name in taken:
            name += "_"
        taken.add(name)
        residuals.append(Residual(name, call, sympy.Symbol(name, real=True), sympy.Symbol("grad:" + name, real=True)))
    swap: dict[Expr, Expr] = {r.expr: r.symbol for r in residuals}
    parts = {p.expr: p for p in derived.parts if not p.tensor_op}  # Note [parts of the outputs] in opgen.derive.parts
    gradients = []
    for gradient in variant.gradients:
        contributions = [replace(c, factor=c.factor.xreplace(swap)) for c in gradient.contributions]
        for residual in residuals:
            factor = parts[residual.expr].derivative(gradient.input).xreplace(swap)
            if factor != 0:
                contributions.append(Contribution(residual.name, factor))
        gradients.append(replace(gradient, contributions=tuple(contributions)))
    outputs = tuple((name, expr.xreplace(swap)) for name, expr in variant.outputs)
    variant = replace(variant, outputs=outputs, gradients=tuple(gradients))
    return replace(derived, variants=(variant,)), tuple(residuals)


def _best(ways: list[tuple[float, int, int]], policy: str) -> int:
    """The index of the way `policy` prefers among (time, tensors saved, index)."""
    if policy == "speed":
        return min(ways, key=lambda w: (w[0], w[1]))[2]
    if policy == "memory":
        return min(ways, key=lambda w: (w[1], w[0]))[2]
    fastest = min(w[0] for w in ways)
    return min((w for w in ways if w[0] <= SLACK * fastest), key=lambda w: (w[1], w[0]))[2]


def _choose(derived: Derived, variant: Variant, policy: str) -> Variant | tuple[Derived, tuple[Residual, ...]]:
    symbols = derived.symbols
    forward = cost([e for _, e in variant.inlined])
    factors = [c.factor for g in variant.gradients for c in g.contributions]
    swap = _recomputations(variant, symbols, factors)
    replaced = [f.xreplace(swap) for f in factors]
    ways = [(forward + cost(factors), _saved(factors, symbols), 0)]
    if replaced != factors:
        ways.append((forward + cost(replaced), _saved(replaced, symbols), 1))
    calls = _hidden_calls(derived, factors)
    hidden = _hide(derived, calls) if calls else None
    if hidden is not None:
        hidden_factors = [c.factor for g in hidden[0].full.gradients for c in g.contributions]
        if not any(f.free_symbols & set(symbols.tensor_inputs) for f in hidden_factors):
            ways.append((forward + cost(hidden_factors), _saved(hidden_factors, symbols, hidden[1]), 2))
    best = _best(ways, policy)
    if best == 2:
        assert hidden is not None
        return hidden
    if best == 0:
        return variant
    gradients = tuple(
        replace(g, contributions=tuple(replace(c, factor=c.factor.xreplace(swap)) for c in g.contributions))
        for g in variant.gradients
    )
    return replace(variant, gradients=gradients)


def choose_saved(derived: Derived, policy: str) -> tuple[Derived, tuple[Residual, ...]]:
    """`derived` with each variant's gradients written as `policy` prefers (Note [save policies]),
    and the residuals those gradients read (Note [hidden outputs])."""
    assert policy in POLICIES, policy
    variants = []
    for variant in derived.variants:
        chosen = _choose(derived, variant, policy)
        if isinstance(chosen, tuple):
            return chosen  # residuals: a one-variant op
        variants.append(chosen)
    derived = replace(derived, variants=tuple(variants))
    masked = _save_masks(derived, policy)
    if masked is not None:
        return masked
    statistics = _save_statistics(derived, policy)  # a norm's own statistics first (opgen.optimize.norms)
    if not statistics[1] and save_tensors.offered(derived):
        return _hide_tensor_ops(derived, policy) or statistics
    return statistics


def _hide_tensor_ops(derived: Derived, policy: str) -> tuple[Derived, tuple[Residual, ...]] | None:
    """`derived` whose gradients read the tensor operations forward computes anyway from residuals,
    where that is faster and costs no more bytes (Note [saved tensor operations] in opgen.optimize.save_tensors)."""
    symbols, variant = derived.symbols, derived.full
    factors = [c.factor for g in variant.gradients for c in g.contributions]
    inputs = set(symbols.tensor_inputs)
    taken = {i.name for i in derived.spec.inputs} | {let.name for let in derived.spec.lets}
    taken |= {o.name for o in derived.spec.outputs}
    chosen: list[Residual] = []
    for node in save_tensors.candidates(derived, factors):
        freed = node.free_symbols & inputs
        tiny = save_tensors.reduced(node, derived.shapes) and policy != "memory"
        stem = re.sub(r"(?<!^)(?=[A-Z])", "_", type(node).__name__.removeprefix("Reduce")).lower()  # log_softmax
        name = _untaken(f"saved_{stem}", taken)
        residual = Residual(name, node, sympy.Symbol(name, real=True), sympy.Symbol("grad:" + name, real=True))
        swapped = [f.xreplace({r.expr: r.symbol for r in [*chosen, residual]}) for f in factors]
        if tiny or not set().union(*(f.free_symbols for f in swapped)) & freed:
            chosen.append(residual)
    swap: dict[Expr, Expr] = {r.expr: r.symbol for r in chosen}
    swapped = [f.xreplace(swap) for f in factors]
    if not chosen or cost(swapped) >= cost(factors):
        return None
    terms = save_tensors.vjp_terms(derived, [(r.expr, r.symbol, r.grad) for r in chosen], swap)
    if terms is None:
        return None
    gradients = tuple(
        replace(
            g,
            contributions=(
                *(replace(c, factor=c.factor.xreplace(swap)) for c in g.contributions),
                *((Contribution(None, terms[g.input]),) if g.input in terms else ()),
            ),
        )
        for g in variant.gradients
    )
    outputs = tuple((name, expr.xreplace(swap)) for name, expr in variant.outputs)
    shapes = dict(derived.shapes)
    for r in chosen:
        shapes[r.symbol] = shapes[r.grad] = shape_of(r.expr, derived.shapes)
    variant = replace(variant, outputs=outputs, gradients=gradients)
    return replace(derived, variants=(variant,), shapes=shapes), tuple(chosen)


def _save_masks(derived: Derived, policy: str) -> tuple[Derived, tuple[Residual, ...]] | None:
    """`derived` whose gradients read the condition of each piecewise-linear primitive from a bool
    residual instead of its tensor argument (Note [saved masks] in opgen.nodes.kernels), where that
    frees backward from every input and output: a byte an element saved instead of four (as plain
    autograd of `where(x > 0, x, s * x)` keeps its mask), for one compare in forward. Not under
    `speed`, in fused mode (whose backward reads inputs and outputs) or with gradient overrides."""
    spec, variant = derived.spec, derived.full
    if policy == "speed" or spec.optimize.fuse or spec.gradients or len(derived.variants) != 1:
        return None
    if not is_elementwise(spec):
        return None
    factors = [c.factor for g in variant.gradients for c in g.contributions]
    primes = sorted({p for f in factors for p in f.atoms(Prime)}, key=sympy.default_sort_key)
    conditions = [p.primitive(*p.args[1:]).mask() for p in primes]
    if not primes or any(c is None for c in conditions):
        return None
    taken = {i.name for i in spec.inputs} | {let.name for let in spec.lets} | {o.name for o in spec.outputs}
    residuals, swap = [], {}
    for prime, condition in zip(primes, conditions, strict=True):
        name = _untaken("saved_mask", taken)
        symbol = SavedMask(name, real=True)
        grad = sympy.Symbol("grad:" + name, real=True)
        residuals.append(Residual(name, condition, symbol, grad, differentiable=False))
        swap[prime] = Prime(prime.args[0], symbol, *prime.args[2:])
        if TENSOR_ARG in Prime(prime.args[0], condition, *prime.args[2:]).elementary().free_symbols:
            return None  # the derivative reads more than the condition: the primitive's `mask` is wrong
    read = set(derived.symbols.tensor_inputs) | set(derived.symbols.outputs.values())
    if any(f.xreplace(swap).free_symbols & read for f in factors):
        return None  # backward reads an input or output anyway: the mask would be saved beside it
    gradients = tuple(
        replace(g, contributions=tuple(replace(c, factor=c.factor.xreplace(swap)) for c in g.contributions))
        for g in variant.gradients
    )
    return replace(derived, variants=(replace(variant, gradients=gradients),)), tuple(residuals)


def _save_statistics(derived: Derived, policy: str) -> tuple[Derived, tuple[Residual, ...]]:
    """Note [saved statistics]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~
    A reduced statistic (a layer norm's mean and 1/std, `[..., 1]`) costs a pass over its input
    to recompute, and next to nothing to keep: except under `memory`, and in fused mode (whose
    backward reads inputs and outputs only), backward reads it as a hidden output that forward
    computes in the same call as the op's output (Note [layer norm statistics] in opgen.nodes.layer_norm).
    """
    if policy == "memory" or derived.spec.optimize.fuse:
        return derived, ()
    items = norms.saved_statistics(derived.variants)
    taken = {i.name for i in derived.spec.inputs} | {let.name for let in derived.spec.lets}
    taken |= {o.name for o in derived.spec.outputs}
    residuals = []
    for item in items:
        name = _untaken(norms.residual_name(item), taken)
        symbol, grad = sympy.Symbol(name, real=True), sympy.Symbol("grad:" + name, real=True)
        residuals.append(Residual(name, item, symbol, grad, differentiable=False))
    swap: dict[Expr, Expr] = {r.expr: r.symbol for r in residuals}
    rstds = norms.saved_rstds(derived.variants, frozenset(derived.symbols.tensors))
    for rstd in rstds:  # Note [saved rstd] in opgen.optimize.norms
        name = _untaken("saved_rstd", taken)
        symbol, grad = sympy.Symbol(name, positive=True), sympy.Symbol("grad:" + name, real=True)
        residuals.append(Residual(name, rstd, symbol, grad, differentiable=False, recompute=True))

    def read(expr: Expr) -> Expr:
        expr = expr.xreplace(swap)
        for residual in residuals[len(items) :]:
            expr = norms.read_rstd(expr, residual.expr, residual.symbol)
        return expr

    variants = tuple(
        replace(
            v,
            outputs=tuple((n, read(e)) for n, e in v.outputs) if rstds else v.outputs,
            gradients=tuple(
                replace(g, contributions=tuple(replace(c, factor=read(c.factor)) for c in g.contributions))
                for g in v.gradients
            ),
        )
        for v in derived.variants
    )
    return replace(derived, variants=variants), tuple(residuals)


def _untaken(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name
