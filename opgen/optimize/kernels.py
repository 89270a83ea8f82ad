"""The kernel IR: SymPy nodes for PyTorch's native kernels, forward and backward.

`lower` replaces a subformula that is exactly a PyTorch primitive by its node (`silu(u)`,
`softplus_beta(u, beta)`, ...); differentiating a primitive gives `Prime`, its derivative
in the tensor argument; `backward_kernel` turns a gradient `g * prime(u)` into the node of
PyTorch's backward kernel (`silu_backward(g, u)`), or `g * s * (1 - s)` of a saved sigmoid into
`sigmoid_backward(g, s)`. Which derivatives become a kernel call is the plan's choice
(opgen.plan.kernel_calls); those that do not are written out by `written_out`. The nodes hold no
code: the torch printer prints each one with its `_print_<node>` method (opgen.emit.kernel_print),
the docstring printer as its formula.

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
from typing import ClassVar

import sympy
from sympy import Expr, S

from opgen.formula import functions as fn
from opgen.optimize.rewrite import rewrite
from opgen.optimize.stable_functions import logsigmoid


class Primitive(sympy.Function):
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

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        raise NotImplementedError

    @classmethod
    def fused_form(cls, *args: Expr) -> Expr:
        """The formula fused mode compiles (opgen.emit.fuse): the same function, cheap to fuse."""
        return cls.elementary(*args)

    @classmethod
    def prime_form(cls, *args: Expr) -> Expr | None:
        """The derivative alone as one call, where backward shares it between gradients; None: its formula."""
        return None

    def fdiff(self, argindex: int = 1) -> Expr:
        if argindex == 1:
            return Prime(self.func.__name__, *self.args)
        t = sympy.Dummy("t", real=True)
        args = list(self.args)
        args[argindex - 1] = t
        return rewrite(sympy.diff(self.elementary(*args), t)).xreplace({t: self.args[argindex - 1]})

    def _eval_evalf(self, prec: int) -> Expr | None:
        if all(a.is_number for a in self.args):
            return self.elementary(*self.args).evalf(prec)
        return None


class silu(Primitive):  # noqa: N801 - torch's names
    nargs = 1

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        return args[0] * fn.sigmoid(args[0])


class log_sigmoid(Primitive):  # noqa: N801
    """logsigmoid(u) (opgen.optimize.rewrite); its backward kernel needs a buffer forward would have to save."""

    nargs = 1
    backward_in_place = True

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        return logsigmoid(args[0])


class mish(Primitive):  # noqa: N801
    nargs = 1
    backward_in_place = True  # PyTorch's mish kernels are slow on CPU
    fast = False
    native_twice = False  # F.mish's second derivative is NaN from x = 100 in float32 (1e4 in float64), where it is 0

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        return args[0] * sympy.tanh(fn.softplus(args[0]))

    @classmethod
    def fused_form(cls, *args: Expr) -> Expr:
        """tanh(softplus(u)) = s (2 - s) / (1 + (1 - s)**2) with s = sigmoid(u), exactly.

        One sigmoid instead of softplus and tanh (tanh is ten times slower than sigmoid on
        CPU), with no cancellation or overflow anywhere: s lies in [0, 1].
        """
        s = fn.sigmoid(args[0])
        return args[0] * s * (2 - s) / (1 + (1 - s) ** 2)


class gelu(Primitive):  # noqa: N801
    fast = False  # inductor's fused loop beats PyTorch's kernels (measured, fused mode)
    nargs = 1
    backward_differentiable = True

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        return args[0] * (1 + sympy.erf(args[0] / sympy.sqrt(2))) / 2


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

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        u = args[0]
        return u * (1 + sympy.tanh(sympy.sqrt(2 / sympy.pi) * (u + cls.kappa * u**3))) / 2

    @classmethod
    def fused_form(cls, *args: Expr) -> Expr:
        u = args[0]
        return u * fn.sigmoid(2 * sympy.sqrt(2 / sympy.pi) * (u + cls.kappa * u**3))


class softplus_beta(Primitive):  # noqa: N801
    """softplus(beta * u) / beta, as F.softplus(u, beta) (linear where beta * u > 20, as PyTorch)."""

    nargs = 2
    backward_differentiable = True

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        return fn.softplus(args[1] * args[0]) / args[1]


class elu(Primitive):  # noqa: N801
    fast = False  # inductor's fused loop beats PyTorch's kernels (measured, fused mode)
    nargs = 2
    backward_differentiable = True

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        u, alpha = args
        return fn.where(sympy.StrictGreaterThan(u, 0), u, alpha * fn.expm1(u))


class leaky_relu(Primitive):  # noqa: N801
    """where(u > 0, u, slope * u): the slope below 0 and at 0 itself, as PyTorch's kernels."""

    nargs = 2
    backward_differentiable = True

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        u, slope = args
        return fn.where(sympy.StrictGreaterThan(u, 0), u, slope * u)


class hardtanh(Primitive):  # noqa: N801
    """max(min(u, hi), lo): gradient 1 strictly between the bounds, 0 at them (F.hardtanh).

    F.hardtanh refuses lo > hi, where the formula would be the constant lo: a clear error
    for what is almost surely a mistake in the arguments.
    """

    nargs = 3
    backward_differentiable = True

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        u, lo, hi = args
        return fn.maximum(fn.minimum(u, hi, S.Zero), lo, S.Zero)


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

    @classmethod
    def prime_form(cls, *args: Expr) -> Expr | None:
        """d itself within delta of 0, delta * sign(d) beyond: d clipped, with a zero gradient at the
        clip points as the formula's (as F.hardtanh's); delta <= 0, which F.hardtanh's bounds refuse,
        the linear branch (Note [parameters of lowered primitives])."""
        d, delta = args
        if delta.is_positive:
            return hardtanh(d, -delta, delta)
        return fn.where(
            sympy.StrictGreaterThan(delta, 0), hardtanh(d, -sympy.Abs(delta), sympy.Abs(delta)), delta * fn.sign(d)
        )

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        d, delta = args
        quadratic, linear = d**2 / 2, delta * (sympy.Abs(d) - delta / 2)
        return fn.where(sympy.StrictLessThan(sympy.Abs(d), delta), quadratic, linear)


class smooth_l1(Primitive):  # noqa: N801
    """huber(d, beta) / beta: PyTorch's smooth L1, its kernels given a zero target as huber's.

    The derivative shared between gradients is d / beta clipped to [-1, 1], and at beta = 0, where
    F.smooth_l1_loss is the L1 loss, sign(d) (0 at d = 0, as l1_loss; the clip would be NaN there and
    `smooth_l1_loss_backward` gives -1); F.smooth_l1_loss refuses beta < 0.
    """

    nargs = 2
    backward_differentiable = True

    @classmethod
    def prime_form(cls, *args: Expr) -> Expr | None:
        d, beta = args
        clipped = hardtanh(d / beta, S.NegativeOne, S.One)
        return clipped if beta.is_positive else fn.where(sympy.StrictGreaterThan(beta, 0), clipped, fn.sign(d))

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        d, beta = args
        return fn.where(sympy.StrictLessThan(sympy.Abs(d), beta), d**2 / (2 * beta), sympy.Abs(d) - beta / 2)


class hardsigmoid(Primitive):  # noqa: N801
    """max(min(u + 3, 6), 0) / 6: gradient 1/6 strictly inside (-3, 3), 0 at the kinks (F.hardsigmoid).

    `clamp` would pass the gradient at the kinks: not this function's derivative there.
    PyTorch's backward kernel has no derivative: double backward uses the formula.
    """

    nargs = 1
    native_twice = False

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        return hardtanh.elementary(args[0] + 3, S.Zero, sympy.Integer(6)) / 6


class hardswish(Primitive):  # noqa: N801
    """u * hardsigmoid(u): the gradient at the kinks is the formula's, 0 at -3 and 1 at 3 (F.hardswish)."""

    nargs = 1
    backward_differentiable = True

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        return args[0] * hardsigmoid.elementary(args[0])


PRIMITIVES: dict[str, type[Primitive]] = {
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


class Prime(sympy.Function):
    """The derivative of a primitive in its tensor argument: `args` = (name, *primitive args)."""

    is_real = True

    def __new__(cls, name: str | sympy.Symbol, *args: Expr) -> Expr:
        tag = name if isinstance(name, sympy.Symbol) else sympy.Symbol(name)
        return super().__new__(cls, tag, *args)

    @property
    def primitive(self) -> type[Primitive]:
        return PRIMITIVES[str(self.args[0])]

    def elementary(self, form: str = "elementary") -> Expr:
        """The derivative as a formula: of the primitive's `elementary` or `fused_form`."""
        return prime_formula(str(self.args[0]), form, tuple(self.args[2:])).xreplace({TENSOR_ARG: self.args[1]})

    def _eval_derivative(self, s: sympy.Symbol) -> Expr:
        return sympy.diff(self.elementary(), s)

    def _eval_evalf(self, prec: int) -> Expr | None:
        return self.elementary().evalf(prec)

    @property
    def free_symbols(self) -> set[sympy.Basic]:
        return set().union(*(a.free_symbols for a in self.args[1:]))


TENSOR_ARG = sympy.Dummy("t", real=True)  # the tensor argument of `prime_formula`'s primitive


@functools.lru_cache(maxsize=512)
def prime_formula(name: str, form: str, rest: tuple[Expr, ...]) -> Expr:
    """d primitive(TENSOR_ARG, *rest) / d TENSOR_ARG, rewritten: `Prime.elementary` before its argument goes in.
    Differentiated once per primitive, form and other arguments, not at every docstring, jvp and
    double backward that shows a kernel's derivative (tens of milliseconds each)."""
    return rewrite(sympy.diff(getattr(PRIMITIVES[name], form)(TENSOR_ARG, *rest), TENSOR_ARG))


class KernelBackward(sympy.Function):
    """`g * prime(u)` by a PyTorch backward kernel: `args` = (g, *the primitive's args)."""

    is_real = True
    primitive: ClassVar[type[Primitive]]

    @classmethod
    def eval(cls, g: Expr, *args: Expr) -> Expr | None:
        return S.Zero if g == 0 else None  # Note [kernels of a zero gradient] in opgen.formula.tensor

    def elementary(self) -> Expr:
        g, *args = self.args
        return g * Prime(self.primitive.__name__, *args).elementary()

    def _eval_derivative(self, s: sympy.Symbol) -> Expr:
        return sympy.diff(self.elementary(), s)


# `<primitive>_backward` for each primitive: printed by the printer's `_print_<primitive>_backward`.
BACKWARD: dict[type[Primitive], type[KernelBackward]] = {
    p: type(f"{name}_backward", (KernelBackward,), {"primitive": p}) for name, p in PRIMITIVES.items()
}


class OutputBackward(sympy.Function):
    """`g * f'` in terms of a saved output of `f`: args (g, output); exactly PyTorch's kernel."""

    is_real = True

    @classmethod
    def eval(cls, g: Expr, output: Expr) -> Expr | None:
        return S.Zero if g == 0 else None  # Note [kernels of a zero gradient] in opgen.formula.tensor

    def elementary(self) -> Expr:
        raise NotImplementedError

    def _eval_derivative(self, s: sympy.Symbol) -> Expr:
        return sympy.diff(self.elementary(), s)


class sigmoid_backward(OutputBackward):  # noqa: N801
    def elementary(self) -> Expr:
        g, s = self.args
        return g * s * (1 - s)


class tanh_backward(OutputBackward):  # noqa: N801
    def elementary(self) -> Expr:
        g, t = self.args
        return g * (1 - t**2)


class threshold_backward(OutputBackward):  # noqa: N801
    """`g` where the saved output of `max(0, u)` is positive, else 0: relu's backward kernel."""

    def elementary(self) -> Expr:
        g, out = self.args
        return fn.where(sympy.StrictGreaterThan(out, 0), g, S.Zero)


def _factors(expr: Expr) -> tuple[Expr, ...]:
    return expr.args if isinstance(expr, sympy.Mul) else (expr,)


def backward_kernel(total: Expr, tensors: frozenset[sympy.Symbol]) -> Expr | None:
    """The kernel node computing the gradient `total` (`g * prime(u)`, ...), or None.

    `tensors` are the symbols that hold tensors: an output kernel reads a saved tensor.
    """
    factors = _factors(total)
    for k, factor in enumerate(factors):
        rest = [f for i, f in enumerate(factors) if i != k]
        for s in rest:
            if s.is_Symbol and s in tensors and factor == 1 - s:
                return sigmoid_backward(sympy.Mul(*[f for f in rest if f is not s]), s)
        if isinstance(factor, sympy.Add) and len(factor.args) == 2 and S.One in factor.args:
            other = factor.args[0] if factor.args[1] == S.One else factor.args[1]
            base, power = (-other).as_base_exp()
            if power == 2 and base.is_Symbol and base in tensors:
                return tanh_backward(sympy.Mul(*rest), base)
    primes = [f for f in factors if isinstance(f, Prime)]
    if len(primes) != 1:
        return None
    prime = primes[0]
    return BACKWARD[prime.primitive](total / prime, *prime.args[1:])


def written_out(expr: Expr) -> Expr:
    """`expr` with each derivative of a primitive as its one-call form or its formula."""
    return expr.replace(lambda e: isinstance(e, Prime), lambda e: e.primitive.prime_form(*e.args[1:]) or e.elementary())
