"""Scans along a named dimension: `cumsum(x, dim)`, `logcumsumexp(x, dim)` and `cumprod(x, dim)`, as torch's.

Note [scans]
~~~~~~~~~~~~
`cumsum(x, dim=-1)` is `torch.cumsum(x, -1)`: entry i is the sum of the entries 0..i along `dim`, the
operand's shape kept. `dim` is a whole-number literal naming one of the operand's declared dimensions
(`Tensor[..., N]`: -1; counted from the front only without a batch `...`); it is kept counted from the
end, so that a batch of any depth in front leaves it the same.

It is linear: its tangent is the cumsum of the tangent, and the gradient of its operand the reversed
cumsum of the gradient (entry i the sum of the gradient's entries i..N-1: `flip(cumsum(flip(g)))`), a
differentiable torch op, so double backward, torch.func and torch.compile take it as any other. A
gradient narrower than the node (constant along a dimension: the scalar gradient of `sum(cumsum(x,
dim=-1))`) is expanded to the operand first: the node then carries the operand as its last argument
(`g.expand_as(x)`).

Note [logcumsumexp]
~~~~~~~~~~~~~~~~~~~
`logcumsumexp(x, dim)` is `torch.logcumsumexp`, `log(cumsum(exp(x), dim))` computed without overflow
(finite at x = 100 in float32, where exp overflows). Its gradient is PyTorch's backward formula: entry
j gets `sum over i >= j of g_i exp(x_j - y_i)`, computed as `exp(rev_lcse(log g+ - y) + x) -
exp(rev_lcse(log g- - y) + x)` with `g+`, `g-` the positive and negative parts of the gradient (the
dtype's lowest finite number where a part is 0, as PyTorch: with -inf there, the derivative of the
gradient through logcumsumexp is wrong) and `rev_lcse` the reversed logcumsumexp: differentiable torch ops, so double
backward differentiates it again. Forward mode and a gradient narrower than the node (the scalar
gradient of `sum(logcumsumexp(x, dim=-1))`) go through `log(cumsum(exp(x)))` (Note [narrow gradients]
in opgen.derive.vjp), exact in float64, overflowing past x = 88 in float32.

Note [cumprod]
~~~~~~~~~~~~~~
`cumprod(x, dim)` is `torch.cumprod`. Its gradient is never `cumsum(g * y) / x` (0/0 at a zero of x):
entry j gets `sum over i >= j of g_i * prod over k <= i, k != j of x_k`, as PyTorch's cumprod_backward,
written as differentiable torch ops with no division, O(N^2) in the scanned dimension N: `C[..., j, i]`
is the cumprod along i of `x` with its entry j put to 1 (`torch.where(eye, 1, x)`), so `C[j, i]` is the
product of the entries 0..i but j; the gradient is `C` times `g` summed over i >= j (an upper-triangular
mask), the tangent `C` times `t` summed over j <= i. Both hold with any number of zeros in a slice, and
double backward differentiates them again (torch.cumprod's own backward is zero-safe). The scan is moved
to the last dimension for the masks and back. A narrower gradient or tangent is broadcast to `x` first.

`prod(x, dim=D)` (`keepdim=true` too) is `torch.prod` along one named dimension. Its gradient is the
incoming gradient times the product of the other entries, never `y / x`: `excl(x) * flip(excl(flip(x)))`
with `excl` the exclusive cumprod along D (entry j the product of the entries before j), O(N), right with
any number of zeros, and differentiable again; its tangent is the sum of `t` times that product.
"""

from __future__ import annotations

import sympy
from sympy import Expr, Function, S

from opgen.formula import functions as fn
from opgen.formula.dims import Shape, ShapeError, show, split
from opgen.formula.tensor import TensorOp, pull_number, shape_of
from opgen.nodes.base import Lowered, OneOperand, Printer, Rearranging, Shaped, Shown, Spelled, TorchCode


def scan_dim(name: str, operand: Shape, dim: int) -> int:
    """`dim` of `name(x, dim)` counted from the end of `x`'s dimensions; a `ShapeError` when it names none."""
    if operand is None:
        raise ShapeError(f"{name}() needs a tensor of declared dimensions, e.g. x: Tensor[..., N] with dim=-1")
    batch, dims = split(operand)
    if not dims:
        raise ShapeError(f"{name}() needs a named dimension to scan along; {show(operand)} has none")
    if -len(dims) <= dim < 0:
        return dim
    if 0 <= dim < len(dims) and not batch:
        return dim - len(dims)
    counted = f"-{len(dims)} to -1" + ("" if batch else f" or 0 to {len(dims) - 1}")
    raise ShapeError(f"{name}(): dim={dim} is not a dimension of {show(operand)}; it takes {counted}")


class Cumsum(Rearranging, Spelled, Shown, TensorOp):
    """`Cumsum(x, dim, reverse)` or `Cumsum(x, dim, reverse, like)`: the (reversed, with `reverse` 1) cumulative
    sum of `x` along `dim` (negative), `x` first expanded to `like`'s shape when given (Note [scans])."""

    nargs = (3, 4)

    @classmethod
    def eval(cls, operand: Expr, *rest: Expr) -> Expr | None:
        return pull_number(cls, operand, *rest)

    @property
    def dim(self) -> int:
        return int(self.args[1])

    @property
    def reverse(self) -> bool:
        return bool(self.args[2])

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return shape_of(self.args[-1] if len(self.args) == 4 else self.args[0], table)

    def vjp_operand(self, grad: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        return _fitted(grad, self.args[1], 1 - self.args[2], self, table)

    def tangent_of(self, tangent: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        return _fitted(tangent, self.args[1], self.args[2], self, table)

    def _torch(self, printer: TorchCode) -> str:
        text = printer._print(self.args[0])
        if len(self.args) == 4:
            text = f"{printer._postfix(self.args[0])}.expand_as({printer._print(self.args[3])})"
        if not self.reverse:
            return f"{printer.torch}.cumsum({text}, {self.dim})"
        flip = f"{printer.torch}.flip"
        return f"{flip}({printer.torch}.cumsum({flip}({text}, ({self.dim},)), {self.dim}), ({self.dim},))"

    def _docstring(self, printer: Printer) -> str:
        word = "reverse_cumsum" if self.reverse else "cumsum"
        return f"{word}({printer._print(self.args[0])}, dim={self.dim})"


def _fitted(value: Expr, dim: Expr, reverse: Expr, node: Cumsum, table: dict[sympy.Symbol, Shape]) -> Expr:
    """`Cumsum(value, dim, reverse)` of a `value` standing for a tensor of `node`'s shape, expanded to it first
    where it is narrower (Note [scans])."""
    like = node.args[3] if len(node.args) == 4 else node.args[0]
    if shape_of(value, table) == shape_of(node, table):
        return Cumsum(value, dim, reverse)
    return Cumsum(value, dim, reverse, like)


class Lowest(Spelled, Shown, Function):
    """The lowest finite number of `like`'s dtype, `torch.finfo(like.dtype).min`: where a part of a logcumsumexp's
    gradient is 0 its log stands so, not as -inf, which spoils the derivative (Note [logcumsumexp])."""

    nargs = 1
    is_real = True

    def fdiff(self, argindex: int = 1) -> Expr:
        return S.Zero

    def _torch(self, printer: TorchCode) -> str:
        return f"{printer.torch}.finfo({printer._postfix(self.args[0])}.dtype).min"

    def _docstring(self, printer: Printer) -> str:
        return "lowest"


class LogCumsumExp(Lowered, Spelled, Shown, TensorOp):
    """`LogCumsumExp(x, dim, reverse)`: `log(cumsum(exp(x), dim))` without overflow, as torch.logcumsumexp
    (reversed, from the end, with `reverse` 1) (Note [logcumsumexp])."""

    nargs = 3

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return shape_of(self.args[0], table)

    def elementary(self) -> Expr:
        x, dim, reverse = self.args
        return sympy.log(Cumsum(sympy.exp(x), dim, reverse))

    def vjp_pushes(self, grad: Expr) -> list[tuple[Expr, Expr]]:
        """PyTorch's logcumsumexp_backward: the positive and negative parts of the gradient, each through a
        reversed logcumsumexp of its log less the output, so that no exp overflows."""
        x, dim, reverse = self.args
        back = 1 - reverse
        log_grad = sympy.log(sympy.Abs(grad))
        parts = [
            sympy.exp(LogCumsumExp(fn.where(side, log_grad, Lowest(grad)) - self, dim, back) + x)
            for side in (sympy.StrictGreaterThan(grad, 0), sympy.StrictLessThan(grad, 0))
        ]
        return [(x, parts[0] - parts[1])]

    def _torch(self, printer: TorchCode) -> str:
        x, dim = printer._print(self.args[0]), int(self.args[1])
        if not self.args[2]:
            return f"{printer.torch}.logcumsumexp({x}, {dim})"
        flip = f"{printer.torch}.flip"
        return f"{flip}({printer.torch}.logcumsumexp({flip}({x}, ({dim},)), {dim}), ({dim},))"

    def _docstring(self, printer: Printer) -> str:
        word = "reverse_logcumsumexp" if self.args[2] else "logcumsumexp"
        return f"{word}({printer._print(self.args[0])}, dim={int(self.args[1])})"


class Cumprod(OneOperand, Spelled, Shown, TensorOp):
    """`Cumprod(x, dim)`: the cumulative product of `x` along `dim` (negative), torch.cumprod (Note [cumprod])."""

    nargs = 2

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return shape_of(self.args[0], table)

    def _pushed(self, value: Expr, forward: bool, table: dict[sympy.Symbol, Shape]) -> Expr:
        wide = S.One if shape_of(value, table) != shape_of(self, table) else S.Zero
        return CumprodPush(self.args[0], value, self.args[1], S.One if forward else S.Zero, wide)

    def vjp_operand(self, grad: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        return self._pushed(grad, False, table)

    def tangent_of(self, tangent: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        return self._pushed(tangent, True, table)

    def _torch(self, printer: TorchCode) -> str:
        return f"{printer.torch}.cumprod({printer._print(self.args[0])}, {int(self.args[1])})"

    def _docstring(self, printer: Printer) -> str:
        return f"cumprod({printer._print(self.args[0])}, dim={int(self.args[1])})"


class CumprodPush(Shaped, Spelled, Shown, TensorOp):
    """`CumprodPush(x, v, dim, forward, wide)`: the gradient of `x` through `cumprod(x, dim)` for the incoming
    gradient `v` (`forward` 0), or the tangent of the cumprod for the tangent `v` of `x` (`forward` 1), `v`
    broadcast to `x` first with `wide` 1; no division, right at zeros (Note [cumprod])."""

    nargs = 5

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        return shape_of(self.args[0], table)

    def _torch(self, printer: TorchCode) -> str:
        torch, dim = printer.torch, int(self.args[2])
        x, v = printer._postfix(self.args[0]), printer._postfix(self.args[1])
        if self.args[4]:
            v = f"({torch}.zeros_like({printer._print(self.args[0])}) + {printer._print(self.args[1])})"
        moved = "" if dim == -1 else f".movedim({dim}, -1)"  # the scan last, for the masks
        n, device = f"{x}.shape[{dim}]", f"device={x}.device"
        eye = f"{torch}.eye({n}, dtype={torch}.bool, {device})"
        # C[..., j, i]: the product of the entries 0..i of x but entry j
        c = f"{torch}.cumprod({torch}.where({eye}, 1, {x}{moved}.unsqueeze(-2)), -1)"
        upper = f"{torch}.ones({n}, {n}, dtype={torch}.bool, {device}).triu()"  # i >= j
        if self.args[3]:  # the tangent: sum over j <= i of t_j C[j, i]
            summed = f"{torch}.where({upper}, {c} * {v}{moved}.unsqueeze(-1), 0).sum(-2)"
        else:  # the gradient: sum over i >= j of g_i C[j, i]
            summed = f"{torch}.where({upper}, {c} * {v}{moved}.unsqueeze(-2), 0).sum(-1)"
        return summed if dim == -1 else f"{summed}.movedim(-1, {dim})"

    def _docstring(self, printer: Printer) -> str:
        word = "cumprod_tangent" if self.args[3] else "cumprod_backward"
        x, v = printer._print(self.args[0]), printer._print(self.args[1])
        return f"{word}({x}, {v}, dim={int(self.args[2])})"


def _others(x: str, dim: int, torch: str) -> str:
    """The product of the entries of `x` along `dim` but each one, without division (Note [cumprod])."""

    def exclusive(v: str) -> str:
        ones = f"{torch}.ones_like({v}.narrow({dim}, 0, 1))"
        return f"{torch}.cumprod({torch}.cat([{ones}, {v}.narrow({dim}, 0, {v}.shape[{dim}] - 1)], {dim}), {dim})"

    flip = f"{torch}.flip"
    return f"{exclusive(x)} * {flip}({exclusive(f'{flip}({x}, ({dim},))')}, ({dim},))"


class Prod(OneOperand, Spelled, Shown, TensorOp):
    """`Prod(x, dim, keepdim)`: the product of `x` along `dim` (negative), torch.prod (Note [cumprod])."""

    nargs = 3

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        shape = shape_of(self.args[0], table)
        if shape is None:
            return None
        dims, dim = list(shape), int(self.args[1])
        if self.args[2]:
            dims[dim] = 1
        else:
            del dims[dim]
        return tuple(dims)

    def _pushed(self, value: Expr, forward: bool, table: dict[sympy.Symbol, Shape]) -> Expr:
        wide = S.One if shape_of(value, table) != shape_of(self, table) else S.Zero
        return ProdPush(self.args[0], value, self.args[1], self.args[2], S.One if forward else S.Zero, wide)

    def vjp_operand(self, grad: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        return self._pushed(grad, False, table)

    def tangent_of(self, tangent: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        return self._pushed(tangent, True, table)

    def _torch(self, printer: TorchCode) -> str:
        keep = ", keepdim=True" if self.args[2] else ""
        return f"{printer.torch}.prod({printer._print(self.args[0])}, {int(self.args[1])}{keep})"

    def _docstring(self, printer: Printer) -> str:
        keep = ", keepdim=true" if self.args[2] else ""
        return f"prod({printer._print(self.args[0])}, dim={int(self.args[1])}{keep})"


class ProdPush(Shaped, Spelled, Shown, TensorOp):
    """`ProdPush(x, v, dim, keepdim, forward, wide)`: the gradient of `x` through `prod(x, dim)` for the
    incoming gradient `v` (`forward` 0), or the product's tangent for the tangent `v` of `x` (`forward` 1);
    `v` broadcast first with `wide` 1 (to the product's shape backward, to `x`'s forward) (Note [cumprod]).
    The product itself is no argument: backward never computes it."""

    nargs = 6

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        if not self.args[4]:
            return shape_of(self.args[0], table)
        return Prod(self.args[0], self.args[2], self.args[3]).shape_in(table)

    def _torch(self, printer: TorchCode) -> str:
        torch, dim, keep = printer.torch, int(self.args[2]), bool(self.args[3])
        x, v = printer._postfix(self.args[0]), printer._postfix(self.args[1])
        others = _others(x, dim, torch)
        if self.args[4]:  # the tangent
            if self.args[5]:
                v = f"({torch}.zeros_like({printer._print(self.args[0])}) + {printer._print(self.args[1])})"
            keeping = ", keepdim=True" if keep else ""
            return f"({v} * {others}).sum({dim}{keeping})"
        if self.args[5]:  # zeros of the product's shape: x without (or with one entry along) `dim`
            like = f"{x}.narrow({dim}, 0, 1)" if keep else f"{x}.select({dim}, 0)"
            v = f"({torch}.zeros_like({like}) + {printer._print(self.args[1])})"
        return f"{v if keep else f'{v}.unsqueeze({dim})'} * {others}"

    def _docstring(self, printer: Printer) -> str:
        word = "prod_tangent" if self.args[4] else "prod_backward"
        x, v = printer._print(self.args[0]), printer._print(self.args[1])
        return f"{word}({x}, {v}, dim={int(self.args[2])})"


PRODUCT = "prod"  # prod(x, dim=D, keepdim=true) (opgen.formula.reader)
SCANS = ("cumsum", "logcumsumexp", "cumprod")  # the formula language's names (opgen.formula.reader)
