"""Clips and shrinks PyTorch computes in one kernel: hardtanh, hardsigmoid, hardswish, hardshrink.

Each primitive (opgen.nodes.kernels) with its formula, its lowering pattern (`LOWERINGS`, tried in
order by opgen.optimize.lower: a clip first, then the clip a hardsigmoid or hardswish holds), its
call and its backward kernel. Their gradients at the kinks are the formulas' (Note [kinks of
lowered primitives] in opgen.nodes.kernels).
"""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn
from opgen.nodes.base import TorchCode
from opgen.nodes.kernels import Lowering, Primitive, SavedMask, aten, functional, tensors


class hardtanh(Primitive):  # noqa: N801
    """max(min(u, hi), lo): gradient 1 strictly between the bounds, 0 at them (F.hardtanh).

    F.hardtanh refuses lo > hi, where the formula would be the constant lo: a clear error
    for what is almost surely a mistake in the arguments.
    """

    nargs = 3
    backward_differentiable = True

    def elementary(self) -> Expr:
        u, lo, hi = self.args
        return fn.maximum(fn.minimum(u, hi, S.Zero), lo, S.Zero)

    def _torch(self, printer: TorchCode) -> str:
        return functional(printer, "hardtanh", *self.args)

    @classmethod
    def backward_torch(cls, printer: TorchCode, g: Expr, *args: Expr) -> str:
        return aten(printer, "hardtanh_backward", g, *args)


class hardsigmoid(Primitive):  # noqa: N801
    """max(min(u + 3, 6), 0) / 6: gradient 1/6 strictly inside (-3, 3), 0 at the kinks (F.hardsigmoid).

    `clamp` would pass the gradient at the kinks: not this function's derivative there.
    PyTorch's backward kernel has no derivative: double backward uses the formula.
    """

    nargs = 1
    native_twice = False

    def elementary(self) -> Expr:
        return hardtanh(self.args[0] + 3, S.Zero, sympy.Integer(6)).elementary() / 6

    def _torch(self, printer: TorchCode) -> str:
        return functional(printer, "hardsigmoid", *self.args)

    @classmethod
    def backward_torch(cls, printer: TorchCode, g: Expr, *args: Expr) -> str:
        return aten(printer, "hardsigmoid_backward", g, *args)


class hardswish(Primitive):  # noqa: N801
    """u * hardsigmoid(u): the gradient at the kinks is the formula's, 0 at -3 and 1 at 3 (F.hardswish)."""

    nargs = 1
    backward_differentiable = True

    def elementary(self) -> Expr:
        return self.args[0] * hardsigmoid(self.args[0]).elementary()

    def _torch(self, printer: TorchCode) -> str:
        return functional(printer, "hardswish", *self.args)

    @classmethod
    def backward_torch(cls, printer: TorchCode, g: Expr, *args: Expr) -> str:
        return aten(printer, "hardswish_backward", g, *args)


class hardshrink(Primitive):  # noqa: N801
    """where(|u| > lambd, u, 0): u outside [-lambd, lambd], 0 inside and at its ends (F.hardshrink).

    Its gradient is 1 outside and 0 at the ends, the formula's; a negative lambd leaves no inside,
    for the kernel as for the formula (u everywhere), so every lambd lowers. Backward runs
    `threshold_backward(g, |u|, lambd)`, which is `aten.hardshrink_backward` to the bit (NaN too) but,
    unlike it, runs on symbolic shapes (torch 2.13: torch.compile with dynamic shapes, opcheck).
    """

    nargs = 2
    backward_differentiable = True

    def elementary(self) -> Expr:
        u, lambd = self.args
        return fn.where(sympy.StrictGreaterThan(sympy.Abs(u), lambd), u, S.Zero)

    def _torch(self, printer: TorchCode) -> str:
        return functional(printer, "hardshrink", *self.args)

    def mask(self) -> Expr | None:
        u, lambd = self.args
        return sympy.StrictGreaterThan(sympy.Abs(u), lambd)  # Note [saved masks] in opgen.nodes.kernels

    @classmethod
    def backward_torch(cls, printer: TorchCode, g: Expr, *args: Expr) -> str:
        u, lambd = args
        if isinstance(u, SavedMask):  # `g` where the mask holds: past `threshold` 0
            return aten(printer, "threshold_backward", g, u, "0")
        return aten(printer, "threshold_backward", g, sympy.Abs(u), lambd)


# -- lowering patterns (opgen.optimize.lower) --------------------------------------------------------


def _bound(node: Expr, kind: type[sympy.Function], numbers: frozenset[sympy.Symbol]) -> tuple[Expr, Expr] | None:
    """(operand, number) when `node` is `kind(operand, number)` in either order."""
    if not isinstance(node, kind) or node.args[2] != 0:
        return None
    a, b = node.args[0], node.args[1]
    if not tensors(b, numbers):
        return a, b
    if not tensors(a, numbers):
        return b, a
    return None


def _match_hardtanh(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    """max(min(u, hi), lo) or min(max(u, lo), hi): the same function and gradient when lo < hi."""
    for outer, inner in ((fn.maximum, fn.minimum), (fn.minimum, fn.maximum)):
        found = _bound(node, outer, numbers)
        inside = _bound(found[0], inner, numbers) if found else None
        if found and inside and tensors(inside[0], numbers):
            lo, hi = (found[1], inside[1]) if outer is fn.maximum else (inside[1], found[1])
            if (lo - hi).is_number and not (lo - hi).is_negative:
                return None  # constant bounds the wrong way round: keep the formula's meaning
            if not (lo - hi).is_number:  # Note [parameters of lowered primitives] in opgen.nodes.kernels
                lo, hi = (lo, sympy.Max(lo, hi)) if outer is fn.maximum else (sympy.Min(lo, hi), hi)
            return hardtanh(inside[0], lo, hi)
    return None


def _clipped(factor: Expr) -> tuple[Expr, Expr] | None:
    """(u, hi) when `factor` is `hardtanh(v, 0, hi)` = `hi * hardsigmoid(u)`, hi a positive number."""
    if isinstance(factor, hardsigmoid):
        return factor.args[0], S.One
    if not isinstance(factor, hardtanh) or factor.args[1] != 0 or not factor.args[2].is_Number:
        return None
    v, hi = factor.args[0], factor.args[2]
    return (6 * v / hi - 3, hi) if hi.is_positive else None


def _match_hard(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    """`u * min(max(u + 3, 0), 6) / 6` -> hardswish(u), `min(max(u + 3, 0), 6) / 6` -> hardsigmoid(u).

    Any clip to [0, hi] of an affine `v` is `hi * hardsigmoid(6 v / hi - 3)`, with the same zero
    slope at the clip points (Note [kinks of lowered primitives]); it becomes hardswish where the
    rest of the product holds `u`, hardsigmoid where `u` is simpler than `v` (`x + 3`, `x / 6 + 1/2`),
    and stays a clip otherwise (relu6). Only plain numbers: a bound given as an input is left alone.
    """
    for factor in sympy.Mul.make_args(node):
        found = _clipped(factor)
        if found is None or not tensors(found[0], numbers):
            continue
        u, hi = found
        rest = hi * node / factor
        scale, body = u.as_coeff_Mul()
        if body in sympy.Mul.make_args(rest):
            return hardswish(u) * (rest / u)
        if not isinstance(factor, hardsigmoid) and sympy.count_ops(hardsigmoid(u) * rest) < sympy.count_ops(node):
            return hardsigmoid(u) * rest
    return None


def _match_hardshrink(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    """`where(|u| > lambd, u, 0)`, or `where(|u| <= lambd, 0, u)`, -> hardshrink(u, lambd), lambd a number.

    Not `where(|u| >= lambd, u, 0)`: at |u| = lambd it is u, where the kernel gives 0.
    """
    if not isinstance(node, fn.where) or not isinstance(node.args[0], sympy.core.relational.Relational):
        return None
    cond, a, b = node.args
    if isinstance(cond, (sympy.StrictGreaterThan, sympy.StrictLessThan)):
        size, lambd, kept, zero = cond.gts, cond.lts, a, b  # |u| > lambd: u, else 0
    elif isinstance(cond, (sympy.GreaterThan, sympy.LessThan)):
        size, lambd, kept, zero = cond.lts, cond.gts, b, a  # |u| <= lambd: 0, else u
    else:
        return None
    if not isinstance(size, sympy.Abs) or size.args[0] != kept or zero != 0:
        return None
    if not tensors(kept, numbers) or tensors(lambd, numbers):
        return None
    return hardshrink(kept, lambd)


LOWERINGS: tuple[Lowering, ...] = (_match_hardtanh, _match_hard, _match_hardshrink)
