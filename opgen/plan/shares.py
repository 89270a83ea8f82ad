"""Gradients of several inputs that share work: a common product with the incoming gradient computed
once, and a gradient that is the negation of another written as such (used by `opgen.plan.backward`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import sympy
from sympy import Expr

from opgen.derive.gradients import Derived, Variant
from opgen.formula import functions as fn
from opgen.formula.tensor import SumTo
from opgen.optimize.save import Residual
from opgen.plan.conditions import Temp


def may_share_negations(derived: Derived, variant: Variant, residuals: tuple[Residual, ...]) -> bool:
    """One differentiable output, no override: each gradient is its one incoming gradient times its factor."""
    differentiable = [o for o in derived.spec.outputs if o.differentiable] + [r for r in residuals if r.differentiable]
    return len(differentiable) == 1 and not any(g.overridden for g in variant.gradients)


def _core(expr: Expr) -> tuple[Expr, Callable[[Expr], Expr]]:
    """`expr` without the fitting to its input's shape around it (`SumTo`), and how to put it back."""
    if isinstance(expr, SumTo):
        return expr.args[0], lambda inner: SumTo(inner, *expr.args[1:])
    return expr, lambda inner: inner


def shared_negations(
    factors: list[Expr], outputs: list[str | None], grads: dict[str, sympy.Symbol]
) -> tuple[list[Expr], list[str | None], list[tuple[sympy.Symbol, Expr]]]:
    """Note [gradients that negate another]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    A loss of `input - target` has `grad_target = -grad_input` before each is fitted to its
    input's shape; CSE leaves the product `g * f` in both (it does not see `g * f` inside
    `-g * f`), so backward multiplied twice and negated. The product becomes one temporary,
    incoming gradient included, shared by both (`tmp = grad_loss * f`, `grad_target = -tmp`),
    as PyTorch's own losses give the target's gradient; where `f` is a kernel's derivative
    (huber's), the temporary is that backward kernel's call (`kernel_factors` keeps it for the
    pair). Returns the factors and outputs with each pair's product a new symbol, and the symbols
    with their products, which go through CSE with the factors (`named_shares`)."""
    factors, outputs = list(factors), list(outputs)
    shared: list[tuple[sympy.Symbol, Expr]] = []
    for i, j in itertools.combinations(range(len(factors)), 2):
        (a, wrap_a), (b, wrap_b) = _core(factors[i]), _core(factors[j])
        output = outputs[i]
        if output != outputs[j] or (output is not None and output not in grads) or a.is_number or not _negated(a, b):
            continue
        if output is None and (a.is_Atom or any(a == e for _, e in shared)):
            continue  # nothing to share
        symbol = sympy.Dummy(f"share{len(shared)}", real=True)
        shared.append((symbol, a if output is None else grads[output] * a))
        factors[i], factors[j] = wrap_a(symbol), wrap_b(-symbol)
        outputs[i] = outputs[j] = None
    return factors, outputs, shared


def shared_products(
    factors: list[Expr], outputs: list[str | None], owners: list[str], grads: dict[str, sympy.Symbol]
) -> tuple[list[Expr], list[str | None], list[tuple[sympy.Symbol, Expr]]]:
    """Note [gradients that share a product]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    Gradients of several inputs through one output are each the incoming gradient times a factor,
    and the factors often share a product (`-(alpha*a*b*exp(a))`: `-alpha*exp(a)*b*(a + 1)` and
    `-alpha*exp(a)*a`). CSE shares `alpha*exp(a)` but not its product with the incoming gradient,
    which is multiplied in as each gradient prints: one multiplication per gradient, and the
    negation twice. The common factors of the gradients' products (each as often as every one has
    it), with the incoming gradient, become one temporary read by each (`tmp = grad * (-alpha*exp(a))`,
    `grad_a = b*(a + 1)*tmp`, `grad_b = a*tmp`). Only where the common part holds a call or a power
    (a lone symbol or number shares no work) and for elementwise specs."""
    factors, outputs = list(factors), list(outputs)
    shared: list[tuple[sympy.Symbol, Expr]] = []
    by_output: dict[str, list[int]] = {}
    for k, output in enumerate(outputs):
        if output is not None and output in grads:
            by_output.setdefault(output, []).append(k)
    for output, indices in by_output.items():
        if len({owners[k] for k in indices}) != len(indices) or len(indices) < 2:
            continue  # each gradient one term
        cores = [_core(factors[k]) for k in indices]
        found = _common_factors([core for core, _ in cores])
        if found is None:
            continue
        common, rests = found
        symbol = sympy.Dummy(f"product{len(shared)}", real=True)
        shared.append((symbol, grads[output] * common))
        for k, (_, wrap), rest in zip(indices, cores, rests, strict=True):
            factors[k], outputs[k] = wrap(rest * symbol), None
    return factors, outputs, shared


def _common_factors(products: list[Expr]) -> tuple[Expr, list[Expr]] | None:
    """The factors every product has, each as often as every one has it, and what is left of each
    product; None where they share no call or power."""
    pools = [_signed_factors(p) for p in products]
    common = []
    for factor in list(pools[0]):
        if all(factor in pool for pool in pools):
            common.append(factor)
            for pool in pools:
                pool.remove(factor)
    if not any(not f.is_number and not f.is_Symbol for f in common):
        return None
    return sympy.Mul(*common), [sympy.Mul(*pool) for pool in pools]


def _signed_factors(product: Expr) -> list[Expr]:
    """The factors of `product`, a sum that SymPy wrote with its sign inside (`-a - 1`) as the sum
    without it (`a + 1`) and the sign as a factor -1, so products of opposite signs share it."""
    negative = False
    factors = []
    for factor in sympy.Mul.make_args(product):
        if factor.is_Add and factor.could_extract_minus_sign():
            factor, negative = -factor, not negative
        elif factor.is_number and factor.is_negative:
            factor, negative = -factor, not negative
        if factor != 1:
            factors.append(factor)
    return [sympy.S.NegativeOne, *factors] if negative else factors


def _negated(a: Expr, b: Expr) -> bool:
    """Whether `b` is `-a`: as written, once products of sums are multiplied out (`2*(t - x)` is
    `-(2*x - 2*t)`), for formulas small enough that multiplying out costs nothing, or branch by branch
    of a `where` on the same condition (`where(d > 0, 2, -1/2)` and `where(d > 0, -2, 1/2)`)."""
    if isinstance(a, fn.where) and isinstance(b, fn.where):
        return a.args[0] == b.args[0] and _negated(a.args[1], b.args[1]) and _negated(a.args[2], b.args[2])
    return b == -a or (sympy.count_ops(a) + sympy.count_ops(b) <= 40 and sympy.expand(a + b) == 0)


def named_shares(
    temps: list[Temp], reduced: list[Expr], shared: list[tuple[sympy.Symbol, Expr]]
) -> tuple[list[Temp], list[Expr]]:
    """The shared products of `shared_negations` as temporaries after CSE's, numbered after them."""
    if not shared:
        return temps, reduced
    products, reduced = reduced[len(reduced) - len(shared) :], reduced[: len(reduced) - len(shared)]
    start = 1 + max((int(t.symbol.name.split(":")[1]) for t in temps), default=-1)
    names = sympy.numbered_symbols("tmp:", cls=sympy.Symbol, real=True, start=start)
    renamed = {symbol: next(names) for symbol, _ in shared}
    temps = [Temp(t.symbol, t.expr.xreplace(renamed)) for t in temps]
    for (symbol, _), expr in zip(shared, products, strict=True):
        # After the temporaries it reads, before the first that reads it (CSE may make one of its quotient).
        after = 1 + max((k for k, t in enumerate(temps) if t.symbol in expr.free_symbols), default=-1)
        first = next((k for k, t in enumerate(temps) if renamed[symbol] in t.expr.free_symbols), len(temps))
        temps.insert(max(after, first), Temp(renamed[symbol], expr, kernel=True))
    return temps, [e.xreplace(renamed) for e in reduced]
