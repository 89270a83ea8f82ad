"""Lowering stage: SymPy formulas -> calls of PyTorch's native kernels where a formula is one.

Receives a (rewritten) SymPy expression and the symbols of non-tensor inputs; returns the same
value with every subformula that is exactly a PyTorch primitive replaced by a node that
prints as that primitive's call: `x * sigmoid(x)` becomes `F.silu(x)`, `softplus(b*x)/b`
becomes `F.softplus(x, b)`, and so on (`PRIMITIVES`). `derive` applies it after the stable
rewrites and before differentiating, so a gradient holds the primitive's derivative as
one node, which the emitter prints as PyTorch's own backward kernel (`opgen.emit.kernel_lines`).

The primitives are nodes of the kernel IR (opgen.optimize.kernels, Note [native backward kernels]).
"""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn
from opgen.nodes.stable import logsigmoid
from opgen.optimize.kernels import (
    PRIMITIVES,
    _Prime,
    _Primitive,
    elu,
    gelu,
    gelu_tanh,
    hardsigmoid,
    hardswish,
    hardtanh,
    huber,
    leaky_relu,
    log_sigmoid,
    mish,
    silu,
    smooth_l1,
    softplus_beta,
)

__all__ = [
    "PRIMITIVES",
    "_Prime",
    "_Primitive",
    "elu",
    "gelu",
    "gelu_tanh",
    "hardsigmoid",
    "hardswish",
    "hardtanh",
    "huber",
    "leaky_relu",
    "log_sigmoid",
    "lower",
    "mish",
    "silu",
    "smooth_l1",
    "softplus_beta",
]


# Note [kinks of lowered primitives]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A formula becomes a primitive only where the two are the same function AND have the same
# derivative everywhere, kinks included: a gradient at a kink is the formula's (Note [real
# kinks]), and a user who wrote `min(max(...))` gets its zero slope at the clip points, one
# who wrote `clamp` the slope passed through. So `x * min(max(x + 3, 0), 6) / 6` is F.hardswish
# (gradient 0 at -3, 1 at 3, as PyTorch's kernel) and `x * clamp(x + 3, 0, 6) / 6`, whose
# gradient is -1/2 at -3 and 3/2 at 3, is not; `where(|d| <= delta, ...)` is huber as `<` is,
# because its branches meet at |d| = delta with the same value and slope.

# Note [parameters of lowered primitives]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A primitive whose kernel refuses some values of its parameters is lowered only where the call
# means the formula for every value a parameter input may take. `max(min(u, hi), lo)` is the
# constant lo where lo > hi, which F.hardtanh refuses (min_val > max_val): with bounds given as
# inputs it becomes hardtanh(u, lo, max(lo, hi)), the formula for every lo and hi, and
# `min(max(u, lo), hi)` hardtanh(u, min(lo, hi), hi); value and zero slope agree at lo = hi too.
# F.huber_loss refuses delta <= 0 and F.smooth_l1_loss beta < 0, where the formulas are their
# linear branch: with the bound a Tensor input, they stay formulas; with a float input, the call
# runs where the kernel takes the bound and the formula elsewhere (`(F.huber_loss(d, ..., delta=delta)
# if delta > 0 else where(...))`, and so their backward kernels and derivatives), not the kernel's error.

# -- matching ------------------------------------------------------------------------------------


def _split(node: Expr, part: Expr) -> Expr | None:
    """`node / part` when `node` is a product holding `part`, else None."""
    if isinstance(node, sympy.Mul) and part in node.args:
        return node / part
    return None


def _match_silu(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, sympy.Mul):
        return None
    for factor in node.args:
        if isinstance(factor, fn.sigmoid) and _split(node, factor) == factor.args[0]:
            return silu(factor.args[0])
    return None


def _match_mish(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, sympy.Mul):
        return None
    for factor in node.args:
        if isinstance(factor, sympy.tanh) and isinstance(factor.args[0], fn.softplus):
            u = factor.args[0].args[0]
            if _split(node, factor) == u:
                return mish(u)
    return None


def _match_gelu(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, sympy.Mul):
        return None
    for e in node.atoms(sympy.erf):
        u = sympy.expand(e.args[0] * sympy.sqrt(2))
        if _same(node, gelu(u).elementary()):
            return gelu(u)
    for t in node.atoms(sympy.tanh):
        for u in sorted(_tensors(t, numbers), key=sympy.default_sort_key):
            if _same(node, gelu_tanh(u).elementary()):
                return gelu_tanh(u)
    return None


def _tensors(expr: sympy.Basic, numbers: frozenset[sympy.Symbol]) -> set[sympy.Basic]:
    """The symbols of `expr` that may hold tensors: all but the non-tensor inputs."""
    return expr.free_symbols - numbers


def _same(a: Expr, b: Expr) -> bool:
    return bool(a == b or sympy.expand(a - b) == 0)


def _match_softplus(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, sympy.Mul):
        return None
    for factor in node.args:
        if isinstance(factor, fn.softplus) and _tensors(factor, numbers):  # of a number: `math`, not a kernel
            beta, u = factor.args[0].as_independent(*_tensors(factor, numbers), as_Add=False)
            if beta != 1 and _split(node, factor) == 1 / beta:
                return softplus_beta(u, beta)
    return None


def _match_elu(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, fn.where):
        return None
    cond, u, other = node.args
    if cond != sympy.StrictGreaterThan(u, 0) or not _tensors(u, numbers):
        return None
    alpha = _split(other, fn.expm1(u)) if isinstance(other, sympy.Mul) else (S.One if other == fn.expm1(u) else None)
    if alpha is None or _tensors(alpha, numbers):
        return None
    return elu(u, alpha)


def _match_leaky_relu(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, fn.where):
        return None
    cond, u, other = node.args
    if cond != sympy.StrictGreaterThan(u, 0) or not _tensors(u, numbers):
        return None
    slope = _split(other, u)
    if slope is None or _tensors(slope, numbers):
        return None
    return leaky_relu(u, slope)


def _bound(node: Expr, kind: type[sympy.Function], numbers: frozenset[sympy.Symbol]) -> tuple[Expr, Expr] | None:
    """(operand, number) when `node` is `kind(operand, number)` in either order."""
    if not isinstance(node, kind) or node.args[2] != 0:
        return None
    a, b = node.args[0], node.args[1]
    if not _tensors(b, numbers):
        return a, b
    if not _tensors(a, numbers):
        return b, a
    return None


def _match_hardtanh(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    """max(min(u, hi), lo) or min(max(u, lo), hi): the same function and gradient when lo < hi."""
    for outer, inner in ((fn.maximum, fn.minimum), (fn.minimum, fn.maximum)):
        found = _bound(node, outer, numbers)
        inside = _bound(found[0], inner, numbers) if found else None
        if found and inside and _tensors(inside[0], numbers):
            lo, hi = (found[1], inside[1]) if outer is fn.maximum else (inside[1], found[1])
            if (lo - hi).is_number and not (lo - hi).is_negative:
                return None  # constant bounds the wrong way round: keep the formula's meaning
            if not (lo - hi).is_number:  # Note [parameters of lowered primitives]
                lo, hi = (lo, sympy.Max(lo, hi)) if outer is fn.maximum else (sympy.Min(lo, hi), hi)
            return hardtanh(inside[0], lo, hi)
    return None


def _band(node: Expr, numbers: frozenset[sympy.Symbol]) -> tuple[Expr, Expr, Expr, Expr] | None:
    """(d, bound, inside, outside) when `node` is `where(|d| < bound, inside, outside)`, the bound a number.

    `<=` and the test turned round (`|d| >= bound`, branches swapped) are read the same way: the
    caller checks that both branches agree at `|d| = bound`, in value and in slope (Note [kinks of
    lowered primitives]).
    """
    if not isinstance(node, fn.where) or not isinstance(node.args[0], sympy.core.relational.Relational):
        return None
    cond, a, b = node.args
    if isinstance(cond, (sympy.StrictGreaterThan, sympy.GreaterThan)):
        a, b = b, a
    elif not isinstance(cond, (sympy.StrictLessThan, sympy.LessThan)):
        return None
    size, bound = cond.args
    if not isinstance(size, sympy.Abs) or _tensors(bound, numbers) or (bound.is_number and not bound.is_positive):
        return None
    return size.args[0], bound, a, b


def _match_band(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    """The Huber function `where(|d| < delta, d**2 / 2, delta * (|d| - delta / 2))`, and smooth L1, its
    quotient by delta: at |d| = delta both branches have the same value and slope, so `<` and `<=` agree."""
    band = _band(node, numbers)
    if band is None:
        return None
    d, bound, _, _ = band
    for primitive in (huber, smooth_l1):
        formula = primitive(d, bound).elementary()
        if _same(fn.where(sympy.StrictLessThan(sympy.Abs(d), bound), *band[2:]), formula):
            return primitive(d, bound)
    return None


def _clipped(factor: Expr) -> tuple[Expr, Expr] | None:
    """(u, hi) when `factor` is `hardtanh(v, 0, hi)` = `hi * hardsigmoid(u)`, hi a positive number."""
    if isinstance(factor, hardsigmoid):
        return factor.args[0], S.One
    if not isinstance(factor, hardtanh) or factor.args[1] != 0 or not factor.args[2].is_Number:
        return None
    v, hi = factor.args[0], factor.args[2]
    return (6 * v / hi - 3, hi) if hi.is_positive else None


def _match_hard(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    """`u * min(max(u + 3, 0), 6) / 6` -> hardswish(u), `min(max(u + 3, 0), 6) / 6` -> hardsigmoid(u).

    Any clip to [0, hi] of an affine `v` is `hi * hardsigmoid(6 v / hi - 3)`, with the same zero
    slope at the clip points (Note [kinks of lowered primitives]); it becomes hardswish where the
    rest of the product holds `u`, hardsigmoid where `u` is simpler than `v` (`x + 3`, `x / 6 + 1/2`),
    and stays a clip otherwise (relu6). Only plain numbers: a bound given as an input is left alone.
    """
    for factor in sympy.Mul.make_args(node):
        found = _clipped(factor)
        if found is None or not _tensors(found[0], numbers):
            continue
        u, hi = found
        rest = hi * node / factor
        scale, body = u.as_coeff_Mul()
        if body in sympy.Mul.make_args(rest):
            return hardswish(u) * (rest / u)
        if not isinstance(factor, hardsigmoid) and sympy.count_ops(hardsigmoid(u) * rest) < sympy.count_ops(node):
            return hardsigmoid(u) * rest
    return None


def _match_log_sigmoid(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    return log_sigmoid(node.args[0]) if isinstance(node, logsigmoid) else None


_MATCHERS = (
    _match_silu,
    _match_log_sigmoid,
    _match_mish,
    _match_gelu,
    _match_softplus,
    _match_elu,
    _match_leaky_relu,
    _match_hardtanh,
    _match_hard,
    _match_band,
)


def lower(expr: Expr, numbers: frozenset[sympy.Symbol]) -> Expr:
    """`expr` with every subformula that is a PyTorch primitive replaced by it.

    `numbers` are the symbols of the non-tensor inputs: a primitive's parameters
    (softplus's beta, elu's alpha) must be made of these and constants.
    """
    if expr.is_Atom or not expr.args or not _tensors(expr, numbers):
        return expr
    args = tuple(lower(a, numbers) if isinstance(a, Expr) else a for a in expr.args)
    node = expr.func(*args) if args != expr.args else expr
    for match in _MATCHERS:  # in order: a later matcher sees what an earlier one made (a clip -> hardsigmoid)
        found = match(node, numbers)
        if found is not None:
            node = found
    return node
