"""Layer norm and RMS norm: where the optimizer puts a layer norm's kernel, and which statistics it saves.

`lower_norms` replaces a formula that is exactly a layer norm over the last dim(s),
`(u - mean(u)) / sqrt(var(u, correction=0) + eps)` (the variance also written by hand as
`mean((u - mean(u))**2)`, lets inlined), times an optional weight plus an optional bias over
the normalized dims, by the node `LayerNorm` (opgen.nodes.layer_norm, printed as
`torch.layer_norm`, differentiated by `native_layer_norm_backward`). `saved_statistics` chooses
the statistics forward returns for that kernel (Note [layer norm statistics] in
opgen.nodes.layer_norm), `saved_rstds` the reciprocal roots an RMS norm keeps (Note [saved rstd]).
"""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.derive.gradients import Variant
from opgen.formula.read import Formulas
from opgen.formula.tensor import (
    BATCH,
    ReduceMean,
    ReduceVar,
    Shape,
    ShapeError,
    TensorOp,
    dim_size,
    shape_of,
)
from opgen.nodes.layer_norm import Item, LayerNorm, LayerNormStats, Rstd
from opgen.optimize.lets import lower_through_lets

# -- matching ------------------------------------------------------------------------------------


def _trailing(dims: tuple[int, ...], keepdim: bool) -> bool:
    return keepdim and bool(dims) and sorted(dims) == list(range(-len(dims), 0))


def _variance(expr: Expr) -> tuple[Expr, tuple[int, ...]] | None:
    """(u, dims) when `expr` is the population variance of `u` over trailing `dims`, kept:
    `var(u, correction=0)` or `mean((u - mean(u))**2)`."""
    if isinstance(expr, ReduceVar) and expr.correction == 0 and _trailing(expr.dims, expr.keepdim):
        return expr.operand, expr.dims
    if isinstance(expr, ReduceMean) and _trailing(expr.dims, expr.keepdim) and not expr.every_dim:
        base, power = expr.operand.as_base_exp()
        centered = _centered(base) if power == 2 else None
        if centered is not None and centered[1] == expr.dims:
            return centered
    return None


def _centered(expr: Expr) -> tuple[Expr, tuple[int, ...]] | None:
    """(u, dims) when `expr` is `u - mean(u, dims, keepdim)` (or its negative: squared, the same)."""
    if not isinstance(expr, sympy.Add):
        return None
    for sign in (S.One, S.NegativeOne):
        for term in expr.args:
            mean = sign * -term
            if isinstance(mean, ReduceMean) and _trailing(mean.dims, mean.keepdim) and not mean.every_dim:
                if sympy.expand(sign * expr - mean.operand + mean) == 0:
                    return mean.operand, mean.dims
    return None


def _rstd(factor: Expr, numbers: frozenset[sympy.Symbol]) -> tuple[Expr, tuple[int, ...], Expr] | None:
    """(u, dims, eps) when `factor` is `(var(u) + eps)**(-1/2)`, eps made of numbers and constants."""
    base, power = factor.as_base_exp()
    if power != -S.Half or not isinstance(base, sympy.Add):
        return None
    for term in base.args:
        found = _variance(term)
        eps = base - term
        if found is not None and not (eps.free_symbols - numbers) and not eps.has(TensorOp):
            if eps.is_number and not eps.is_nonnegative:
                return None  # a negative eps: NaN where the kernel and the formula may differ
            return found[0], found[1], eps
    return None


class _Matcher:
    def __init__(self, shapes: dict[sympy.Symbol, Shape], numbers: frozenset[sympy.Symbol]) -> None:
        self.shapes = shapes
        self.numbers = numbers

    def shape(self, expr: Expr) -> Shape:
        try:
            return shape_of(expr, self.shapes)
        except ShapeError:
            return None

    def normalized(self, node: Expr) -> tuple[Expr, Expr, sympy.Tuple] | None:
        """(u, w, shape) when `node` is a product `centered * rstd * w` of one layer norm; `w` holds the
        factors over exactly the normalized dims, other factors (numbers) stay out; None if any other."""
        if not isinstance(node, sympy.Mul):
            return None
        for factor in node.args:
            found = _rstd(factor, self.numbers)
            if found is None:
                continue
            u, dims, eps = found
            rest = [f for f in node.args if f is not factor]
            centered = [f for f in rest if _centered(f) == (u, dims)]
            whole = self.shape(u)
            if len(centered) != 1 or whole is None or BATCH in whole[len(whole) - len(dims) :]:
                continue
            named = whole[len(whole) - len(dims) :]
            if any(d == 1 for d in named) or len(named) != len(dims):
                continue
            others = [f for f in rest if f is not centered[0]]
            weight = [f for f in others if not f.is_number and self.shape(f) == named]
            if any(not f.is_number and f not in weight for f in others) or any(f.has(u) for f in weight):
                continue  # a factor broadcasting differently: not the kernel's weight
            number = sympy.Mul(*[f for f in others if f.is_number])
            shape = sympy.Tuple(*(dim_size(str(d)) for d in named))
            return LayerNorm(u, sympy.Mul(*weight), S.Zero, eps, shape) * number, named, shape
        return None

    def lower(self, expr: Expr) -> Expr:
        if expr.is_Atom or not expr.args:
            return expr
        args = tuple(self.lower(a) if isinstance(a, Expr) else a for a in expr.args)
        node = expr.func(*args) if args != expr.args else expr
        if isinstance(node, sympy.Add):
            return self.with_bias(node)
        found = self.normalized(node)
        return found[0] if found is not None else node

    def with_bias(self, node: sympy.Add) -> Expr:
        """A sum holding one layer norm (times 1) and terms over exactly its normalized dims: the bias."""
        norms = [t for t in node.args if isinstance(t, LayerNorm) and t.args[2] == 0]
        if len(norms) != 1:
            return node
        norm = norms[0]
        rest = [t for t in node.args if t is not norm]
        named = tuple(str(s.name).split(":", 1)[1] for s in norm.args[4])
        bias = [t for t in rest if not t.is_number and self.shape(t) == named and not t.has(norm.args[0])]
        if not bias:
            return node
        others = [t for t in rest if t not in bias]
        u, w, _, eps, shape = norm.args
        return sympy.Add(LayerNorm(u, w, sympy.Add(*bias), eps, shape), *others)


def lower_norms(formulas: Formulas) -> Formulas:
    """Each definition that holds a layer norm (with the lets it uses written out) with its node."""
    matcher = _Matcher(formulas.shapes, formulas.numbers)
    return lower_through_lets(formulas, lambda e: e.has(ReduceVar, ReduceMean), matcher.lower, LayerNorm)


# -- saving the statistics ---------------------------------------------------------------------------


def saved_statistics(variants: tuple[Variant, ...]) -> list[Item]:
    """The statistics the gradients read that forward computes anyway: those of a layer norm that
    every variant's outputs compute (Note [layer norm statistics])."""
    wanted = {
        item
        for v in variants
        for g in v.gradients
        for c in g.contributions
        for item in c.factor.atoms(Item)
        if item.detached
    }
    computed = [
        {LayerNormStats(n.args[0], n.args[3], n.args[4]) for _, e in v.inlined for n in e.atoms(LayerNorm)}
        for v in variants
    ]
    return sorted((i for i in wanted if all(i.args[0] in c for c in computed)), key=sympy.default_sort_key)


def residual_name(item: Item) -> str:
    return "saved_mean" if int(item.args[1]) == 1 else "saved_rstd"


# -- the reciprocal root of a reduction (RMS norm) -------------------------------------------------


def _rstd_base(expr: Expr, tensors: frozenset[sympy.Symbol]) -> Expr | None:
    """`mean(h, dims, keepdim=true) + eps` when `expr` is its `**(-1/2)`, eps free of tensors."""
    if not isinstance(expr, sympy.Pow) or expr.exp != -S.Half or not isinstance(expr.base, sympy.Add):
        return None
    means = [t for t in expr.base.args if isinstance(t, ReduceMean) and t.keepdim and not t.every_dim]
    eps = expr.base - means[0] if len(means) == 1 else None
    if eps is None or eps.free_symbols & tensors or eps.has(TensorOp):
        return None
    return expr.base


def saved_rstds(variants: tuple[Variant, ...], tensors: frozenset[sympy.Symbol]) -> list[Rstd]:
    """Note [saved rstd]
    ~~~~~~~~~~~~~~~~~~~~
    `(mean(h, dims, keepdim=true) + eps)**(-1/2)` (an RMS norm's 1/rms, `[..., 1]`) that every
    variant's outputs compute and some gradient reads costs a pass over `h` to recompute: forward
    keeps it as a hidden output `saved_rstd` and backward reads the half-integer powers of the base
    from it (`base**e` -> `saved_rstd**(-2e)`), the only ones that are the root's powers for every sign
    of the base: where it is negative both are NaN, where it is 0 both 0 or inf; an integer power
    (the bare base, `1/base`) stays a formula, right where the base is negative.
    Autograd does not differentiate it (a `detached` statistic): where backward is itself differentiated
    (`create_graph`, torch.func transforms) it recomputes `saved_rstd` from the inputs first, so
    that double backward sees how it depends on them, at no cost to a first-order backward.
    """
    found = [
        {p for _, e in v.inlined for p in e.atoms(sympy.Pow) if _rstd_base(p, tensors) is not None} for v in variants
    ]
    common = set.intersection(*found) if found else set()
    read = {p for p in common for v in variants for g in v.gradients for c in g.contributions if c.factor.has(p.base)}
    return [Rstd(p.base) for p in sorted(read, key=sympy.default_sort_key)]


def read_rstd(expr: Expr, rstd: Rstd, saved: sympy.Symbol) -> Expr:
    """`expr` with each power of the base of `rstd` read from `saved` (Note [saved rstd]); `saved` positive."""
    base = rstd.args[0]

    def half(e: Expr) -> bool:
        return isinstance(e, sympy.Pow) and e.base == base and (2 * e.exp).is_odd is True

    return expr.replace(half, lambda e: saved ** (-2 * e.exp))
