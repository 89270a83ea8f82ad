"""Forward mode: the JVP of every output, derived beside the gradients.

Receives `Derived` (after the gradient rewrites and the save stage) and the hidden outputs
(residuals) the Function returns; returns `Tangents`: for each variant, each returned output's
tangent as a sum of terms, one per Tensor input, each the directional derivative of the output
along that input's tangent symbol. Elementwise formulas reuse the gradient factors
(`d out / d in` times the tangent: the same rewrites, the same kink conventions as backward);
formulas with tensor operations go through exact forward rules (`_Jvp`); gradient overrides
give the transpose-consistent JVP (Note [jvp of an override] in opgen.derive.override_jvp).

Note [tangents after save]
~~~~~~~~~~~~~~~~~~~~~~~~~~
The tangents are derived after the save stage, not with the gradients: an elementwise tangent
(and an override's) is the gradient factor as backward finally computes it -- rewritten, then
reading the outputs and residuals that save chose (`y` for `sigmoid(x)`, `x - y` for `tanh(x)`,
`saved_tanh`) -- times the tangent, so that `jvp` reads what `setup_context` keeps for backward
anyway, and the residuals' own tangents need the residuals. The stable rewrites then run once
more over the products (`opgen.optimize.passes.optimize_tangents`), which changes some of them
(snake's `x*sin(2*a*x)/a * t` becomes a `sinc`). Tangents derived before save would need save
to substitute into rewritten products, where a substitution of a whole factor no longer matches.

Note [broadcast tangents]
~~~~~~~~~~~~~~~~~~~~~~~~~
A tangent is as big as the input it belongs to, so where the formula broadcasts that input
(`x @ w + b` with `b: Tensor[M]`, `sum(x + s, dim=0)` with `s: Tensor[K]`) the tangent that
reaches the next tensor operation is smaller than its operand: it stands for the tangent
expanded. Each rule takes it so without expanding it: missing leading dimensions become size-1
ones (`.unsqueeze`) where the operation needs them (`@`, `.T`, the reduced dimension), and a
dimension the tangent is constant along is handled by the rule's algebra: `sum` over it is its
size times the tangent, `mean` over it is the tangent, `@` contracting it meets the other operand
summed over it (`t @ sum(b, dim=-2, keepdim=true)`, as backward does in Note [narrow gradients]).
Everything else broadcasts as the forward does.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy
from sympy import Expr, S

from opgen.derive.gradients import Derived, Gradient, Variant, clean
from opgen.derive.guard import guard_branches, settle_indicators
from opgen.derive.override_jvp import Refused, override_terms
from opgen.derive.vjp import substitute_outputs
from opgen.errors import Loc, located
from opgen.formula import functions as fn
from opgen.formula import slicing
from opgen.formula.tensor import (
    BATCH,
    LogSoftmax,
    MatMul,
    ReduceAmax,
    ReduceLogSumExp,
    ReduceMean,
    ReduceNorm,
    ReduceSum,
    ReduceVar,
    ReductionBase,
    Shape,
    ShapeError,
    Softmax,
    SoftmaxBackward,
    TensorOp,
    Transpose,
    Unsqueeze,
    dim_size,
    shape_of,
    split,
    top_tensor_ops,
)
from opgen.formula.whole_reductions import reduction_count
from opgen.nodes.base import Lowered, Node, OneOperand
from opgen.records import OutputTangent, Tangents, Term, VariantTangents

__all__ = ["OutputTangent", "Tangents", "Term", "VariantTangents", "derive_jvp", "tangent_symbol"]


def tangent_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol("tangent:" + name, real=True)


class _Jvp:
    """Forward mode over the tensor operations of a formula, along the tangent `t` of input `x`."""

    def __init__(self, table: dict[sympy.Symbol, Shape], clean: Callable[[Expr], Expr], x: sympy.Symbol) -> None:
        self.table = table
        self.clean = clean
        self.x = x
        self.t = tangent_symbol(x.name)
        self.table[self.t] = table.get(x)
        self.memo: dict[Expr, Expr] = {}

    def tangent(self, expr: Expr) -> Expr:
        if self.x not in expr.free_symbols:
            return S.Zero
        if expr == self.x:
            return self.t
        if expr not in self.memo:
            self.memo[expr] = self.rule(expr) if isinstance(expr, TensorOp) else self.elementwise(expr)
        return self.memo[expr]

    def elementwise(self, expr: Expr) -> Expr:
        """Between tensor operations: `sympy.diff` with every tensor operation a leaf."""
        leaves = sorted(top_tensor_ops(expr, self.x), key=sympy.default_sort_key)
        dummies = {leaf: sympy.Dummy(f"leaf{k}", real=True) for k, leaf in enumerate(leaves)}
        back = {d: leaf for leaf, d in dummies.items()}
        flat = expr.xreplace(dummies)
        total = self.clean(fn.real_diff(flat, self.x)).xreplace(back) * self.t
        for leaf, dummy in dummies.items():
            factor = self.clean(fn.real_diff(flat, dummy)).xreplace(back)
            if factor != 0:
                total += factor * self.tangent(leaf)
        return total

    def operand(self, a: Expr, rank: int = 0) -> tuple[Expr, tuple[int, ...]]:
        """The tangent of an operand of a tensor operation, with at least `rank` dimensions after any
        batch (size-1 ones put in front), and the dims (from the end) where it is 1 and the operand is
        not: it was broadcast (`s` in `amax(a @ w + s)`; Note [broadcast tangents])."""
        ta = self.tangent(a)
        if ta == 0:
            return ta, ()
        have, want = shape_of(ta, self.table), shape_of(a, self.table)
        assert have is not None and want is not None  # tensor operations need declared dimensions
        have_dims, want_dims = split(have)[1], split(want)[1]
        for k in range(len(have_dims), rank):
            ta = Unsqueeze(ta, sympy.Integer(-k - 1))
        narrow = tuple(
            -k
            for k in range(len(want_dims), 0, -1)
            if want_dims[-k] != 1 and (k > len(have_dims) or have_dims[-k] == 1)
        )
        return ta, narrow

    def size(self, a: Expr, dim: int) -> Expr:
        entry = (shape_of(a, self.table) or ())[dim]
        if entry == BATCH:  # reductions never reach into `...` (opgen.formula.tensor.reduce_dim)
            raise ShapeError("a reduction over a batch dimension `...` has no size to scale a tangent by")
        return S.One if entry == 1 else dim_size(str(entry))

    def rule(self, node: Expr) -> Expr:
        if isinstance(node, Lowered):  # a lowered node (a layer norm): the tangent of its formula
            return self.tangent(node.elementary())
        if isinstance(node, OneOperand):  # its own rule (a diagonal: opgen.nodes.diagonal; cumprod)
            ta = self.tangent(node.operand)
            return node.tangent_of(ta, self.table) if ta != 0 else S.Zero
        if isinstance(node, MatMul):
            # Note [broadcast tangents]: a tangent constant along the contracted dimension meets the other
            # operand summed over it, as a gradient does in backward (Note [narrow gradients]).
            a, b = node.args
            # A tangent keeps its operand's rank (at most 2): a vector `[..., K]` stays one, as `@` takes it.
            rank_a, rank_b = (min(2, len(split(shape_of(o, self.table) or ())[1])) for o in (a, b))
            (ta, narrow_a), (tb, narrow_b) = self.operand(a, rank_a), self.operand(b, rank_b)
            left = MatMul(ta, ReduceSum(b, sympy.Integer(-2), S.One) if -1 in narrow_a else b) if ta != 0 else S.Zero
            right = MatMul(ReduceSum(a, S.NegativeOne, S.One) if -2 in narrow_b else a, tb) if tb != 0 else S.Zero
            return left + right
        if isinstance(node, Transpose):
            ta = self.operand(node.args[0], 2)[0]
            return Transpose(ta) if ta != 0 else S.Zero
        if isinstance(node, Unsqueeze):
            ta, dim = self.tangent(node.args[0]), node.args[1]
            if ta == 0:
                return S.Zero
            # A tangent that stops before the new dimension (broadcast) broadcasts the same way unsqueezed.
            have = shape_of(ta, self.table)
            return Unsqueeze(ta, dim) if have is not None and len(split(have)[1]) >= -int(dim) - 1 else ta
        if isinstance(node, (slicing.Slice, slicing.Pad)):
            return self.part(node)
        if isinstance(node, (Softmax, LogSoftmax)):
            a, dim = node.args
            ta = self.tangent(a)
            if ta == 0:
                return S.Zero
            broadcast = shape_of(ta, self.table) != shape_of(a, self.table)
            if isinstance(node, LogSoftmax):
                return ta - ReduceSum(ta * sympy.exp(node), dim, S.One)
            # PyTorch's kernel wants the tangent in the operand's whole shape; the formula broadcasts it.
            return node * (ta - ReduceSum(ta * node, dim, S.One)) if broadcast else SoftmaxBackward(ta, node, dim)
        assert isinstance(node, ReductionBase), type(node)
        a, dims, keep = node.operand, node.args[1], node.args[2]
        if isinstance(node, (ReduceSum, ReduceMean)):
            return self.linear_reduction(node)
        ta = self.tangent(a)  # the formulas below broadcast a narrower tangent themselves
        if ta == 0:
            return S.Zero
        kept = self.kept(node)
        if isinstance(node, ReduceLogSumExp):
            weights = Softmax(a, dims) if len(node.dims) == 1 else sympy.exp(a - kept)
            return ReduceSum(ta * weights, dims, keep)
        if isinstance(node, ReduceNorm):
            return _norm_tangent(node, ReduceSum(a * ta, dims, keep))
        if isinstance(node, ReduceVar):
            count = reduction_count(node, self.table)
            centered = a - ReduceMean(a, dims, S.Zero if node.every_dim else S.One)
            return 2 * ReduceSum(centered * ta, dims, keep) / (count - node.correction)
        assert isinstance(node, ReduceAmax), type(node)
        # PyTorch's amax JVP: the mean of the tangent over the entries that tie for the maximum.
        mask = fn.indicator(sympy.Eq(a, kept, evaluate=False))
        return ReduceSum(ta * mask, dims, keep) / ReduceSum(mask, dims, keep)

    def part(self, node: slicing.Slice | slicing.Pad) -> Expr:
        """A part's tangent is the part of the tangent, a padded gradient's the padded tangent; a tangent
        constant along the dimension (broadcast) is its own part, and `Pad` expands it."""
        ta, cut = self.tangent(node.args[0]), node.cut
        have = shape_of(ta, self.table)
        if ta == 0:
            return S.Zero
        if isinstance(node, slicing.Slice):
            return slicing.make(slicing.Slice, ta, cut) if slicing.reaches(have, cut.dim) else ta
        return slicing.pad(ta, have, cut)

    def linear_reduction(self, node: ReductionBase) -> Expr:
        """`sum`/`mean` of the tangent; where the tangent was broadcast along a summed dim (Note
        [broadcast tangents]), the sum of its one entry there times the dim's size."""
        a, dims, keep = node.operand, node.args[1], node.args[2]
        if shape_of(a, self.table) is None:  # every dimension of plain Tensors, whose shapes are not known here
            # The mean of a tangent broadcast to the operand is the tangent's own mean; a sum is that times the count.
            ta = self.tangent(a)
            mean = ReduceMean(ta, dims, keep) if ta != 0 else S.Zero
            return mean if isinstance(node, ReduceMean) else mean * reduction_count(node, self.table)
        ta, narrow = self.operand(a, max((-d for d in node.dims), default=0))
        if ta == 0:
            return S.Zero
        if node.every_dim and narrow:
            raise ShapeError(f"{node.spec_name}() over every dimension of an input broadcast along some of them")
        value = type(node)(ta, dims, keep)
        if isinstance(node, ReduceMean):
            return value  # the mean of a broadcast tangent is the tangent
        scale = sympy.Mul(*(self.size(a, d) for d in node.dims if d in narrow))
        return value * scale

    def kept(self, node: ReductionBase) -> Expr:
        """The reduced value with the reduced dims back at size 1 (a scalar stays one)."""
        if node.keepdim or shape_of(node, self.table) == ():
            return node
        value: Expr = node
        for dim in sorted(node.dims, reverse=True):
            value = Unsqueeze(value, sympy.Integer(dim))
        return value


def _cleaner(loc: Loc, what: str) -> Callable[[Expr], Expr]:
    return lambda e: clean(settle_indicators(e), loc, what)


def _output_terms(
    derived: Derived, variant: Variant, gradient: Gradient, table: dict[sympy.Symbol, Shape]
) -> dict[str, Expr]:
    """The tangent term of every differentiable output along input `gradient.input`."""
    spec, symbols = derived.spec, derived.symbols
    names = [o.name for o in spec.outputs if o.differentiable]
    t = tangent_symbol(gradient.input)
    if gradient.overridden:
        return {name: h * t for name, h in override_terms(derived, gradient, names).items()}
    if gradient.fit is None:  # elementwise: the gradient factors are d out / d in
        terms: dict[str, Expr] = {}
        for c in gradient.contributions:
            if c.output in names:
                terms[c.output] = terms.get(c.output, S.Zero) + c.factor * t
        return terms
    inlined = dict(variant.inlined)
    outputs = [(symbols.outputs[o.name], inlined[o.name]) for o in spec.outputs]
    x = symbols.inputs[gradient.input]
    loc = spec.outputs[0].formula.loc
    found = {}
    for name in names:
        what = f"forward-mode derivative of '{name}' along '{gradient.input}'"
        refused = None
        with located(loc, what):
            engine = _Jvp(dict(table), _cleaner(loc, what), x)
            try:
                value = engine.tangent(guard_branches(inlined[name], symbols.tensors))
            except (ShapeError, Refused) as error:
                refused = str(error)
        if refused is not None:
            raise Refused(refused)
        value = substitute_outputs(value, outputs)
        if value != 0:
            found[name] = value
    return found


def _detached(expr: Expr) -> bool:
    """A statistic autograd does not differentiate (Note [layer norm statistics] in opgen.nodes.layer_norm), or a
    condition, which has no tangent (Note [saved masks] in opgen.nodes.kernels)."""
    return isinstance(expr, Node) and expr.detached or isinstance(expr, sympy.core.relational.Relational)


def _variant_tangents(derived: Derived, variant: Variant, residuals: tuple[tuple[str, Expr], ...]) -> VariantTangents:
    spec, symbols = derived.spec, derived.symbols
    terms: dict[str, list[Term]] = {o.name: [] for o in spec.outputs if o.differentiable}
    terms |= {name: [] for name, expr in residuals if not _detached(expr)}
    refused = []
    for gradient in variant.gradients:
        try:
            found = _output_terms(derived, variant, gradient, dict(derived.shapes))
        except Refused as why:
            refused.append((gradient.input, str(why)))
            continue
        x, t = symbols.inputs[gradient.input], tangent_symbol(gradient.input)
        for name, expr in residuals:  # elementwise, or a tensor operation (opgen.optimize.save_tensors)
            if _detached(expr):
                continue  # a statistic autograd does not differentiate (opgen.nodes.layer_norm)
            if expr.has(TensorOp):
                found[name] = _Jvp(dict(derived.shapes), _cleaner(spec.loc, "residual"), x).tangent(expr)
                continue
            found[name] = clean(settle_indicators(fn.real_diff(expr, x)), spec.loc, "residual") * t
        for name, value in found.items():
            if value != 0:
                terms[name].append(Term(gradient.input, value))
    returned = [*(o.name for o in spec.outputs), *(name for name, _ in residuals)]
    outputs = tuple(OutputTangent(n, tuple(terms[n])) if n in terms else None for n in returned)
    return VariantTangents(variant.absent, outputs, tuple(refused))


def derive_jvp(derived: Derived, residuals: tuple[tuple[str, Expr], ...] = ()) -> Tangents:
    """The tangent of every returned output (the spec's, then `residuals`), for every variant of `derived`;
    `opgen.optimize.passes.optimize_tangents` then rewrites the terms as the spec allows."""
    tensors = [i.name for i in derived.spec.tensor_inputs]
    variants = tuple(_variant_tangents(derived, v, residuals) for v in derived.variants)
    return Tangents({n: tangent_symbol(n) for n in tensors}, variants)


def _norm_tangent(node: ReduceNorm, inner: Expr) -> Expr:
    """Note [norm at zero]
    ~~~~~~~~~~~~~~~~~~~~~
    The derivative of `norm(a)` is `a / norm(a)`, and 0 where the norm is 0, as PyTorch's. The
    division reads `where(norm == 0, 1, norm)`: the branch not taken gets a zero gradient when
    autograd differentiates our backward (or forward mode), and `0 / 0` there made the second
    derivative NaN where PyTorch's is 0 (`norm(relu(x))` at x < 0, where relu already masks it)."""
    zero = sympy.Eq(node, 0, evaluate=False)
    return fn.where(zero, S.Zero, inner / fn.where(zero, S.One, node))
