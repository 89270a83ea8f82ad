"""The kernel IR: SymPy nodes for PyTorch's native kernels, forward and backward.

`lower` replaces a subformula that is exactly a PyTorch primitive by its node (`silu(u)`,
`softplus_beta(u, beta)`, ...); differentiating a primitive gives `_Prime`, its derivative
in the tensor argument; opgen.optimize.backward_kernels turns a gradient `g * prime(u)` into
the node of PyTorch's backward kernel (`silu_backward(g, u)`). The nodes hold no code: the
torch printer prints each one with its `_print_<node>` method (opgen.emit.kernel_print), the
docstring printer as its formula.

Note [native backward kernels]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A primitive's backward kernel (`aten.silu_backward`, ...) does in one pass what the
derivative formula does in four or five, each allocating a tensor. Some of these kernels
have a derivative of their own in PyTorch (gelu, softplus, elu, sigmoid, tanh): backward
calls them always, and double backward goes through PyTorch's formulas. The others (silu)
are used only when autograd is not recording (`torch.is_grad_enabled()` is false in
backward unless `create_graph=True`); when it is, backward uses the derivative formula,
built from differentiable ops as Note [what backward may use] requires. A primitive may
compute the unrecorded case in place instead of by its kernel (`backward_in_place`: mish,
whose PyTorch kernels are slow on CPU, and logsigmoid, whose kernel needs a buffer; see
opgen.emit.kernel_lines and Note [forward in place]).

"""

from __future__ import annotations

import functools

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn
from opgen.nodes.base import Node
from opgen.nodes.stable import logsigmoid
from opgen.optimize.rewrite import rewrite


class _Primitive(Node, sympy.Function):
    """A PyTorch primitive: `args[0]` is the tensor, the others plain numbers.

    A node of the formula, printed by the torch printer's `_print_<name>` (opgen.emit.kernel_print)
    as the primitive's call; its gradient `g * prime(u)` becomes the node `backward(g, *args)`,
    printed as PyTorch's backward kernel (Note [native backward kernels]).
    """

    is_real = True
    backward_differentiable = False  # PyTorch's backward kernel has a derivative of its own
    backward_why = "no derivative"  # why a recorded backward takes the formula, when it does
    native_twice = True  # PyTorch's own op (F.hardsigmoid: no) has second and forward-mode derivatives
    # Unrecorded backward works in place on its own temporaries instead of the kernel (opgen.emit.kernel_lines).
    backward_in_place = False
    fast = True  # fused mode leaves it alone: PyTorch's kernels are as quick as a compiled loop

    def fused_form(self) -> Expr:
        """The formula fused mode compiles (opgen.emit.fuse): the same function, cheap to fuse."""
        return self.elementary()

    def prime_form(self) -> Expr | None:
        """The derivative alone as one call, where backward shares it between gradients; None: its formula."""
        return None

    def fdiff(self, argindex: int = 1) -> Expr:
        if argindex == 1:
            return _Prime(self.func.__name__, *self.args)
        t = sympy.Dummy("t", real=True)
        args = list(self.args)
        args[argindex - 1] = t
        return rewrite(sympy.diff(self.func(*args).elementary(), t)).xreplace({t: self.args[argindex - 1]})

    def _eval_evalf(self, prec: int) -> Expr | None:
        if all(a.is_number for a in self.args):
            return self.elementary().evalf(prec)
        return None


class silu(_Primitive):  # noqa: N801 - torch's names
    nargs = 1

    def elementary(self) -> Expr:
        return self.args[0] * fn.sigmoid(self.args[0])


class log_sigmoid(_Primitive):  # noqa: N801
    """logsigmoid(u) (opgen.optimize.rewrite); its backward kernel needs a buffer forward would have to save."""

    nargs = 1
    backward_in_place = True

    def elementary(self) -> Expr:
        return logsigmoid(self.args[0])


class mish(_Primitive):  # noqa: N801
    nargs = 1
    backward_in_place = True  # PyTorch's mish kernels are slow on CPU
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


class gelu(_Primitive):  # noqa: N801
    fast = False  # inductor's fused loop beats PyTorch's kernels (measured, fused mode)
    nargs = 1
    backward_differentiable = True

    def elementary(self) -> Expr:
        return self.args[0] * (1 + sympy.erf(self.args[0] / sympy.sqrt(2))) / 2


class gelu_tanh(_Primitive):  # noqa: N801
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


class softplus_beta(_Primitive):  # noqa: N801
    """softplus(beta * u) / beta, as F.softplus(u, beta) (linear where beta * u > 20, as PyTorch)."""

    nargs = 2
    backward_differentiable = True

    def elementary(self) -> Expr:
        return fn.softplus(self.args[1] * self.args[0]) / self.args[1]


class elu(_Primitive):  # noqa: N801
    fast = False  # inductor's fused loop beats PyTorch's kernels (measured, fused mode)
    nargs = 2
    backward_differentiable = True

    def elementary(self) -> Expr:
        u, alpha = self.args
        return fn.where(sympy.StrictGreaterThan(u, 0), u, alpha * fn.expm1(u))


class leaky_relu(_Primitive):  # noqa: N801
    """where(u > 0, u, slope * u): the slope below 0 and at 0 itself, as PyTorch's kernels."""

    nargs = 2
    backward_differentiable = True

    def elementary(self) -> Expr:
        u, slope = self.args
        return fn.where(sympy.StrictGreaterThan(u, 0), u, slope * u)


class hardtanh(_Primitive):  # noqa: N801
    """max(min(u, hi), lo): gradient 1 strictly between the bounds, 0 at them (F.hardtanh).

    F.hardtanh refuses lo > hi, where the formula would be the constant lo: a clear error
    for what is almost surely a mistake in the arguments.
    """

    nargs = 3
    backward_differentiable = True

    def elementary(self) -> Expr:
        u, lo, hi = self.args
        return fn.maximum(fn.minimum(u, hi, S.Zero), lo, S.Zero)


class huber(_Primitive):  # noqa: N801
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


class smooth_l1(_Primitive):  # noqa: N801
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


class hardsigmoid(_Primitive):  # noqa: N801
    """max(min(u + 3, 6), 0) / 6: gradient 1/6 strictly inside (-3, 3), 0 at the kinks (F.hardsigmoid).

    `clamp` would pass the gradient at the kinks: not this function's derivative there.
    PyTorch's backward kernel has no derivative: double backward uses the formula.
    """

    nargs = 1
    native_twice = False

    def elementary(self) -> Expr:
        return hardtanh(self.args[0] + 3, S.Zero, sympy.Integer(6)).elementary() / 6


class hardswish(_Primitive):  # noqa: N801
    """u * hardsigmoid(u): the gradient at the kinks is the formula's, 0 at -3 and 1 at 3 (F.hardswish)."""

    nargs = 1
    backward_differentiable = True

    def elementary(self) -> Expr:
        return self.args[0] * hardsigmoid(self.args[0]).elementary()


PRIMITIVES: dict[str, type[_Primitive]] = {
    c.__name__: c
    for c in (
        silu,
        log_sigmoid,
        mish,
        gelu,
        gelu_tanh,
        softplus_beta,
        elu,
        leaky_relu,
        hardtanh,
        huber,
        smooth_l1,
        hardsigmoid,
        hardswish,
    )
}


class _Prime(Node, sympy.Function):
    """The derivative of a primitive in its tensor argument: `args` = (name, *primitive args)."""

    is_real = True

    def __new__(cls, name: str | sympy.Symbol, *args: Expr) -> Expr:
        tag = name if isinstance(name, sympy.Symbol) else sympy.Symbol(name)
        return super().__new__(cls, tag, *args)

    @property
    def primitive(self) -> type[_Primitive]:
        return PRIMITIVES[str(self.args[0])]

    def elementary(self) -> Expr:
        """The derivative as a formula: of the primitive's `elementary()`."""
        return _prime_formula(str(self.args[0]), "elementary", tuple(self.args[2:])).xreplace({_T: self.args[1]})

    def fused_form(self) -> Expr:
        """The derivative of the primitive's `fused_form()`, the formula fused mode compiles."""
        return _prime_formula(str(self.args[0]), "fused_form", tuple(self.args[2:])).xreplace({_T: self.args[1]})

    def _eval_derivative(self, s: sympy.Symbol) -> Expr:
        return sympy.diff(self.elementary(), s)

    def _eval_evalf(self, prec: int) -> Expr | None:
        return self.elementary().evalf(prec)

    @property
    def free_symbols(self) -> set[sympy.Basic]:
        return set().union(*(a.free_symbols for a in self.args[1:]))


_T = sympy.Dummy("t", real=True)  # the tensor argument of `_prime_formula`'s primitive


@functools.lru_cache(maxsize=512)
def _prime_formula(name: str, form: str, rest: tuple[Expr, ...]) -> Expr:
    """d primitive(_T, *rest) / d _T, rewritten: `_Prime.elementary` before its argument goes in.
    Differentiated once per primitive, form and other arguments, not at every docstring, jvp and
    double backward that shows a kernel's derivative (tens of milliseconds each)."""
    primitive = PRIMITIVES[name](_T, *rest)
    return rewrite(sympy.diff(primitive.fused_form() if form == "fused_form" else primitive.elementary(), _T))
