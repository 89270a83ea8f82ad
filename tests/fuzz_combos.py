"""Combinations of the formula language for `fuzz_grammar.Builder`, where features meet: the forms
opgen rewrites into stable ones (`log(1 + exp(u))`, `log(exp(a) + exp(b))`, `log(sum(exp(u)))`,
`exp(u) / sum(exp(u))`, `u - log(sum(exp(u)))`, `a * log1p(b)`, `xlogy`), alone and under
reductions; clamps whose bounds are tensors (kernel lowerings to `F.hardtanh`, also with crossed
bounds); reductions of a tensor `let` shared by several outputs; and what a spec adds around the
formulas: `optimize: policy`, `rewrite: false`, `lower: false` and `form: custom_op`.
Every node keeps the grammar's bounds, so a drawn formula stays finite.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fuzz_ast import Node
from fuzz_nodes import binop, call, fits, make, num

if TYPE_CHECKING:
    from fuzz_grammar import Builder

EXTRA = (
    {},
    {"optimize": "{policy: memory}"},
    {"optimize": "{policy: speed}"},
    {"optimize": "{rewrite: false}"},
    {"optimize": "{lower: false}"},
    {"form": "custom_op"},
    {"form": "custom_op", "optimize": "{policy: memory}"},
)


def stable(b: Builder, depth: int, target: Any, exact: bool) -> Node:
    """A formula opgen replaces by an exact stable form before differentiating it."""
    u = b.within(b.expr(depth, target, exact), (-30.0, 30.0))
    v = b.within(b.expr(depth, target, False), (-30.0, 30.0))
    kind = b.pick(["softplus", "log1p_exp", "lse2", "xlog1py", "xlogy", "xlogy_self", "logsig", "reduced"])
    if kind == "softplus":
        return call("log", binop("+", num(1), call("exp", u)))
    if kind == "log1p_exp":
        return call("log1p", call("exp", u))
    if kind == "lse2":
        return call("log", binop("+", call("exp", u), call("exp", v)))
    if kind == "xlog1py":
        return binop("*", u, call("log1p", b.within(v, (-0.9, 30.0))))
    if kind == "xlogy":
        return call("xlogy", u, b.within(v, (0.05, 30.0)))
    if kind == "xlogy_self":  # p log p with p >= 0, 0 included (a sample may put p exactly at 0)
        p = make("alias", (u,), "relu") if b.chance(0.5) else call("abs", u)
        return call("xlogy", p, p)
    if kind == "logsig":
        return call("log", call("sigmoid", u))
    return reduced_stable(b, depth, target, exact) or call("log", binop("+", num(1), call("exp", u)))


def reduced_stable(b: Builder, depth: int, target: Any, exact: bool) -> Node | None:
    """`log(sum(exp(u), dim))`, softmax and log-softmax written out, along a dim of a shaped operand."""
    if target is None or b.batched:
        return None
    options = [(axis, d) for axis in range(len(target)) for d in b.dims()]
    if not options or len(target) > 1:
        return None
    axis, d = b.pick(options)
    full = (*target[:axis], d, *target[axis:])  # the operand: target with one more dimension
    known = b.reachable()
    if full not in known:
        return None
    u = b.within(b.expr(depth, full, True), (-30.0, 30.0))
    total = make("reduce", (call("exp", u),), ("sum", axis, None, None))
    return call("log", total)


def normalized(b: Builder, depth: int, target: Any) -> Node | None:
    """`exp(u) / sum(exp(u), dim, keepdim=true)` or `u - log(sum(exp(u), dim, keepdim=true))`."""
    if not target:
        return None
    u = b.within(b.expr(depth, target, True), (-30.0, 30.0))
    axis = b.pick(range(len(target)))
    dim = axis - len(target) if b.batched or b.chance(0.5) else axis
    total = make("reduce", (call("exp", u),), ("sum", dim, True, None))
    if b.chance(0.5):
        return binop("/", call("exp", u), total)
    return binop("-", u, call("log", total))


def bounded_clamp(b: Builder, depth: int, target: Any, exact: bool) -> Node:
    """A clamp whose bounds are formulas of tensors: `clamp(u, lo, hi)`, `min(max(u, lo), hi)`,
    `max(min(u, hi), lo)`; the bounds may cross (lo > hi), where each form has its own value."""
    u = b.expr(depth, target, exact)
    lo = b.expr(max(depth - 1, 0), target, False)
    hi = lo if b.chance(0.15) else b.expr(max(depth - 1, 0), target, False)  # equal bounds: a tie
    if b.chance(0.5):
        hi = binop("+", lo, call("abs", hi))  # ordered bounds, as hardtanh's
    # At lo == hi torch.clamp's backward passes the gradient to neither bound and its forward mode to
    # `lo`; opgen's jvp follows its backward: equal bounds only in the min/max forms.
    form = b.pick(["minmax", "maxmin"] if hi is lo else ["clamp", "minmax", "maxmin"])
    if form == "clamp":
        return call("clamp", u, lo, hi)
    if form == "minmax":
        return call("min", call("max", u, lo), hi)
    return call("max", call("min", u, hi), lo)


def shared_let_outputs(b: Builder, target: Any, names: list[str]) -> Node | None:
    """An output reading a tensor `let` through a reduction that the other outputs may not use."""
    lets = [n for n in b.leaves if n.tensor and n.value.startswith("l") and n.shape is not None and n.shape]
    if not lets or not fits((), target, False):
        return None
    let = b.pick(lets)
    name = b.pick([n for n in ("sum", "mean", "amax", "amin", "var", "std", "norm") if n not in names] or ["sum"])
    names.append(name)
    operand = b.within(let, (-100.0, 100.0)) if name in ("sum", "norm") else let
    if b.batched and name in ("mean", "var", "std"):
        name = "amax"
    correction = b.pick([None, 0]) if name in ("var", "std") else None
    return make("whole", (operand,), (name, correction))
