"""Activation functions PyTorch computes in one kernel: silu, logsigmoid, mish, gelu, softplus, elu, leaky relu.

Each primitive (opgen.nodes.kernels) with its formula, its lowering pattern (`LOWERINGS`, tried in
order by opgen.optimize.lower), its call, its backward kernel and, where backward works in place,
that code (Note [forward in place] in opgen.emit.kernel_lines).
"""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn
from opgen.nodes.base import TorchCode
from opgen.nodes.kernels import Lowering, Primitive, aten, divided, functional, same, tensors
from opgen.nodes.stable import logsigmoid


class silu(Primitive):  # noqa: N801 - torch's names
    nargs = 1

    def elementary(self) -> Expr:
        return self.args[0] * fn.sigmoid(self.args[0])

    def _torch(self, printer: TorchCode) -> str:
        return functional(printer, "silu", *self.args)

    @classmethod
    def backward_torch(cls, printer: TorchCode, g: Expr, *args: Expr) -> str:
        return aten(printer, "silu_backward", g, *args)


class log_sigmoid(Primitive):  # noqa: N801
    """logsigmoid(u) (opgen.optimize.rewrite); its backward kernel needs a buffer forward would have to save."""

    nargs = 1
    backward_in_place = True

    def elementary(self) -> Expr:
        return logsigmoid(self.args[0])

    def _torch(self, printer: TorchCode) -> str:
        return functional(printer, "logsigmoid", *self.args)

    @classmethod
    def backward_torch(cls, printer: TorchCode, g: Expr, *args: Expr) -> str:
        raise NotImplementedError("logsigmoid's kernel needs forward's buffer: backward works in place")

    @classmethod
    def in_place_backward(cls, var: str, g: str, u: str, printer: TorchCode) -> list[str]:
        """logsigmoid' = sigmoid(-u)."""
        return [f"{var} = {printer.torch}.neg({u}).sigmoid_().mul_({g})"]


class mish(Primitive):  # noqa: N801
    nargs = 1
    # `mish_backward` where backward is not recorded: one call against the 16 its in-place form made,
    # and faster (16 against 20 ms at 1M float32 elements, one
    # thread). Its worst relative error over [-30, 30] is no larger (1.0e-6 against 1.5e-6 of
    # float64's, outside the zero of mish' near -1.19); for u in [5, 20) it is larger (9.7e-7
    # against 1.8e-7, its 1 - tanh**2 cancels), below 9 ulp (tests/test_backward_work.py).
    backward_in_place = False
    fast = False
    native_twice = False  # F.mish's second derivative is NaN from x = 100 in float32 (1e4 in float64), where it is 0

    def elementary(self) -> Expr:
        return self.args[0] * sympy.tanh(fn.softplus(self.args[0]))

    def fused_form(self) -> Expr:
        """tanh(softplus(u)) = s (2 - s) / (1 + (1 - s)**2) with s = sigmoid(u), exactly.

        One sigmoid instead of softplus and tanh (tanh is ten times slower than sigmoid on
        CPU), with no cancellation or overflow anywhere: s lies in [0, 1].
        """
        u = self.args[0]
        s = fn.sigmoid(u)
        return u * s * (2 - s) / (1 + (1 - s) ** 2)

    def _torch(self, printer: TorchCode) -> str:
        if not printer.no_grad:
            return functional(printer, "mish", *self.args)
        # tanh(softplus(u)) = s (2 - s) / (1 + (1 - s)**2), s = sigmoid(u) (`fused_form`), bound once.
        u = printer._print(self.args[0])
        (s,) = printer.untaken("s")
        return f"(2 - ({s} := {printer.torch}.sigmoid({u}))).mul_({s}).div_((1 - {s}).square_().add_(1)).mul_({u})"

    @classmethod
    def backward_torch(cls, printer: TorchCode, g: Expr, *args: Expr) -> str:
        return aten(printer, "mish_backward", g, *args)


class gelu(Primitive):  # noqa: N801
    fast = False  # inductor's fused loop beats PyTorch's kernels (measured, fused mode)
    nargs = 1
    backward_differentiable = True

    def elementary(self) -> Expr:
        return self.args[0] * (1 + sympy.erf(self.args[0] / sympy.sqrt(2))) / 2

    def _torch(self, printer: TorchCode) -> str:
        return functional(printer, "gelu", *self.args)

    @classmethod
    def backward_torch(cls, printer: TorchCode, g: Expr, *args: Expr) -> str:
        return aten(printer, "gelu_backward", g, *args)


class gelu_tanh(Primitive):  # noqa: N801
    """u (1 + tanh(z)) / 2 with z = sqrt(2/pi) (u + 0.044715 u**3), which is u sigmoid(2 z) exactly.

    Forward (and fused mode) runs the sigmoid form: one sigmoid instead of tanh, ten times
    slower on CPU, and no cancellation in 1 + tanh(z) for negative u. Backward keeps
    PyTorch's kernel: the sigmoid form needs more temporaries than it saves time.
    """

    nargs = 1
    backward_differentiable = True
    fast = False
    kappa = sympy.Rational("0.044715")

    def elementary(self) -> Expr:
        u = self.args[0]
        return u * (1 + sympy.tanh(sympy.sqrt(2 / sympy.pi) * (u + self.kappa * u**3))) / 2

    def fused_form(self) -> Expr:
        u = self.args[0]
        return u * fn.sigmoid(2 * sympy.sqrt(2 / sympy.pi) * (u + self.kappa * u**3))

    def _torch(self, printer: TorchCode) -> str:
        if not printer.no_grad:
            return functional(printer, "gelu", *self.args, extra='approximate="tanh"')
        # u * sigmoid(2c u (1 + kappa u**2)), c = sqrt(2 / pi) (`fused_form`)
        u = printer._print(self.args[0])
        kappa, scale = printer._print(self.kappa), printer._print(2 * sympy.sqrt(2 / sympy.pi))
        return f"{u}.square().mul_({kappa}).add_(1).mul_({u}).mul_({scale}).sigmoid_().mul_({u})"

    @classmethod
    def backward_torch(cls, printer: TorchCode, g: Expr, *args: Expr) -> str:
        return aten(printer, "gelu_backward", g, *args, 'approximate="tanh"')


class softplus_beta(Primitive):  # noqa: N801
    """softplus(beta * u) / beta, as F.softplus(u, beta) (linear where beta * u > 20, as PyTorch)."""

    nargs = 2
    backward_differentiable = True

    def elementary(self) -> Expr:
        return fn.softplus(self.args[1] * self.args[0]) / self.args[1]

    def _torch(self, printer: TorchCode) -> str:
        return functional(printer, "softplus", *self.args)

    @classmethod
    def backward_torch(cls, printer: TorchCode, g: Expr, *args: Expr) -> str:
        return aten(printer, "softplus_backward", g, *args, "20.0")


class elu(Primitive):  # noqa: N801
    fast = False  # inductor's fused loop beats PyTorch's kernels (measured, fused mode)
    nargs = 2
    backward_differentiable = True

    def elementary(self) -> Expr:
        u, alpha = self.args
        return fn.where(sympy.StrictGreaterThan(u, 0), u, alpha * fn.expm1(u))

    def _torch(self, printer: TorchCode) -> str:
        return functional(printer, "elu", *self.args)

    @classmethod
    def backward_torch(cls, printer: TorchCode, g: Expr, *args: Expr) -> str:
        u, alpha = args
        return aten(printer, "elu_backward", g, alpha, "1", "1", "False", u)


class leaky_relu(Primitive):  # noqa: N801
    """where(u > 0, u, slope * u): the slope below 0 and at 0 itself, as PyTorch's kernels."""

    nargs = 2
    backward_differentiable = True

    def elementary(self) -> Expr:
        u, slope = self.args
        return fn.where(sympy.StrictGreaterThan(u, 0), u, slope * u)

    def _torch(self, printer: TorchCode) -> str:
        return functional(printer, "leaky_relu", *self.args)

    def mask(self) -> Expr | None:
        return sympy.StrictGreaterThan(self.args[0], 0)  # Note [saved masks] in opgen.nodes.kernels

    @classmethod
    def backward_torch(cls, printer: TorchCode, g: Expr, *args: Expr) -> str:
        return aten(printer, "leaky_relu_backward", g, *args, "False")


# -- lowering patterns (opgen.optimize.lower) --------------------------------------------------------


def _match_silu(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, sympy.Mul):
        return None
    for factor in node.args:
        if isinstance(factor, fn.sigmoid) and divided(node, factor) == factor.args[0]:
            return silu(factor.args[0])
    return None


def _match_log_sigmoid(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    return log_sigmoid(node.args[0]) if isinstance(node, logsigmoid) else None


def _match_mish(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, sympy.Mul):
        return None
    for factor in node.args:
        if isinstance(factor, sympy.tanh) and isinstance(factor.args[0], fn.softplus):
            u = factor.args[0].args[0]
            if divided(node, factor) == u:
                return mish(u)
    return None


def _match_gelu(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, sympy.Mul):
        return None
    for e in node.atoms(sympy.erf):
        u = sympy.expand(e.args[0] * sympy.sqrt(2))
        if same(node, gelu(u).elementary()):
            return gelu(u)
    for t in node.atoms(sympy.tanh):
        for u in sorted(tensors(t, numbers), key=sympy.default_sort_key):
            if same(node, gelu_tanh(u).elementary()):
                return gelu_tanh(u)
    return None


def _match_softplus(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, sympy.Mul):
        return None
    for factor in node.args:
        if isinstance(factor, fn.softplus) and tensors(factor, numbers):  # of a number: `math`, not a kernel
            beta, u = factor.args[0].as_independent(*tensors(factor, numbers), as_Add=False)
            if beta != 1 and divided(node, factor) == 1 / beta:
                return softplus_beta(u, beta)
    return None


def _match_elu(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, fn.where):
        return None
    cond, u, other = node.args
    if cond != sympy.StrictGreaterThan(u, 0) or not tensors(u, numbers):
        return None
    alpha = divided(other, fn.expm1(u)) if isinstance(other, sympy.Mul) else (S.One if other == fn.expm1(u) else None)
    if alpha is None or tensors(alpha, numbers):
        return None
    return elu(u, alpha)


def _match_leaky_relu(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, fn.where):
        return None
    cond, u, other = node.args
    if cond != sympy.StrictGreaterThan(u, 0) or not tensors(u, numbers):
        return None
    slope = divided(other, u)
    if slope is None or tensors(slope, numbers):
        return None
    return leaky_relu(u, slope)


LOWERINGS: tuple[Lowering, ...] = (
    _match_silu,
    _match_log_sigmoid,
    _match_mish,
    _match_gelu,
    _match_softplus,
    _match_elu,
    _match_leaky_relu,
)
