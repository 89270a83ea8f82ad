"""Losses of a difference PyTorch computes in one kernel: the Huber function and smooth L1.

Each primitive (opgen.nodes.kernels) with its formula, its lowering pattern (`LOWERINGS`, tried by
opgen.optimize.lower), its call and its backward kernel, both given the difference's two sides where
it has them (Note [losses of a difference]) and the formula where the kernel refuses the bound
(Note [parameters of lowered primitives] in opgen.nodes.kernels).

Note [losses of a difference]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
PyTorch's Huber and smooth L1 kernels take an input and a target and compute their
difference inside their one pass, forward and backward; the primitives hold the difference
`d`. Where `d` is `a - b` of two tensors, the kernels are called on `a` and `b` (a pass and a
buffer fewer each way) and broadcast them as `a - b` does; elsewhere on `d` and a zero target
that costs no memory.
"""

from __future__ import annotations

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn
from opgen.nodes.base import TorchCode
from opgen.nodes.clips import hardtanh
from opgen.nodes.kernels import Lowering, Primitive, aten, functional, same, tensors


class huber(Primitive):  # noqa: N801
    """The Huber function of a difference `d`, quadratic within delta of 0 and linear beyond.

    PyTorch's kernels take an input and a target; the target here is a zero that costs no
    memory (`expand_as`), so one kernel pass replaces three selects, each slow on CPU.
    F.huber_loss refuses delta <= 0, where the formula would be linear everywhere: a clear
    error for what is almost surely a mistake in the arguments. `huber_loss_backward` has a
    reverse-mode derivative but no forward-mode one (torch 2.13: `jacfwd` of a gradient fails),
    so a recorded backward takes the formula, as for kernels without a derivative.
    """

    nargs = 2
    backward_differentiable = False
    backward_why = "no forward-mode derivative"
    native_twice = False  # F.huber_loss's gradient has no forward-mode derivative either

    def prime_form(self) -> Expr | None:
        """d itself within delta of 0, delta * sign(d) beyond: d clipped, with a zero gradient at the
        clip points as the formula's (as F.hardtanh's); delta <= 0, which F.hardtanh's bounds refuse,
        the linear branch (Note [parameters of lowered primitives])."""
        d, delta = self.args
        if delta.is_positive:
            return hardtanh(d, -delta, delta)
        return fn.where(
            sympy.StrictGreaterThan(delta, 0), hardtanh(d, -sympy.Abs(delta), sympy.Abs(delta)), delta * fn.sign(d)
        )

    def elementary(self) -> Expr:
        d, delta = self.args
        quadratic, linear = d**2 / 2, delta * (sympy.Abs(d) - delta / 2)
        return fn.where(sympy.StrictLessThan(sympy.Abs(d), delta), quadratic, linear)

    def _torch(self, printer: TorchCode) -> str:
        d, delta = self.args
        if _difference(printer, d):  # F.huber_loss warns where the shapes differ; its kernel broadcasts them
            kernel = aten(printer, "huber_loss", *_loss_pair(printer, d), "0", delta)
        else:
            target = f'{_zeros_like(printer, d)}, reduction="none", delta={printer._print(delta)}'
            kernel = functional(printer, "huber_loss", d, extra=target)
        return _within(printer, kernel, delta, "> 0", self.elementary())

    @classmethod
    def backward_torch(cls, printer: TorchCode, g: Expr, *args: Expr) -> str:
        d, delta = args
        kernel = aten(printer, "huber_loss_backward", g, *_loss_pair(printer, d), "0", delta)
        return _within(printer, kernel, delta, "> 0", g * delta * fn.sign(d))  # delta <= 0: the linear branch


class smooth_l1(Primitive):  # noqa: N801
    """huber(d, beta) / beta: PyTorch's smooth L1, its kernels given a zero target as huber's.

    The derivative shared between gradients is d / beta clipped to [-1, 1], and at beta = 0, where
    F.smooth_l1_loss is the L1 loss, sign(d) (0 at d = 0, as l1_loss; the clip would be NaN there and
    `smooth_l1_loss_backward` gives -1); F.smooth_l1_loss refuses beta < 0.
    """

    nargs = 2
    backward_differentiable = True

    def prime_form(self) -> Expr | None:
        d, beta = self.args
        clipped = hardtanh(d / beta, S.NegativeOne, S.One)
        return clipped if beta.is_positive else fn.where(sympy.StrictGreaterThan(beta, 0), clipped, fn.sign(d))

    def elementary(self) -> Expr:
        d, beta = self.args
        return fn.where(sympy.StrictLessThan(sympy.Abs(d), beta), d**2 / (2 * beta), sympy.Abs(d) - beta / 2)

    def _torch(self, printer: TorchCode) -> str:
        d, beta = self.args
        if _difference(printer, d) and beta.is_positive:  # beta = 0: F.smooth_l1_loss calls l1_loss
            return aten(printer, "smooth_l1_loss", *_loss_pair(printer, d), "0", beta)
        target = f'{_zeros_like(printer, d)}, reduction="none", beta={printer._print(beta)}'
        kernel = functional(printer, "smooth_l1_loss", d, extra=target)
        return _within(printer, kernel, beta, ">= 0", self.elementary())

    @classmethod
    def backward_torch(cls, printer: TorchCode, g: Expr, *args: Expr) -> str:
        d, beta = args
        kernel = aten(printer, "smooth_l1_loss_backward", g, *_loss_pair(printer, d), "0", beta)
        # beta = 0 is the L1 loss (F.smooth_l1_loss calls l1_loss there): the kernel's slope at d = 0 is -1;
        # beta < 0, which the kernel refuses, the linear branch.
        return _within(printer, kernel, beta, "> 0", g * fn.sign(d))


# -- spelling ----------------------------------------------------------------------------------------


def _difference(printer: TorchCode, d: sympy.Basic) -> tuple[sympy.Basic, sympy.Basic] | None:
    """(a, b) when the difference `d` is `a - b` of two tensors (Note [losses of a difference]), else None."""
    if not isinstance(d, sympy.Add) or len(d.args) != 2:
        return None
    for a, negated in (d.args, d.args[::-1]):
        b = -negated
        if negated.could_extract_minus_sign() and printer.is_tensor(a) and printer.is_tensor(b):
            return a, b
    return None


def _zeros_like(printer: TorchCode, expr: sympy.Basic) -> str:
    """A zero tensor of `expr`'s shape that costs no memory (the loss kernels' target)."""
    value = printer._print(expr)
    operand = value if isinstance(expr, (sympy.Symbol, sympy.Function)) else f"({value})"
    return f"{operand}.new_zeros(()).expand_as({value})"


def _loss_pair(printer: TorchCode, d: sympy.Basic) -> tuple[str, str]:
    """The input and target a loss kernel of the difference `d` takes: `a, b`, or `d` and a zero."""
    pair = _difference(printer, d)
    return (printer._print(pair[0]), printer._print(pair[1])) if pair else (printer._print(d), _zeros_like(printer, d))


def _within(printer: TorchCode, kernel: str, bound: sympy.Basic, test: str, formula: sympy.Basic) -> str:
    """`kernel` where `bound` passes `test` (`> 0`), else `formula`: a kernel that refuses some values
    of a parameter input computes the formula there (Note [parameters of lowered primitives])."""
    if (bound.is_positive if test == "> 0" else bound.is_nonnegative) or printer.is_tensor(bound):
        return kernel
    return f"({kernel} if {printer._print(bound)} {test} else {printer._print(formula)})"


# -- lowering patterns (opgen.optimize.lower) --------------------------------------------------------


def _band(node: Expr, numbers: frozenset[sympy.Symbol]) -> tuple[Expr, Expr, Expr, Expr] | None:
    """(d, bound, inside, outside) when `node` is `where(|d| < bound, inside, outside)`, the bound a number.

    `<=` and the test turned round (`|d| >= bound`, branches swapped) are read the same way: the
    caller checks that both branches agree at `|d| = bound`, in value and in slope (Note [kinks of
    lowered primitives] in opgen.nodes.kernels).
    """
    if not isinstance(node, fn.where) or not isinstance(node.args[0], sympy.core.relational.Relational):
        return None
    cond, a, b = node.args
    if isinstance(cond, (sympy.StrictGreaterThan, sympy.GreaterThan)):
        a, b = b, a
    elif not isinstance(cond, (sympy.StrictLessThan, sympy.LessThan)):
        return None
    size, bound = cond.args
    if not isinstance(size, sympy.Abs) or tensors(bound, numbers) or (bound.is_number and not bound.is_positive):
        return None
    return size.args[0], bound, a, b


def _match_band(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    """The Huber function `where(|d| < delta, d**2 / 2, delta * (|d| - delta / 2))`, and smooth L1, its
    quotient by delta: at |d| = delta both branches have the same value and slope, so `<` and `<=` agree."""
    band = _band(node, numbers)
    if band is None:
        return None
    d, bound, _, _ = band
    for primitive in (huber, smooth_l1):
        formula = primitive(d, bound).elementary()
        if same(fn.where(sympy.StrictLessThan(sympy.Abs(d), bound), *band[2:]), formula):
            return primitive(d, bound)
    return None


LOWERINGS: tuple[Lowering, ...] = (_match_band,)
