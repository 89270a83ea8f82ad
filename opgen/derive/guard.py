"""Branch guards: keep the branch a `where` did not take from turning gradients into NaN.

Used by `opgen.derive.gradients` on a formula before it is differentiated (and on gradient
overrides); receives a SymPy expression and the symbols of the Tensor inputs, returns
the same function of them with guarded arguments. See Note [double where].

Note [double where]
~~~~~~~~~~~~~~~~~~~
`where(x > 0, sqrt(x), 0)` has the value it should everywhere, but its gradient does not:
autograd sends a zero gradient into the branch not taken, and at x = -1 that branch's
derivative is NaN, and 0 * NaN = NaN. JAX and PyTorch users fix it by hand with a second
`where` on the argument: `where(x > 0, sqrt(where(x > 0, x, 1)), 0)`. We do the same,
before differentiation, so every derived formula (and its derivative, when autograd
differentiates our backward) inherits the guard:

- inside the branch taken when `c` holds, the argument `u` of each function that is
  undefined or infinite somewhere (`restricted_arguments` below) becomes `where(c, u, safe)`, with
  `safe` a point where the function and all its derivatives are finite; the other branch
  is guarded with `~c`. Nested branches combine their conditions with `&`.
- the value is unchanged wherever the branch is taken, so forward needs no guard and
  keeps the formula as written.
- a `where` whose derivative does not read its branches (`derivative_reads_branches`: the
  conjugate form of Note [derivative of the conjugate form] in opgen/optimize/cancellation.py)
  keeps them unguarded; what is inside them is guarded for the `where`s around it as usual.
- differentiating a guard gives indicators `where(c, 1, 0)`; inside the branch taken
  when `c` holds they are the constant 1 (`settle_indicators`), which keeps the printed
  backward as short as the unguarded one plus the guards themselves.
"""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn
from opgen.formula.tensor import TensorOp
from opgen.nodes.base import Node

Domain = tuple[tuple[int, ...], Expr]  # positions of a function's restricted arguments, a safe value for them

# SymPy's functions and the formula language's, by class. A function a later stage builds
# (the stable rewrites' `sinc`) declares its own, `Node.guard_domain`: this table
# is data that no other module changes (`restricted_arguments` reads both).
DOMAINS: dict[type, Domain] = {
    sympy.log: ((0,), S.One),
    fn.log1p: ((0,), S.Zero),
    sympy.loggamma: ((0,), S.One),
    sympy.polygamma: ((1,), S.One),
    sympy.asin: ((0,), S.Zero),
    sympy.acos: ((0,), S.Zero),
    sympy.atanh: ((0,), S.Zero),
    sympy.erfinv: ((0,), S.Zero),
    sympy.acosh: ((0,), sympy.Integer(2)),
}
# Functions finite with all their derivatives at every positive argument: an argument SymPy
# proves positive (`log(1 + exp(x))`) needs no guard.
POSITIVE_IS_SAFE = (sympy.log, fn.log1p, sympy.loggamma, sympy.polygamma)


def restricted_arguments(function: type) -> Domain | None:
    """Which arguments of `function` are restricted, and a safe value for them; None if none are."""
    own = function.guard_domain if issubclass(function, Node) else None
    found: Domain | None = DOMAINS.get(function) or own
    return found


def guard_branches(expr: Expr, tensors: frozenset[sympy.Symbol]) -> Expr:
    """`expr` with the restricted arguments of every `where` branch guarded by its condition."""
    if not expr.has(fn.where):
        return expr
    return _guard(expr, tensors)


def _guard(expr: sympy.Basic, tensors: frozenset[sympy.Symbol]) -> sympy.Basic:
    if not expr.args or not expr.has(fn.where):
        return expr
    args = [_guard(a, tensors) for a in expr.args]
    if isinstance(expr, fn.where) and expr.derivative_reads_branches:
        cond, a, b = args
        return fn.where(cond, _restrict(a, cond, tensors), _restrict(b, sympy.Not(cond), tensors))
    return expr.func(*args)


def _restrict(expr: sympy.Basic, cond: sympy.Basic, tensors: frozenset[sympy.Symbol]) -> sympy.Basic:
    """Guard every restricted argument in `expr` so it is in the domain where `cond` fails.

    Not inside a tensor operation (a reduction, softmax, `@`, a slice): its entries are not the
    condition's (`where(x0 > 7, -x0, sum(acosh(x1)))` with x0 [N, K], x1 [K, M] would compare
    entries of x0 with x1's), and each of its entries reads several of its operand's, so a guard
    there would change the branch's value, and its gradient, where the branch is taken."""
    if not expr.args or not (expr.free_symbols & tensors) or isinstance(expr, TensorOp):
        return expr
    args = [_restrict(a, cond, tensors) for a in expr.args]
    if isinstance(expr, sympy.Pow):
        base, exponent = args
        if _restricted_power(base, exponent):
            return sympy.Pow(_wrap(base, cond, S.One, tensors), exponent)
        return sympy.Pow(base, exponent)
    rule = restricted_arguments(type(expr))
    if rule is not None and not (isinstance(expr, POSITIVE_IS_SAFE) and expr.args[-1].is_positive):
        positions, safe = rule
        args = [_wrap(a, cond, safe, tensors) if k in positions else a for k, a in enumerate(args)]
    return expr.func(*args)


def _restricted_power(base: sympy.Basic, exponent: sympy.Basic) -> bool:
    """`u**e` is undefined or infinite somewhere unless `e` is a whole number >= 0 (or u a constant).

    A base SymPy can prove positive (`1 + x**2`, `1 + exp(-x)`) needs no guard either.
    """
    if base.is_number or base.is_positive:
        return False
    return not (exponent.is_Integer and exponent.is_nonnegative)


def _wrap(arg: sympy.Basic, cond: sympy.Basic, safe: Expr, tensors: frozenset[sympy.Symbol]) -> sympy.Basic:
    if not (arg.free_symbols & tensors):
        return arg
    if isinstance(arg, fn.where) and arg.args[2] == safe:
        inner, value, _ = arg.args
        if inner == cond:
            return arg
        return fn.where(sympy.And(cond, inner), value, safe)
    return fn.where(cond, arg, safe)


def settle_indicators(expr: Expr) -> Expr:
    """Inside the branch of `where(c, a, b)` taken when `c` holds, `where(c, p, q)` of numbers is `p`.

    Differentiating a guard `where(c, u, safe)` gives `where(c, du, 0)`; in the branch it
    guards, that is just `du`.
    """
    if not expr.has(fn.where):
        return expr
    return _settle(expr, {})


def _settle(expr: sympy.Basic, known: dict[sympy.Basic, sympy.Basic]) -> sympy.Basic:
    if not expr.args:
        return expr
    if isinstance(expr, fn.where):
        cond, a, b = expr.args
        if a.is_number and b.is_number:
            # Only numbers: the guards (`where(c, u, safe)`) must stay as they are.
            return fn.where(_assume(cond, known), a, b)
        a = _settle(a, known | _facts(cond, S.true))
        b = _settle(b, known | _facts(cond, S.false))
        return expr.func(cond, a, b)  # a subclass stays itself (`derivative_reads_branches`)
    if not expr.has(fn.where):
        return expr
    return expr.func(*(_settle(a, known) for a in expr.args))


def _facts(cond: sympy.Basic, value: sympy.Basic) -> dict[sympy.Basic, sympy.Basic]:
    """What is known inside a branch: `cond` has `value`, and so its negation the opposite."""
    other = S.false if value is S.true else S.true
    facts = {cond: value, sympy.Not(cond): other}
    if value is S.true and isinstance(cond, sympy.And):
        for part in cond.args:
            facts |= {part: S.true, sympy.Not(part): S.false}
    return facts


def _assume(cond: sympy.Basic, known: dict[sympy.Basic, sympy.Basic]) -> sympy.Basic:
    if not known:
        return cond
    if cond in known:
        return known[cond]
    return cond.xreplace(known)
