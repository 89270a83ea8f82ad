"""The newer forms of the formula language, for `fuzz_grammar.Builder`: PyTorch's names of functions
(`relu`, `silu`, `clip`, `maximum`, ...), reductions over every dimension (`mean(u)`,
`std(u, correction=0)`), over several dimensions (`dim=(0, 1)`), `var`/`std`/`norm`/`amin`,
`softmax`/`log_softmax` and parts of a named dimension (`x[..., :D // 2]`, `chunk(x, 2, dim=-1)[1]`),
each reduced along the dimension it cuts. Every form keeps the bounds and shapes of the grammar, so a
drawn formula stays finite, and `fuzz_ast.Evaluator` computes it with PyTorch's own functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fuzz_ast import Node
from fuzz_intervals import ALIAS_ARG

if TYPE_CHECKING:
    from fuzz_grammar import Builder

UNARY_ALIASES = (
    "relu", "relu6", "silu", "gelu", "softsign", "logsigmoid", "expit", "square", "cube", "neg", "absolute",
    "sgn", "exp2", "reciprocal", "log2", "log10", "logit", "arcsinh", "arctan",
)  # fmt: skip
BINARY_ALIASES = ("maximum", "minimum", "fmax", "fmin", "pow", "clip")
WHOLE = ("sum", "mean", "amax", "amin", "var", "std", "norm")
DIM_REDUCTIONS = ("sum", "mean", "amax", "amin", "logsumexp", "var", "std", "norm")


def alias(b: Builder, depth: int, target: Any, exact: bool) -> Node:
    """A function called by PyTorch's name, its arguments kept where it is finite."""
    from fuzz_grammar import make, num

    if b.chance(0.3):
        name = b.pick(BINARY_ALIASES)
        if name == "clip":
            lo = b.pick([-2, -1, 0, 0.5])
            return make("alias", (b.expr(depth, target, exact), num(lo), num(lo + b.pick([0.5, 1, 3]))), name)
        if name == "pow":
            base = b.within(b.expr(depth, target, exact), (0.1, 50.0))
            return make("alias", (base, b.within(b.expr(depth, target, False), (-3.0, 3.0))), name)
        x, y = b.expr(depth, target, exact), b.expr(depth, target, False)
        return make("alias", (x, y) if b.chance(0.5) else (y, x), name)
    name = b.pick(UNARY_ALIASES)
    u = b.expr(depth, target, exact)
    if name in ALIAS_ARG:
        u = b.within(u, ALIAS_ARG[name])
    return make("alias", (u,), name)


def whole(b: Builder, depth: int) -> Node:
    """A reduction over every dimension of a formula of tensors: a number-shaped tensor."""
    from fuzz_grammar import binop, make

    shapes = [None] if not b.dims() else sorted(b.reachable())
    operand = b.expr(depth, b.pick(shapes), False)
    if not operand.tensor:
        operand = binop(b.pick(["+", "*"]), operand, b.pick([n for n in b.leaves if n.tensor]))
    # With `...` the count of every dimension is unknown until the call: mean, var and std are refused there.
    names = WHOLE if not b.batched else ("sum", "amax", "amin", "norm")
    name = b.pick(names)
    if name in ("sum", "norm"):
        operand = b.within(operand, (-100.0, 100.0))
    correction = b.pick([None, 0, 1]) if name in ("var", "std") else None
    return make("whole", (operand,), (name, correction))


def softmax(b: Builder, depth: int, target: tuple[str, ...]) -> Node:
    from fuzz_grammar import make

    u = b.within(b.expr(depth, target, True), (-50.0, 50.0))
    axis = b.pick(range(len(target)))
    dim = axis - len(target) if b.batched or b.chance(0.5) else axis
    return make("softmax", (u,), (b.pick(["softmax", "log_softmax"]), dim))


def reduction(b: Builder, operand: Node, axis: int, keepdim: Any) -> Node:
    """A reduction along `axis` of `operand` (of exact shape), maybe of a part of that dimension."""
    from fuzz_grammar import make

    full = operand.shape
    assert full is not None
    parts = b.cuts.get(full[axis], ())
    name = b.pick(DIM_REDUCTIONS)
    if parts and b.chance(0.3):
        k = b.pick(parts)
        operand = make("cut", (operand,), (axis, k, b.pick(range(k)), b.chance(0.5), len(full), b.batched))
        if name in ("var", "std"):
            name = "mean"  # a part may have one entry: no unbiased variance
    if name in ("sum", "norm", "logsumexp"):
        operand = b.within(operand, (-100.0, 100.0))
    dim = axis - len(full) if b.batched or b.chance(0.5) else axis
    correction = b.pick([None, 0, 1]) if name in ("var", "std") else None
    return make("reduce", (operand,), (name, dim, keepdim, correction))


def reduce_two(b: Builder, depth: int, full: tuple[str, ...]) -> Node:
    """A two-dimensional formula reduced over both dimensions at once, `dim=(0, 1)`."""
    from fuzz_grammar import make

    operand = b.sub(depth, full)
    name = b.pick(DIM_REDUCTIONS)
    if name in ("sum", "norm", "logsumexp"):
        operand = b.within(operand, (-100.0, 100.0))
    dim = b.pick([(0, 1), (-2, -1), (1, 0), (0, -1)])
    correction = b.pick([None, 0, 1]) if name in ("var", "std") else None
    return make("reduce", (operand,), (name, dim, b.pick([None, False]), correction))
