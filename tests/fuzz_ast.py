"""The fuzzer's own formula trees: rendered to spec text, and evaluated as plain torch.

A `Node` is one construct of the formula language (spec format section 3). The fuzzer
builds random trees (`fuzz_grammar`), writes them into a spec with `render`, and computes
the expected values and gradients with `evaluate`: PyTorch's own ops under autograd, in
float64, straight from the tree. Nothing here imports opgen, so the reference shares no
code with the generator it checks.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

Shape = tuple[str, ...] | None  # named dimensions ("1" a kept dimension), None: not tracked


@dataclass(frozen=True)
class Node:
    """`op` is one of the keys of `_RENDER`; `value` the literal, name, function or operator."""

    op: str
    args: tuple[Node, ...] = ()
    value: Any = None
    # Generation metadata, not part of the formula: a bound on the values, the static shape,
    # whether a Tensor input is reachable (the max/min tie rule depends on it).
    lo: float = field(default=-math.inf, compare=False)
    hi: float = field(default=math.inf, compare=False)
    shape: Shape = field(default=None, compare=False)
    tensor: bool = field(default=False, compare=False)

    def size(self) -> int:
        return 1 + sum(a.size() for a in self.args)


BINARY = {"+": ast.Add, "-": ast.Sub, "*": ast.Mult, "/": ast.Div, "**": ast.Pow, "@": ast.MatMult}
LOGICAL = {"&": ast.BitAnd, "|": ast.BitOr}
COMPARE = {"<": ast.Lt, "<=": ast.LtE, ">": ast.Gt, ">=": ast.GtE, "==": ast.Eq, "!=": ast.NotEq}


def _py(node: Node) -> ast.expr:
    op, args = node.op, node.args
    if op == "num":
        value = node.value
        literal = ast.Constant(abs(value))
        return ast.UnaryOp(ast.USub(), literal) if value < 0 else literal
    if op in ("var", "const"):
        return ast.Name(node.value, ast.Load())
    if op == "neg":
        return ast.UnaryOp(ast.USub(), _py(args[0]))
    if op == "not":
        return ast.UnaryOp(ast.Invert(), _py(args[0]))
    if op == "bin":
        table = BINARY if node.value in BINARY else LOGICAL
        return ast.BinOp(_py(args[0]), table[node.value](), _py(args[1]))
    if op == "cmp":
        return ast.Compare(_py(args[0]), [COMPARE[o]() for o in node.value], [_py(a) for a in args[1:]])
    if op == "ind":  # a condition used as a number: written as the condition itself
        return _py(args[0])
    if op == "call":
        return ast.Call(ast.Name(node.value, ast.Load()), [_py(a) for a in args], [])
    if op == "reduce":
        name, dim, keepdim, *correction = node.value
        keywords = [ast.keyword("dim", _dim(dim))]
        if keepdim is not None:
            keywords.append(ast.keyword("keepdim", ast.Name("true" if keepdim else "false", ast.Load())))
        if correction and correction[0] is not None:
            keywords.append(ast.keyword("correction", ast.Constant(correction[0])))
        return ast.Call(ast.Name(name, ast.Load()), [_py(args[0])], keywords)
    if op == "T":
        return ast.Attribute(_py(args[0]), "T", ast.Load())
    if op == "alias":  # PyTorch's name of a function (`relu(u)`, `clip(u, lo, hi)`)
        return ast.Call(ast.Name(node.value, ast.Load()), [_py(a) for a in args], [])
    if op == "whole":  # a reduction over every dimension, `mean(u)`, `std(u, correction=0)`
        name, correction = node.value
        extra = [] if correction is None else [ast.keyword("correction", ast.Constant(correction))]
        return ast.Call(ast.Name(name, ast.Load()), [_py(args[0])], extra)
    if op == "softmax":
        name, dim = node.value
        return ast.Call(ast.Name(name, ast.Load()), [_py(args[0])], [ast.keyword("dim", _dim(dim))])
    if op == "cut":
        return _cut(node)
    raise AssertionError(op)


def _dim(dim: int | tuple[int, ...]) -> ast.expr:
    if isinstance(dim, tuple):
        return ast.Tuple([_py(Node("num", value=d)) for d in dim], ast.Load())
    return _py(Node("num", value=dim))


def _cut(node: Node) -> ast.expr:
    """Part `i` of `k` of one named dimension: `x[..., D // 3:2 * D // 3]` or `chunk(x, 3, dim=-1)[1]`."""
    axis, k, i, chunk, rank, batched = node.value
    operand = _py(node.args[0])
    if chunk:
        dim = axis - rank if batched or axis % 2 else axis
        call = ast.Call(ast.Name("chunk", ast.Load()), [operand, ast.Constant(k)], [ast.keyword("dim", _dim(dim))])
        return ast.Subscript(call, ast.Constant(i), ast.Load())
    name = ast.Name(node.args[0].shape[axis], ast.Load())  # type: ignore[index]

    def bound(j: int) -> ast.expr | None:
        if j in (0, k):
            return None
        scaled = name if j == 1 else ast.BinOp(ast.Constant(j), ast.Mult(), name)
        return ast.BinOp(scaled, ast.FloorDiv(), ast.Constant(k))

    part = ast.Slice(bound(i), bound(i + 1))
    everything = ast.Slice(None, None)
    index: list[ast.expr] = [everything] * rank
    index[axis] = part
    index = [ast.Constant(...), *index[axis:]] if batched else index[: axis + 1]
    return ast.Subscript(operand, ast.Tuple(index, ast.Load()) if len(index) > 1 else index[0], ast.Load())


def render(node: Node) -> str:
    """Formula text with Python's own precedence rules (`ast.unparse` adds only the parentheses needed)."""
    return ast.unparse(ast.fix_missing_locations(_py(node)))


# Functions of one argument, as PyTorch computes them.
UNARY = {
    "exp": torch.exp,
    "log": torch.log,
    "log1p": torch.log1p,
    "expm1": torch.expm1,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "sin": torch.sin,
    "cos": torch.cos,
    "tan": torch.tan,
    "asin": torch.asin,
    "acos": torch.acos,
    "atan": torch.atan,
    "sinh": torch.sinh,
    "cosh": torch.cosh,
    "tanh": torch.tanh,
    "asinh": torch.asinh,
    "acosh": torch.acosh,
    "atanh": torch.atanh,
    "sigmoid": torch.sigmoid,
    "softplus": F.softplus,
    "erf": torch.erf,
    "erfc": torch.erfc,
    "erfinv": torch.erfinv,
    "lgamma": torch.lgamma,
    "digamma": torch.digamma,
    "abs": torch.abs,
    "sign": torch.sign,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "round": torch.round,
}
REDUCE: dict[str, Any] = {
    "sum": torch.sum,
    "mean": torch.mean,
    "amax": torch.amax,
    "amin": torch.amin,
    "logsumexp": torch.logsumexp,
    "var": torch.var,
    "std": torch.std,
    "norm": torch.linalg.vector_norm,
}
# PyTorch's names of functions the formula language reads as its own formulas (opgen.formula.words),
# computed by PyTorch's own function; `maximum`-like ones go through the max/min tie rule below.
ALIASES: dict[str, Any] = {
    "relu": torch.relu,
    "relu6": lambda u: torch.clamp(u, 0, 6),
    "silu": F.silu,
    "gelu": F.gelu,
    "softsign": F.softsign,
    "logsigmoid": F.logsigmoid,
    "expit": torch.sigmoid,
    "square": torch.square,
    "cube": lambda u: u**3,
    "neg": torch.neg,
    "absolute": torch.abs,
    "sgn": torch.sign,
    "exp2": torch.exp2,
    "reciprocal": torch.reciprocal,
    "log2": torch.log2,
    "log10": torch.log10,
    "logit": torch.logit,
    "arcsinh": torch.asinh,
    "arctan": torch.atan,
    "pow": torch.pow,
    "clip": torch.clamp,
}
EXTREMA = {"maximum": "max", "fmax": "max", "minimum": "min", "fmin": "min"}
KINK_FREE = {"floor": 1.0, "ceil": 1.0, "round": 0.5}  # step functions jump at multiples of this (round: odd ones)


class Evaluator:
    """Plain-torch values of trees over `env` (name -> float64 tensor, or bool tensor for conditions).

    `near` records how close any comparison, step or kink came to switching without an exact
    tie: a sample where it is tiny sits on a kink only by rounding, and is drawn again.
    """

    def __init__(self, env: dict[str, torch.Tensor]) -> None:
        self.env = env
        self.near = math.inf

    def _watch(self, gap: torch.Tensor) -> None:
        gap = gap.detach().abs()
        gap = gap[gap > 0]
        if gap.numel():
            self.near = min(self.near, float(gap.min()))

    def __call__(self, node: Node) -> torch.Tensor:
        return getattr(self, "_" + node.op)(node)

    def _num(self, node: Node) -> torch.Tensor:
        return torch.tensor(float(node.value), dtype=torch.float64)

    def _const(self, node: Node) -> torch.Tensor:
        if node.value in ("true", "True", "false", "False"):
            return torch.tensor(node.value in ("true", "True"))
        return torch.tensor({"pi": math.pi, "inf": math.inf}[node.value], dtype=torch.float64)

    def _var(self, node: Node) -> torch.Tensor:
        return self.env[node.value]

    def _neg(self, node: Node) -> torch.Tensor:
        return -self(node.args[0])

    def _not(self, node: Node) -> torch.Tensor:
        return torch.logical_not(self(node.args[0]))

    def _ind(self, node: Node) -> torch.Tensor:
        return self(node.args[0]).to(torch.float64)

    def _bin(self, node: Node) -> torch.Tensor:
        a, b = self(node.args[0]), self(node.args[1])
        op = node.value
        if op == "&":
            return torch.logical_and(a, b)
        if op == "|":
            return torch.logical_or(a, b)
        if op == "@":
            return torch.matmul(a, b)
        return {"+": torch.add, "-": torch.sub, "*": torch.mul, "/": torch.div, "**": torch.pow}[op](a, b)

    def _cmp(self, node: Node) -> torch.Tensor:
        values = [self(a) for a in node.args]
        result = None
        for op, left, right in zip(node.value, values, values[1:], strict=False):
            self._watch(left - right)
            part = {"<": torch.lt, "<=": torch.le, ">": torch.gt, ">=": torch.ge, "==": torch.eq, "!=": torch.ne}[op](
                left, right
            )
            result = part if result is None else torch.logical_and(result, part)
        assert result is not None
        return result

    def _T(self, node: Node) -> torch.Tensor:  # noqa: N802
        return self(node.args[0]).mT

    def _reduce(self, node: Node) -> torch.Tensor:
        name, dim, keepdim, *correction = node.value
        extra = {"correction": 1 if correction[0] is None else correction[0]} if name in ("var", "std") else {}
        return REDUCE[name](self(node.args[0]), dim=dim, keepdim=bool(keepdim), **extra)  # type: ignore[operator]

    def _whole(self, node: Node) -> torch.Tensor:
        name, correction = node.value
        u = self(node.args[0])
        if name in ("var", "std"):
            return REDUCE[name](u, correction=1 if correction is None else correction)  # type: ignore[no-any-return]
        return REDUCE[name](u)  # type: ignore[no-any-return]

    def _softmax(self, node: Node) -> torch.Tensor:
        name, dim = node.value
        return (torch.softmax if name == "softmax" else torch.log_softmax)(self(node.args[0]), dim=dim)

    def _cut(self, node: Node) -> torch.Tensor:
        axis, k, i, _, rank, _ = node.value
        return torch.chunk(self(node.args[0]), k, dim=axis - rank)[i]

    def _alias(self, node: Node) -> torch.Tensor:
        if node.value in EXTREMA:
            return self._extremum(Node("call", node.args, EXTREMA[node.value]), *map(self, node.args))
        if node.value == "clip":
            x, lo, hi = map(self, node.args)
            self._watch(x - lo)
            self._watch(x - hi)
        elif node.value in ("relu", "relu6", "sgn", "absolute"):
            u = self(node.args[0])
            self._watch(u)
            self._watch(u - 6)
        return ALIASES[node.value](*map(self, node.args))  # type: ignore[no-any-return]

    def _call(self, node: Node) -> torch.Tensor:
        name, args = node.value, [self(a) for a in node.args]
        if name in UNARY:
            (u,) = args
            if name in KINK_FREE:
                step = KINK_FREE[name]
                self._watch(u / step - torch.round(u / step) if name != "round" else u - torch.floor(u) - 0.5)
            elif name in ("sign", "abs"):
                self._watch(u)
            return UNARY[name](u)
        if name == "heaviside":  # 1 for u >= 0; torch.heaviside has no derivative, this has PyTorch's zero one
            self._watch(args[0])
            return torch.where(args[0] >= 0, 1.0, 0.0).to(torch.float64)
        if name == "atan2":
            return torch.atan2(args[0], args[1])
        if name == "xlogy":
            self._watch(args[0])
            return torch.xlogy(args[0], args[1])
        if name == "where":
            return torch.where(*args)
        if name == "clamp":
            x, lo, hi = args
            self._watch(x - lo)
            self._watch(x - hi)
            # torch.clamp's backward fails for an x smaller than its bounds: the three broadcast first, in the
            # dtype torch.clamp gives (broadcasting a 0-dim float64 bound would change it).
            dtype = torch.clamp(x.detach(), lo.detach(), hi.detach()).dtype
            return torch.clamp(*(t.to(dtype) for t in torch.broadcast_tensors(x, lo, hi)))
        if name in ("max", "min"):
            return self._extremum(node, args[0], args[1])
        raise AssertionError(name)

    def _extremum(self, node: Node, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Two tensors: `torch.maximum` (half to each at a tie); against a number: relu's rule (0 at the tie)."""
        self._watch(a - b)
        big = node.value == "max"
        if node.args[0].tensor and node.args[1].tensor or not (node.args[0].tensor or node.args[1].tensor):
            return torch.maximum(a, b) if big else torch.minimum(a, b)
        if not node.args[0].tensor:
            a, b = b, a  # `a` holds the tensor
        wins = a > b if big else a < b
        return torch.where(wins, a, b)
