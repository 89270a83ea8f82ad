"""Fuzzer formula nodes with their bounds and shapes worked out from their arguments (`make`), for
`fuzz_grammar.Builder` and `fuzz_newforms`: `num`, `const`, `call`, `binop`, and `fits` for shapes.
"""

from __future__ import annotations

import math
from typing import Any

from fuzz_ast import Node, Shape
from fuzz_intervals import (
    ANY,
    MAX_SIZE,
    UNARY_BOUNDS,
    WHOLE_SIZE,
    Interval,
    add,
    alias_bounds,
    div,
    extremum,
    mul,
    neg,
    power,
    reduction,
    union,
)


def _broadcast(a: Shape, b: Shape) -> Shape:
    if a is None or b is None:
        return None
    out: list[str] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else "1"
        y = b[-i] if i <= len(b) else "1"
        if x != y and "1" not in (x, y):
            raise ValueError(f"{a} and {b} do not broadcast")
        out.append(y if x == "1" else x)
    return tuple(reversed(out))


def fits(shape: Shape, target: Shape, exact: bool) -> bool:
    """Whether a value of `shape` may stand where `target` is wanted."""
    if target is None:
        return True
    if exact:
        return shape == target
    try:
        return _broadcast(shape, target) == target
    except ValueError:
        return False


def make(op: str, args: tuple[Node, ...] = (), value: Any = None) -> Node:
    """A node with its bound, shape and tensor flag worked out from its arguments."""
    iv = _bounds(op, args, value)
    tensor = any(a.tensor for a in args)
    shapes = [a.shape for a in args]
    shape: Shape = ()
    if any(s is None for s in shapes):
        shape = None
    elif op == "bin" and value == "@":
        shape = args[0].shape[:-1] + args[1].shape[-1:]  # type: ignore[index]
    elif op == "T":
        shape = args[0].shape[:-2] + args[0].shape[-2:][::-1]  # type: ignore[index]
    elif op == "reduce":
        dims = value[1] if isinstance(value[1], tuple) else (value[1],)
        s = list(args[0].shape)  # type: ignore[arg-type]
        for dim in sorted((d % len(s) for d in dims), reverse=True):
            if value[2]:
                s[dim] = "1"
            else:
                del s[dim]
        shape = tuple(s)
    elif op == "whole":
        shape = ()
    elif op == "softmax":
        shape = args[0].shape
    elif op == "cut":
        axis, k = value[:2]
        s = list(args[0].shape)  # type: ignore[arg-type]
        s[axis] = f"{s[axis]}//{k}"
        shape = tuple(s)
    else:
        for s in shapes:
            shape = _broadcast(shape, s)
    return Node(op, args, value, lo=iv[0], hi=iv[1], shape=shape, tensor=tensor)


def const(name: str) -> Node:
    value = {"pi": math.pi, "inf": math.inf}.get(name, 1.0)
    return Node("const", value=name, lo=value, hi=value, shape=())


def _bounds(op: str, args: tuple[Node, ...], value: Any) -> Interval:
    ivs = [(a.lo, a.hi) for a in args]
    if op == "num":
        return (float(value), float(value))
    if op == "neg":
        return neg(ivs[0])
    if op == "ind":
        return (0.0, 1.0)
    if op == "bin":
        a, b = ivs
        if value == "+":
            return add(a, b)
        if value == "-":
            return add(a, neg(b))
        if value == "*":
            return mul(a, b)
        if value == "/":
            return div(a, b)
        if value == "**":
            exponent = args[1].lo if args[1].lo == args[1].hi else None
            return power(a, b, exponent)
        if value == "@":
            product = mul(a, b)
            return reduction("sum", product)
    if op == "T":
        return ivs[0]
    if op == "reduce":
        return reduction(value[0], ivs[0], MAX_SIZE ** len(value[1]) if isinstance(value[1], tuple) else MAX_SIZE)
    if op == "whole":
        return reduction(value[0], ivs[0], WHOLE_SIZE)
    if op == "softmax":
        return (
            (0.0, 1.0) if value[0] == "softmax" else (min(ivs[0][0] - ivs[0][1] - 2 * math.log(WHOLE_SIZE), 0.0), 0.0)
        )
    if op == "cut":
        return ivs[0]
    if op == "alias":
        return alias_bounds(value, ivs)
    if op == "call":
        if value in UNARY_BOUNDS:
            return UNARY_BOUNDS[value](ivs[0])
        if value == "atan2":
            return (-math.pi, math.pi)
        if value == "xlogy":
            return mul(ivs[0], UNARY_BOUNDS["log"](ivs[1]))
        if value == "where":
            return union(ivs[1], ivs[2])
        if value in ("max", "min"):
            return extremum(ivs[0], ivs[1], value == "max")
        if value == "clamp":
            return extremum(extremum(ivs[0], ivs[1], True), ivs[2], False)
    return ANY


def num(value: float) -> Node:
    return make("num", value=value)


def call(name: str, *args: Node) -> Node:
    return make("call", args, name)


def binop(op: str, a: Node, b: Node) -> Node:
    return make("bin", (a, b), op)
