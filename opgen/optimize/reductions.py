"""Stable rewrites over reductions: `log(sum(exp(u)))` -> logsumexp, the textbook softmax -> softmax.

Receives one node of a (rewritten bottom-up) formula and the static shapes of the formula's
symbols; returns the same value computed by a node PyTorch evaluates stably, or None. Called by
`opgen.optimize.rewrite` for every node (Note [stable rewrites over reductions]).

Note [stable rewrites over reductions]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Each rule is an exact identity (tests/test_reductions.py checks each at 50 digits, and the
ops in float32 at logits of ±1e4 against torch.softmax / torch.logsumexp / F.cross_entropy).
`d` is a reduction's dim; `m` stands for anything constant along `d` (a number, a value with
size 1 at `d` such as `amax(u, d, keepdim=true)`: its static shape says so):

    log(sum(exp(u), d, k))                -> logsumexp(u, d, k)
    log(sum(c**u, d, k))                  -> logsumexp(u * log(c), d, k)    (c > 0 a number, c != 1;
                                                                               and so in every rule below)
    log(c * cumsum(exp(u), d))            -> log(c) + logcumsumexp(u, d)
    log(c * sum(exp(u), d, k))            -> log(c) + logsumexp(u, d, k)     (sum(exp) > 0)
    log(c * mean(exp(u), d, k))           -> log(c / n) + logsumexp(u, d, k) (n: the size of d)
    sum(m * v, d, k)                      -> m * sum(v, d, k)                 (k, or m lacks d)
    logsumexp(u - m, d, k)                -> logsumexp(u, d, k) - m           (so `m + log(sum(exp(u - m)))`
                                                                               is logsumexp(u))
    exp(u) / sum(exp(u), d, keepdim)      -> softmax(u, d)
    softmax(u - m, d)                     -> softmax(u, d)                    (shift invariance)
    u - logsumexp(u, d, keepdim)          -> log_softmax(u, d)                (also inside a longer sum)
    log(softmax(u, d))                    -> log_softmax(u, d)
    exp(log_softmax(u, d))                -> softmax(u, d)

The nodes' gradients are the stable ones (`opgen.derive.vjp`): softmax's is PyTorch's
`s * (g - sum(g * s))` kernel, logsumexp's `g * exp(u - logsumexp(u))`, so the gradient of a
rewritten formula never sees `exp(u)` on its own.
"""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.formula.tensor import (
    LogSoftmax,
    ReduceLogSumExp,
    ReduceMean,
    ReduceSum,
    ReductionBase,
    Shape,
    ShapeError,
    Softmax,
    dims_count,
    shape_of,
    split,
)
from opgen.nodes.scan import Cumsum, LogCumsumExp

Shapes = dict[sympy.Symbol, Shape]


def constant_along(expr: Expr, dim: int, shapes: Shapes | None) -> bool:
    """Whether `expr` has size 1 at `dim` (counted from the end) or lacks it, by its static shape.

    Without `shapes` only numbers are; a symbol the table lacks is a plain number (`shape_of`).
    """
    if expr.is_number:
        return True
    if shapes is None:
        return False
    try:
        shape = shape_of(expr, shapes)
    except ShapeError:
        return False
    if shape is None:
        return False
    batch, dims = split(shape)
    if len(dims) < -dim:
        return not batch  # `...` might stand for the dimension
    return dims[dim] == 1


def _squeezed(expr: Expr, dim: int, shapes: Shapes | None) -> Expr | None:
    """`expr` (constant along `dim`) without its size-1 `dim`: what it is after a reduction without keepdim."""
    if expr.is_number:
        return expr
    assert shapes is not None
    shape = shape_of(expr, shapes)
    assert shape is not None
    if len(split(shape)[1]) < -dim:
        return expr
    if isinstance(expr, ReductionBase) and expr.keepdim and _one_dim(expr) == dim:
        return expr.func(expr.operand, expr.args[1], S.Zero, *expr.args[3:])  # var keeps its correction
    if isinstance(expr, (sympy.Add, sympy.Mul, sympy.Pow)) or (
        isinstance(expr, sympy.Function) and not isinstance(expr, ReductionBase) and len(expr.args) == 1
    ):
        args = [_squeezed(a, dim, shapes) for a in expr.args]
        return None if any(a is None for a in args) else expr.func(*args)
    return None  # a symbol with the size-1 dimension (a `let`): cannot be squeezed here


def _split_constant(expr: Expr, dim: int, shapes: Shapes | None) -> tuple[Expr, Expr]:
    """`expr` (a sum) as (terms constant along `dim`, the other terms)."""
    constant: list[Expr] = []
    varying: list[Expr] = []
    for term in sympy.Add.make_args(expr):
        (constant if constant_along(term, dim, shapes) else varying).append(term)
    return sympy.Add(*constant), sympy.Add(*varying)


def _one_dim(node: ReductionBase) -> int | None:
    """The reduced dim of a reduction over one dim; None over several or all (the rules here are
    for one: softmax and log_softmax take one dim)."""
    return None if isinstance(node.args[1], sympy.Tuple) else node.dim


def _exp_arg(expr: sympy.Basic) -> Expr | None:
    """`u` when `expr` is `exp(u)`, `u * log(c)` when it is `c**u` for a number `c > 0`, `c != 1`
    (`log2(sum(2**x))` is `logsumexp(x * log(2)) / log(2)`, torch's logaddexp2 over a dim)."""
    if isinstance(expr, sympy.exp):
        return expr.args[0]
    if isinstance(expr, sympy.Pow) and expr.base == S.Exp1:
        return expr.exp
    if isinstance(expr, sympy.Pow) and expr.base.is_number and expr.base.is_positive and expr.base != 1:
        if not expr.exp.is_number:
            return expr.exp * sympy.log(expr.base)
    return None


def _sum_of_exp(expr: sympy.Basic) -> tuple[Expr, sympy.Integer, sympy.Integer] | None:
    """(u, dim, keepdim) when `expr` is `sum(exp(u), dim, keepdim)` over one dim."""
    if isinstance(expr, ReduceSum) and _one_dim(expr) is not None:
        u = _exp_arg(expr.operand)
        if u is not None:
            return u, expr.args[1], expr.args[2]
    return None


def _mean_count(expr: sympy.Basic, shapes: Shapes | None) -> Expr | None:
    """The count of entries `expr` averages when it is a `mean` over one dim of a known shape; else None."""
    if not isinstance(expr, ReduceMean) or _one_dim(expr) is None or shapes is None:
        return None
    try:
        return dims_count(shape_of(expr.operand, shapes), expr.dims, "mean()")
    except ShapeError:
        return None


def reduce_sum(node: ReduceSum, shapes: Shapes | None) -> Expr | None:
    """`sum(m * v, d)` -> `m * sum(v, d)` for factors `m` constant along `d` (keepdim, or `m` lacks `d`)."""
    operand, dim = node.operand, _one_dim(node)
    if not isinstance(operand, sympy.Mul) or dim is None:
        return None
    outside = []
    for factor in operand.args:
        if constant_along(factor, dim, shapes) and not factor.is_number:
            kept = factor if node.keepdim else _squeezed(factor, dim, shapes)
            if kept is not None and (node.keepdim or kept == factor):
                outside.append(factor)
    if not outside or len(outside) == len(operand.args):
        return None
    inside = sympy.Mul(*[f for f in operand.args if f not in outside])
    return sympy.Mul(*outside) * ReduceSum(inside, node.args[1], node.args[2])


def log_of(node: sympy.log, shapes: Shapes | None) -> Expr | None:
    """`log(c * sum(exp(u), d, k))` -> `log(c) + logsumexp(u, d, k)`; `log(softmax)` -> log_softmax."""
    arg = node.args[0]
    if isinstance(arg, Softmax):
        return LogSoftmax(*arg.args)
    for factor in sympy.Mul.make_args(arg):
        scanned = _exp_arg(factor.args[0]) if isinstance(factor, Cumsum) and len(factor.args) == 3 else None
        if scanned is not None:  # Note [logcumsumexp] in opgen.nodes.scan
            lcse, rest = LogCumsumExp(scanned, *factor.args[1:]), arg / factor
            return lcse if rest == 1 else sympy.log(rest) + lcse
        parts, count = _sum_of_exp(factor), _mean_count(factor, shapes)
        if parts is None and count is not None:  # mean(exp(u)) = sum(exp(u)) / n: LogSumExp pooling
            parts = _sum_of_exp(ReduceSum(*factor.args))
        if parts is not None:
            rest = arg / factor / (count or 1)
            lse = logsumexp(ReduceLogSumExp(*parts), shapes) or ReduceLogSumExp(*parts)
            return lse if rest == 1 else sympy.log(rest) + lse
    return None


def logsumexp(node: ReduceLogSumExp, shapes: Shapes | None) -> Expr | None:
    """`logsumexp(u - m, d, k)` -> `logsumexp(u, d, k) - m` for `m` constant along `d`."""
    dim = _one_dim(node)
    if dim is None:
        return None
    constant, varying = _split_constant(node.operand, dim, shapes)
    if constant == 0 or varying == 0:
        return None
    shift = constant if node.keepdim else _squeezed(constant, dim, shapes)
    if shift is None:
        return None
    return node.func(varying, node.args[1], node.args[2]) + shift


def softmax(node: Softmax, shapes: Shapes | None) -> Expr | None:
    """`softmax(u - m, d)` -> `softmax(u, d)` for `m` constant along `d`."""
    u, dim = node.args
    constant, varying = _split_constant(u, int(dim), shapes)
    if constant == 0 or varying == 0:
        return None
    return Softmax(varying, dim)


def product(node: sympy.Mul, shapes: Shapes | None) -> Expr | None:
    """`exp(u) * sum(exp(u), d, keepdim=true)**-1 * rest` -> `softmax(u, d) * rest`."""
    factors = list(node.args)
    for k, factor in enumerate(factors):
        base, power = factor.as_base_exp()
        parts = _sum_of_exp(base)
        if power != -1 or parts is None or not parts[2]:
            continue
        u, dim, _ = parts
        for j, other in enumerate(factors):
            if j != k and _exp_arg(other) == u:
                rest = [f for i, f in enumerate(factors) if i not in (j, k)]
                return sympy.Mul(softmax(Softmax(u, dim), shapes) or Softmax(u, dim), *rest)
    return None


def total(node: sympy.Add, shapes: Shapes | None) -> Expr | None:
    """`u - logsumexp(u, d, keepdim=true) + rest` -> `log_softmax(u, d) + rest` (and its negation)."""
    terms = list(node.args)
    for term in terms:
        coeff, body = term.as_coeff_Mul()
        if coeff not in (1, -1) or not isinstance(body, ReduceLogSumExp) or not body.keepdim:
            continue
        if _one_dim(body) is None:
            continue
        others = [t for t in terms if t is not term]
        wanted = [-coeff * t for t in sympy.Add.make_args(body.operand)]
        if _contains(others, wanted):
            for t in wanted:
                others.remove(t)
            return sympy.Add(-coeff * LogSoftmax(body.operand, body.args[1]), *others)
    return None


def _contains(pool: list[Expr], wanted: list[Expr]) -> bool:
    left = list(pool)
    for t in wanted:
        if t not in left:
            return False
        left.remove(t)
    return True


def exponential(node: sympy.exp, shapes: Shapes | None) -> Expr | None:
    """`exp(log_softmax(u, d))` -> `softmax(u, d)`."""
    arg = node.args[0]
    return Softmax(*arg.args) if isinstance(arg, LogSoftmax) else None
