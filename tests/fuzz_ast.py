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
        name, dim, keepdim = node.value
        keywords = [ast.keyword("dim", _py(Node("num", value=dim)))]
        if keepdim is not None:
            keywords.append(ast.keyword("keepdim", ast.Name("true" if keepdim else "false", ast.Load())))
        return ast.Call(ast.Name(name, ast.Load()), [_py(args[0])], keywords)
    if op == "T":
        return ast.Attribute(_py(args[0]), "T", ast.Load())
    raise AssertionError(op)


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
REDUCE = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "logsumexp": torch.logsumexp}
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
        name, dim, keepdim = node.value
        return REDUCE[name](self(node.args[0]), dim=dim, keepdim=bool(keepdim))

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
        if name == "where":
            return torch.where(*args)
        if name == "clamp":
            x, lo, hi = args
            self._watch(x - lo)
            self._watch(x - hi)
            return torch.clamp(x, lo, hi)
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
