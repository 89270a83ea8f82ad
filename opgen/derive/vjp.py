"""Reverse-mode gradients of formulas with tensor operations (`@`, `.T`, reductions).

Receives an output formula (SymPy, inputs only), the symbol of its incoming gradient and an
input symbol; returns the input's gradient as one expression in the incoming gradient. The
elementwise stretches between tensor operations are differentiated by `sympy.diff`; each
tensor operation passes the gradient on by an exact rule (the approach of PyTorch's
`derivatives.yaml`), so the result is the code a careful person writes: `grad @ weight`,
`grad.T @ input`, `grad.sum(0)`, never a Jacobian.

Note [carried batch dimensions]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A gradient that reaches a node (or the input) with dimensions the node lacks (it was broadcast
against something bigger) is summed back to the node's shape on arrival: named dimensions in
front of the node's own, and dimensions the node keeps as size 1 (`keepdim=true`). Only batch
dimensions `...` may be carried further: every rule is linear in the gradient and acts on the
trailing dimensions (dims are counted from the end), and every gradient carries the output's
whole batch, so summing the batch once at the input (`sum_to_size`, at run time, when inputs
of different batch shapes were broadcast) gives the same result.

Note [narrow gradients]
~~~~~~~~~~~~~~~~~~~~~~~
A gradient may reach a node with size 1 where the node has a full dimension: through a
`keepdim=true` reduction (`mean(a @ b, dim=1, keepdim=true)`), or a reduction's `unsqueeze`.
Elementwise rules broadcast it as torch would. `@` cannot: its gradient `g @ b.T` contracts
`g`'s last dimension with `b`'s. A gradient constant along the last dimension M of `a @ b` is
`g` of shape [N, 1] repeated, and `g.expand(N, M) @ b.T == g @ b.sum(-1, keepdim=True).T`;
constant along N, `a.T @ g.expand(N, M) == a.sum(-2, keepdim=True).T @ g`: no expand, no
sizes, and less work. What stays constant stays size 1 (`a`'s gradient [1, K] from a `g` of
[1, M], `b`'s [K, 1] from [N, 1]) and broadcasts onward. PyTorch's softmax backward kernels
want the full shape too, so a narrow gradient through a softmax takes its formula instead. A
gradient with fewer than two dimensions (the scalar of `sum(a @ b)`) is first unsqueezed to size 1
in front, so that `@` and `.T` see a matrix.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn
from opgen.formula import slicing
from opgen.formula.dims import broadcast_shape
from opgen.formula.tensor import (
    BroadcastTo,
    LogSoftmax,
    LogSoftmaxBackward,
    MatMul,
    ReduceAmax,
    ReduceLogSumExp,
    ReduceMean,
    ReduceNorm,
    ReduceSum,
    ReduceVar,
    ReductionBase,
    RowsOuter,
    Shape,
    ShapeError,
    Softmax,
    SoftmaxBackward,
    SumDims,
    SumTo,
    TensorOp,
    Transpose,
    Unsqueeze,
    dim_size,
    shape_of,
    split,
    top_tensor_ops,
)
from opgen.formula.whole_reductions import (
    broadcast_count,
    reduction_count,
    spread_to_operand,
    whole_reduction_of_plain,
)
from opgen.nodes.base import Lowered, OneOperand
from opgen.records import LeafFit

Clean = Callable[[Expr], Expr]


class _Vjp:
    """Reverse mode over the tensor operations of formulas, for one input `x`.

    A tensor operation that several paths reach (a `let` used twice) first collects all of its
    incoming gradient and then applies its rule once: `(g1 + g2) @ k`, not `g1 @ k + g2 @ k`.
    """

    def __init__(self, table: dict[sympy.Symbol, Shape], clean: Clean, x: sympy.Symbol) -> None:
        self.table = table
        self.clean = clean
        self.x = x
        self.pending: dict[Expr, Expr] = {}  # tensor operation -> gradient collected so far
        self.total: Expr = S.Zero  # the gradient of x (its batch dimensions maybe broadcast)
        self.pieces = False  # fit each part of a plain Tensor's gradient to its shape (Note [counts of unknown shapes])

    def shape(self, expr: sympy.Basic) -> Shape:
        return shape_of(expr, self.table)

    def run(self) -> Expr:
        """Apply the rules, each node after every node that contains it."""
        while self.pending:
            ready = [n for n in self.pending if not any(o is not n and o.has(n) for o in self.pending)]
            node = min(ready, key=sympy.default_sort_key)
            self.rule(node, self.pending.pop(node))
        return self.total

    def push(self, expr: Expr, grad: Expr) -> None:
        """Pass `grad`, the gradient of `sum(grad * expr)`, on towards `x`."""
        x = self.x
        if x not in expr.free_symbols or grad == 0:
            return
        if expr == x:
            self.total += self.fit(grad, expr)
            return
        if isinstance(expr, TensorOp):
            self.pending[expr] = self.pending.get(expr, S.Zero) + self.fit(grad, expr)
            return
        leaves = sorted(top_tensor_ops(expr, x), key=sympy.default_sort_key)
        dummies = {leaf: sympy.Dummy(f"leaf{k}", real=True) for k, leaf in enumerate(leaves)}
        back = {d: leaf for leaf, d in dummies.items()}
        flat = expr.xreplace(dummies)
        direct = self.clean(fn.real_diff(flat, x)).xreplace(back)
        if direct != 0:
            self.total += self.fit(self.spread(grad * direct, expr, x), x)
        for leaf, dummy in dummies.items():
            factor = self.clean(fn.real_diff(flat, dummy)).xreplace(back)
            if factor != 0:
                self.push(leaf, self.spread(grad * factor, expr, leaf))

    def spread(self, grad: Expr, expr: Expr, part: Expr) -> Expr:
        """`grad`, the gradient of elementwise `expr`, as the gradient of its `part`: times the size of
        each dimension that `expr` has and both lack (Note [narrow gradients])."""
        have, full, want = self.shape(grad), self.shape(expr), self.shape(part)
        if have == () and want == () and (full is None or split(full)[0]):
            # A scalar part of a broadcast of plain Tensors or of a batch: counted once per entry.
            count = broadcast_count(expr, self.table)
            if count is not None:
                return grad * count
        if have is None or full is None or want is None:
            return grad  # a plain Tensor: no tensor operation meets it
        (have_batch, have_dims), (full_batch, full_dims), (want_batch, want_dims) = (
            split(have),
            split(full),
            split(want),
        )
        if full_batch and not have_batch and not want_batch:
            raise ShapeError("a gradient constant along the batch dimensions `...` meets an input without them")
        factor: Expr = S.One
        for k in range(1, len(full_dims) + 1):
            if full_dims[-k] != 1 and all(k > len(dims) or dims[-k] == 1 for dims in (have_dims, want_dims)):
                factor *= dim_size(str(full_dims[-k]))
        return grad * factor

    def fit(self, grad: Expr, node: Expr) -> Expr:
        """`grad` summed over the dimensions `node` does not have (Note [carried batch dimensions])."""
        have, want = self.shape(grad), self.shape(node)
        if want is None and node == self.x:
            if not self.pieces:
                return grad  # a plain Tensor input: summed to its shape at run time
            # Note [counts of unknown shapes]: each part is fitted to the input's shape on its own.
            shape = broadcast_shape((node.name,))
            return BroadcastTo(grad, shape) if have == () else SumTo(grad, shape)
        if want == () and have is None:  # a scalar (a whole reduction) met by a gradient of plain Tensors
            return ReduceSum(grad, sympy.Tuple(), S.Zero)
        if have is None or want is None:
            raise ShapeError(
                "a tensor operation meets an input of unknown shape; declare its dimensions, e.g. Tensor[..., N]"
            )
        have_batch, have_dims = split(have)
        if want == () and have_batch:  # a number (a whole reduction, a `Tensor[]`) met by a batched gradient:
            # summed whole here; added first to parts without the batch, they counted once per batch entry
            return ReduceSum(grad, sympy.Tuple(), S.Zero)
        want_dims = split(want)[1]
        keep = _kept_dims(have_dims, want_dims)
        if keep:
            grad = SumDims(grad, sympy.Tuple(*keep), S.One)
        extra = len(have_dims) - len(want_dims)
        if extra > 0:
            # Named dimensions in front of the node's own: by position when they lead, else from the end.
            dims = range(extra) if not have_batch else range(-len(have_dims), -len(want_dims))
            grad = SumDims(grad, sympy.Tuple(*dims), S.Zero)
        if have_batch and not split(want)[0] and node == self.x:
            # An input without `...` met by a gradient with it: summed to the input's shape on its own, as it
            # reaches it; summed after the parts without the batch were added, they counted once per batch entry.
            narrow = self.narrow(grad, node)  # `[..., 1, H]` for `[D, H]`: summed to `(1, H)`, then expanded
            flags = [sympy.Integer(-k in narrow) for k in range(len(want), 0, -1)]
            return SumTo(grad, broadcast_shape((node.name,)), *([sympy.Tuple(*flags)] if narrow else []))
        return grad

    def rule(self, node: Expr, grad: Expr) -> None:
        if isinstance(node, Lowered):  # its own rule; a narrower gradient through its formula (Note [narrow gradients])
            pushes = [(node.elementary(), grad)] if self.narrow(grad, node) else node.vjp_pushes(grad)
            for part, part_grad in pushes:
                self.push(part, part_grad)
            return
        if isinstance(node, OneOperand):  # its own rule (a diagonal: opgen.nodes.diagonal; cumprod)
            self.push(node.operand, node.vjp_operand(grad, self.table))
            return
        if isinstance(node, (MatMul, Transpose)):
            grad = self.as_matrix(grad, node)
        if isinstance(node, MatMul):
            a, b = node.args
            # Note [narrow gradients]: a gradient constant along M or N meets the other side summed.
            narrow = self.narrow(grad, node)
            self.push(a, MatMul(grad, Transpose(ReduceSum(b, S.NegativeOne, S.One) if -1 in narrow else b)))
            if len(split(self.shape(a) or ())[1]) == 1:  # Note [vector @ matrix]
                self.push(b, RowsOuter(a, grad))
                return
            self.push(b, MatMul(Transpose(ReduceSum(a, sympy.Integer(-2), S.One) if -2 in narrow else a), grad))
            return
        if isinstance(node, Transpose):
            self.push(node.args[0], Transpose(grad))
            return
        if isinstance(node, Unsqueeze):
            # The new dimension has size 1 in `grad` (fitted to the node), or `grad` stops before it.
            have = self.shape(grad)
            assert have is not None
            self.push(node.args[0], _squeeze(grad, int(node.args[1])) if len(split(have)[1]) >= -node.args[1] else grad)
            return
        if isinstance(node, slicing.Slice):
            # The part's gradient put back in place among zeros; a narrow one is expanded by `Pad`.
            self.push(node.args[0], slicing.pad(grad, self.shape(grad), node.cut))
            return
        if isinstance(node, slicing.Pad):
            # A gradient constant along the dimension (narrow) is the same on the part: it broadcasts as it is.
            dim = node.cut.dim
            part = slicing.make(slicing.Slice, grad, node.cut)
            self.push(node.args[0], part if slicing.reaches(self.shape(grad), dim) else grad)
            return
        if isinstance(node, (Softmax, LogSoftmax)):
            a, dim = node.args
            backward = (SoftmaxBackward if isinstance(node, Softmax) else LogSoftmaxBackward)(grad, node, dim)
            narrow = self.narrow(grad, node)
            if isinstance(node, LogSoftmax) and int(dim) in narrow:
                # `sum(g, dim, keepdim=true)` of a `g` constant along `dim` (the scalar of `sum(log_softmax(a))`)
                # is `g` times the size of `dim`: a sum over a dimension `g` lacks fails, over its size 1 undercounts.
                size = dim_size(str(split(self.shape(node) or ())[1][int(dim)]))
                self.push(a, grad - sympy.exp(node) * grad * size)
                return
            # PyTorch's backward kernels want the gradient in the output's full shape.
            self.push(a, backward.elementary() if narrow else backward)
            return
        assert isinstance(node, ReductionBase), type(node)
        self.reduction_rule(node, grad)

    def reduction_rule(self, node: ReductionBase, grad: Expr) -> None:
        """The gradient of a reduction: spread back over the reduced dimensions, times the local factor."""
        a, dims = node.operand, node.args[1]
        full = spread_to_operand(self.restore(grad, node), node, self.table)
        kept = self.restore(node, node)  # the reduced value at size 1: the op's saved output when it is one
        if isinstance(node, ReduceSum):
            self.push(a, full)
        elif isinstance(node, ReduceMean):
            self.push(a, full / self.count(a, node))
        elif isinstance(node, ReduceLogSumExp):
            self.push(a, full * sympy.exp(a - kept))
        elif isinstance(node, ReduceAmax):
            # PyTorch's amax gradient: shared evenly among the entries that tie for the maximum.
            mask = fn.indicator(sympy.Eq(a, kept, evaluate=False))
            self.push(a, full * mask / ReduceSum(mask, dims, S.Zero if node.every_dim else S.One))
        elif isinstance(node, ReduceNorm):
            # PyTorch's norm gradient: `a / norm`, and 0 where the norm is 0 (Note [norm at zero] in opgen.derive.jvp);
            # the mask and the quotient on the reduced gradient, then one product with the operand.
            zero = sympy.Eq(kept, 0, evaluate=False)
            self.push(a, fn.where(zero, S.Zero, full / fn.where(zero, S.One, kept)) * a)
        elif isinstance(node, ReduceVar):
            centered = a - ReduceMean(a, dims, S.Zero if node.every_dim else S.One)
            self.push(a, full * 2 * centered / (self.count(a, node) - node.correction))
        else:
            raise AssertionError(type(node))

    def restore(self, value: Expr, node: ReductionBase) -> Expr:
        """`value` (the node, or a gradient that may carry batch dimensions) with the reduced dims back at size 1.

        Over every dimension of a batch the node is one number for the whole batch, so a gradient is summed
        to a scalar first (Note [reductions over every dimension]).
        """
        if node.keepdim or self.shape(value) == ():  # a scalar broadcasts as it is
            return value
        if node.every_dim:
            return ReduceSum(value, sympy.Tuple(), S.Zero)
        for dim in sorted(node.dims, reverse=True):  # the last first: each index counts from the end
            value = Unsqueeze(value, sympy.Integer(dim))
        return value

    def count(self, a: Expr, node: ReductionBase) -> Expr:
        return reduction_count(node, self.table)

    def as_matrix(self, grad: Expr, node: Expr) -> Expr:
        """`grad` with leading dimensions of size 1 up to the rank of `node` (a matrix, or the vector of
        `x @ w`): a gradient constant along its rows or along all of it (`sum(a @ b)` passes a scalar)
        before `@` or `.T` (Note [narrow gradients])."""
        have, want = self.shape(grad), self.shape(node)
        named = len(split(have)[1]) if have is not None else 2
        for k in range(named, min(2, len(split(want or ())[1]))):
            grad = Unsqueeze(grad, sympy.Integer(-k - 1))
        return grad

    def narrow(self, grad: Expr, node: Expr) -> tuple[int, ...]:
        """The trailing dims (from the end) where `grad` is 1 or missing and `node` is not (Note [narrow gradients])."""
        have, want = self.shape(grad), self.shape(node)
        assert have is not None and want is not None
        have_dims, want_dims = split(have)[1], split(want)[1]
        return tuple(
            -k
            for k in range(len(want_dims), 0, -1)
            if want_dims[-k] != 1 and (k > len(have_dims) or have_dims[-k] == 1)
        )


def _squeeze(grad: Expr, dim: int) -> Expr:
    """`grad` without its size-1 dimension `dim` (from the end): a sum over it; when `fit` summed
    down to that size 1, that sum drops the dimension instead of keeping it."""
    if isinstance(grad, SumDims) and grad.args[2] and dim in grad.args[1]:
        inner, dims = grad.args[0], [int(d) for d in grad.args[1]]
        rest = [d + 1 if d < dim else d for d in dims if d != dim]  # counted from the end, one dimension fewer
        squeezed = ReduceSum(inner, sympy.Integer(dim), S.Zero)
        return SumDims(squeezed, sympy.Tuple(*rest), S.One) if rest else squeezed
    return ReduceSum(grad, sympy.Integer(dim), S.Zero)


def _kept_dims(have: tuple, want: tuple) -> tuple[int, ...]:
    """Dims (from the end) that `want` has as 1 and `have` in full: summed with keepdim."""
    return tuple(-k for k in range(len(want), 0, -1) if want[-k] == 1 and k <= len(have) and have[-k] != 1)


def tensor_gradient(
    outputs: list[tuple[Expr, sympy.Symbol]], x: sympy.Symbol, table: dict[sympy.Symbol, Shape], clean: Clean
) -> Expr:
    """The gradient of every `(formula, incoming gradient)` pair with respect to `x`, summed."""
    engine = _Vjp(table, clean, x)
    engine.pieces = table.get(x, ()) is None and any(whole_reduction_of_plain(expr, table) for expr, _ in outputs)
    for expr, grad in outputs:
        engine.push(expr, grad)
    total = engine.run()
    own = broadcast_shape((x.name,))
    fitted = [t.as_coeff_Mul()[1] for t in sympy.Add.make_args(total)]
    if table.get(x) is not None and all(isinstance(t, SumTo) and t.args[1] == own for t in fitted):
        # every part has the batch: summed once at run time, as the input's other gradients (`fit`)
        total = total.xreplace({t: t.args[0] for t in fitted})
    return total


def leaf_fit(grad: Expr, x: sympy.Symbol, table: dict[sympy.Symbol, Shape], batch_inputs: int) -> LeafFit:
    """What is left at run time to give `grad` (already summed to `x`'s named dimensions) `x`'s shape.

    `batch_inputs` is how many inputs have batch dimensions `...`: with more than one, the
    batch of the gradient may be bigger than `x`'s own.
    """
    have, want = shape_of(grad, table), table[x]
    own = broadcast_shape((x.name,))
    parts = [term.as_coeff_Mul()[1] for term in sympy.Add.make_args(grad)]
    if grad != 0 and all(isinstance(p, (SumTo, BroadcastTo)) and p.args[1] == own for p in parts):
        return LeafFit(False, False)  # every part is fitted to x already (Note [counts of unknown shapes])
    if grad == 0 or want is None or have is None:  # a scalar gradient of a plain Tensor is expanded to it
        return LeafFit(want is None and have == (), have is None or want is None)
    have_batch, have_dims = split(have)
    want_batch, want_dims = split(want)
    expand = (want_batch and not have_batch) or any(
        want_dims[-k] != 1 and (k > len(have_dims) or have_dims[-k] == 1) for k in range(1, len(want_dims) + 1)
    )
    return LeafFit(expand, have_batch and (not want_batch or batch_inputs > 1))


def substitute_outputs(expr: Expr, outputs: list[tuple[sympy.Symbol, Expr]]) -> Expr:
    """Use a saved output where the gradient recomputes its formula (softmax, log-softmax, logsumexp)."""
    replacements = {
        formula: symbol
        for symbol, formula in outputs
        if not formula.is_Symbol and formula.atoms(TensorOp) and formula != 0
    }
    if not replacements:
        return expr
    # Note [ties with the maximum]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # amax's gradient goes to the entries equal to the maximum, `a == amax(a)`, with `a` recomputed by
    # backward. Forward may compute `a` otherwise, to the last bit: a constant let as `math.pow(25.05,
    # 2.7 * math.erf(l0))` there, its float64 value here. Against the saved output no entry would tie,
    # and the gradient would be 0 / 0: the maximum in a tie mask stays recomputed from the same `a`
    # (here and in opgen.optimize.save), as plain autograd compares its own two tensors.
    ties = {c: sympy.Dummy() for c in expr.atoms(sympy.Eq) if isinstance(c.rhs, ReduceAmax) and c.lhs == c.rhs.operand}
    # `exp(x - lse)` of log-softmax becomes `exp(y)`: the saved output, not x and a recomputation.
    return expr.xreplace(ties).xreplace(replacements).xreplace({d: c for c, d in ties.items()})
