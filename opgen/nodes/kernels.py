"""The kernel IR: what every PyTorch primitive shares, forward and backward.

A `Primitive` is a node for a subformula that is exactly one of PyTorch's native kernels
(`silu(u)`, `softplus_beta(u, beta)`, ...: opgen.nodes.activations, opgen.nodes.clips,
opgen.nodes.losses, each primitive with its formula, its lowering pattern and its spellings);
opgen.optimize.lower puts them in the formulas. Differentiating a primitive gives `Prime`, its
derivative in the tensor argument; `backward_kernel` turns a gradient `g * prime(u)` into the node
of PyTorch's backward kernel (`silu_backward(g, u)`, the primitive's `backward`), or `g * s * (1 - s)`
of a saved sigmoid into `sigmoid_backward(g, s)`. Every node prints itself (`_torch`); docstrings
show them as their formulas (opgen.emit.display).

Note [native backward kernels]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A primitive's backward kernel (`aten.silu_backward`, ...) does in one pass what the
derivative formula does in four or five, each allocating a tensor. Some of these kernels
have a derivative of their own in PyTorch (gelu, softplus, elu, sigmoid, tanh): backward
calls them always, and double backward goes through PyTorch's formulas. The others (silu)
are used only when autograd is not recording (`torch.is_grad_enabled()` is false in
backward unless `create_graph=True`); when it is, backward uses the derivative formula,
built from differentiable ops as Note [what backward may use] requires. A primitive may
compute the unrecorded case in place instead of by its kernel (`backward_in_place`:
logsigmoid, whose kernel needs a buffer; see
opgen.emit.kernel_lines and Note [forward in place]).

Note [kinks of lowered primitives]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A formula becomes a primitive only where the two are the same function AND have the same
derivative everywhere, kinks included: a gradient at a kink is the formula's (Note [real
kinks]), and a user who wrote `min(max(...))` gets its zero slope at the clip points, one
who wrote `clamp` the slope passed through. So `x * min(max(x + 3, 0), 6) / 6` is F.hardswish
(gradient 0 at -3, 1 at 3, as PyTorch's kernel) and `x * clamp(x + 3, 0, 6) / 6`, whose
gradient is -1/2 at -3 and 3/2 at 3, is not; `where(|d| <= delta, ...)` is huber as `<` is,
because its branches meet at |d| = delta with the same value and slope.

Note [parameters of lowered primitives]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A primitive whose kernel refuses some values of its parameters is lowered only where the call
means the formula for every value a parameter input may take. `max(min(u, hi), lo)` is the
constant lo where lo > hi, which F.hardtanh refuses (min_val > max_val): with bounds given as
inputs it becomes hardtanh(u, lo, max(lo, hi)), the formula for every lo and hi, and
`min(max(u, lo), hi)` hardtanh(u, min(lo, hi), hi); value and zero slope agree at lo = hi too.
F.huber_loss refuses delta <= 0 and F.smooth_l1_loss beta < 0, where the formulas are their
linear branch: with the bound a Tensor input, they stay formulas; with a float input, the call
runs where the kernel takes the bound and the formula elsewhere (`(F.huber_loss(d, ..., delta=delta)
if delta > 0 else where(...))`, and so their backward kernels and derivatives), not the kernel's error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ClassVar

import sympy
from sympy import Expr, S

from opgen.formula.functions import where
from opgen.nodes.base import Spelled, TorchCode
from opgen.optimize.rewrite import rewrite

# Every primitive by name, as it is defined (`Primitive.__init_subclass__`): the families register
# their primitives by defining them, and `Prime` finds its primitive here.
PRIMITIVES: dict[str, type[Primitive]] = {}

# A lowering pattern: the primitive `node` (a subformula, its arguments lowered) is, or None; `numbers`
# are the symbols of the non-tensor inputs, of which a primitive's parameters must be made.
Lowering = Callable[[Expr, frozenset[sympy.Symbol]], Expr | None]


class Primitive(Spelled, sympy.Function):
    """A PyTorch primitive: `args[0]` is the tensor, the others plain numbers.

    A node of the formula that prints as the primitive's call (`_torch`); its gradient `g * prime(u)`
    becomes the node `backward(g, *args)`, printed as PyTorch's backward kernel (`backward_torch`,
    Note [native backward kernels]).
    """

    is_real = True
    backward_differentiable = False  # PyTorch's backward kernel has a derivative of its own
    backward_why = "no derivative"  # why a recorded backward takes the formula, when it does
    native_twice = True  # PyTorch's own op (F.hardsigmoid: no) has second and forward-mode derivatives
    # Unrecorded backward works in place on its own temporaries instead of the kernel (`in_place_backward`).
    backward_in_place = False
    fast = True  # fused mode leaves it alone: PyTorch's kernels are as quick as a compiled loop
    backward: ClassVar[type[KernelBackward]]  # its backward kernel's node, `<name>_backward`

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        PRIMITIVES[cls.__name__] = cls
        cls.backward = type(f"{cls.__name__}_backward", (KernelBackward,), {"primitive": cls})

    def fused_form(self) -> Expr:
        """The formula fused mode compiles (opgen.emit.fuse): the same function, cheap to fuse."""
        return self.elementary()

    def mask(self) -> Expr | None:
        """Note [saved masks]
        ~~~~~~~~~~~~~~~~~~~~
        A piecewise-linear primitive whose derivative is one number where a condition on its tensor
        argument holds and another elsewhere (leaky_relu: 1 where `u > 0`, the slope elsewhere) needs
        only that condition in backward, and its backward kernel takes the condition as a bool tensor
        (a `SavedMask`) in the argument's place (`leaky_relu_backward(g, u > 0, slope, False)` computes
        `g` where it is true, `g * slope` elsewhere; hardshrink's is `threshold_backward(g, |u| > lambd,
        0)`). The condition, or None where the derivative needs more. Its
        derivative is 0 almost everywhere, so double backward needs the condition only as well."""
        return None

    def prime_form(self) -> Expr | None:
        """The derivative alone as one call, where backward shares it between gradients; None: its formula."""
        return None

    def fdiff(self, argindex: int = 1) -> Expr:
        if argindex == 1:
            return Prime(self.func.__name__, *self.args)
        t = sympy.Dummy("t", real=True)
        args = list(self.args)
        args[argindex - 1] = t
        return rewrite(sympy.diff(self.func(*args).elementary(), t)).xreplace({t: self.args[argindex - 1]})

    def _eval_evalf(self, prec: int) -> Expr | None:
        if all(a.is_number for a in self.args):
            return self.elementary().evalf(prec)
        return None

    @classmethod
    def backward_torch(cls, printer: TorchCode, g: Expr, *args: Expr) -> str:
        """PyTorch's backward kernel of `g * prime(*args)`, printed."""
        raise NotImplementedError(f"{cls.__name__} has no backward kernel")

    @classmethod
    def in_place_backward(cls, var: str, g: str, u: str, printer: TorchCode) -> list[str]:
        """`var = g * prime(u)` computed in place on its own temporaries (`backward_in_place`, Note [forward
        in place] in opgen.emit.kernel_lines), `g` and `u` printed."""
        raise NotImplementedError(f"{cls.__name__} has no in-place backward")


class SavedMask(sympy.Symbol):
    """A bool tensor forward saves for backward in a primitive's tensor argument's place: the condition
    its derivative depends on (Note [saved masks]); its backward kernel reads it as 1 where it holds."""


class Prime(Spelled, sympy.Function):
    """The derivative of a primitive in its tensor argument: `args` = (name, *primitive args)."""

    is_real = True

    def __new__(cls, name: str | sympy.Symbol, *args: Expr) -> Expr:
        tag = name if isinstance(name, sympy.Symbol) else sympy.Symbol(name)
        return super().__new__(cls, tag, *args)

    @property
    def primitive(self) -> type[Primitive]:
        return PRIMITIVES[str(self.args[0])]

    def elementary(self) -> Expr:
        """The derivative as a formula: of the primitive's `elementary()`; of its condition where a saved
        mask's condition stands in the tensor argument's place (Note [saved masks])."""
        formula = prime_formula(str(self.args[0]), "elementary", tuple(self.args[2:]))
        u = self.args[1]
        if isinstance(u, (sympy.core.relational.Relational, SavedMask)):
            condition = self.primitive(TENSOR_ARG, *self.args[2:]).mask()
            return formula.xreplace({condition: u if isinstance(u, sympy.core.relational.Relational) else u > 0})
        return formula.xreplace({TENSOR_ARG: u})

    def fused_form(self) -> Expr:
        """The derivative of the primitive's `fused_form()`, the formula fused mode compiles."""
        return prime_formula(str(self.args[0]), "fused_form", tuple(self.args[2:])).xreplace({TENSOR_ARG: self.args[1]})

    def _eval_derivative(self, s: sympy.Symbol) -> Expr:
        return sympy.diff(self.elementary(), s)

    def _eval_evalf(self, prec: int) -> Expr | None:
        return self.elementary().evalf(prec)

    @property
    def free_symbols(self) -> set[sympy.Basic]:
        if isinstance(self.args[1], SavedMask):  # the mask alone, a parameter only where the derivative reads it
            return self.elementary().free_symbols
        return set().union(*(a.free_symbols for a in self.args[1:]))

    def _torch(self, printer: TorchCode) -> str:
        """A derivative left as a node (fused mode writes them out): its one call or its formula, grouped."""
        form = written_out(self)
        text = printer._print(form)
        return f"({text})" if isinstance(form, (sympy.Add, sympy.Mul, sympy.Pow)) else text


TENSOR_ARG = sympy.Dummy("t", real=True)  # the tensor argument of `prime_formula`'s primitive


@functools.lru_cache(maxsize=512)
def prime_formula(name: str, form: str, rest: tuple[Expr, ...]) -> Expr:
    """d primitive(TENSOR_ARG, *rest) / d TENSOR_ARG, rewritten: `Prime.elementary` before its argument goes
    in (`form` "fused_form": `Prime.fused_form`). Differentiated once per primitive, form and other
    arguments, not at every docstring, jvp and double backward that shows a kernel's derivative
    (tens of milliseconds each)."""
    primitive = PRIMITIVES[name](TENSOR_ARG, *rest)
    return rewrite(sympy.diff(primitive.fused_form() if form == "fused_form" else primitive.elementary(), TENSOR_ARG))


class KernelBackward(Spelled, sympy.Function):
    """`g * prime(u)` by a PyTorch backward kernel: `args` = (g, *the primitive's args)."""

    is_real = True
    primitive: ClassVar[type[Primitive]]

    @classmethod
    def eval(cls, g: Expr, *args: Expr) -> Expr | None:
        return S.Zero if g == 0 else None  # Note [kernels of a zero gradient] in opgen.formula.tensor

    def elementary(self) -> Expr:
        g, *args = self.args
        return g * Prime(self.primitive.__name__, *args).elementary()

    @property
    def free_symbols(self) -> set[sympy.Basic]:
        if isinstance(self.args[1], SavedMask):  # Note [saved masks]: what the kernel reads
            return self.elementary().free_symbols
        return super().free_symbols

    def _eval_derivative(self, s: sympy.Symbol) -> Expr:
        return sympy.diff(self.elementary(), s)

    def _torch(self, printer: TorchCode) -> str:
        return self.primitive.backward_torch(printer, *self.args)


class OutputBackward(Spelled, sympy.Function):
    """`g * f'` in terms of a saved output of `f`: args (g, output); exactly PyTorch's kernel."""

    is_real = True

    @classmethod
    def eval(cls, g: Expr, output: Expr) -> Expr | None:
        return S.Zero if g == 0 else None  # Note [kernels of a zero gradient] in opgen.formula.tensor

    def _eval_derivative(self, s: sympy.Symbol) -> Expr:
        return sympy.diff(self.elementary(), s)


class sigmoid_backward(OutputBackward):  # noqa: N801
    def elementary(self) -> Expr:
        g, s = self.args
        return g * s * (1 - s)

    def _torch(self, printer: TorchCode) -> str:
        return aten(printer, "sigmoid_backward", *self.args)


class tanh_backward(OutputBackward):  # noqa: N801
    def elementary(self) -> Expr:
        g, t = self.args
        return g * (1 - t**2)

    def _torch(self, printer: TorchCode) -> str:
        return aten(printer, "tanh_backward", *self.args)


class threshold_backward(OutputBackward):  # noqa: N801
    """`g` where the saved output of `max(0, u)` is positive, else 0: relu's backward kernel."""

    def elementary(self) -> Expr:
        g, out = self.args
        return where(sympy.StrictGreaterThan(out, 0), g, S.Zero)

    def _torch(self, printer: TorchCode) -> str:
        return aten(printer, "threshold_backward", *self.args, "0")


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
    return prime.primitive.backward(total / prime, *prime.args[1:])


def written_out(expr: Expr) -> Expr:
    """`expr` with each derivative of a primitive as its one-call form or its formula."""
    return expr.replace(
        lambda e: isinstance(e, Prime), lambda e: e.primitive(*e.args[1:]).prime_form() or e.elementary()
    )


# -- spelling ---------------------------------------------------------------------------------------


def functional(printer: TorchCode, name: str, *args: sympy.Basic, extra: str = "") -> str:
    """`F.name(args, extra)`."""
    return (
        f"{printer.functional}.{name}({', '.join([*(printer._print(a) for a in args), *([extra] if extra else [])])})"
    )


def aten(printer: TorchCode, name: str, *args: sympy.Basic | str) -> str:
    """`torch.ops.aten.name(args)`, each printed unless it is text already."""
    text = [a if isinstance(a, str) else printer._print(a) for a in args]
    return f"{printer.torch}.ops.aten.{name}({', '.join(text)})"


# -- lowering patterns ------------------------------------------------------------------------------


def divided(node: Expr, part: Expr) -> Expr | None:
    """`node / part` when `node` is a product holding `part`, else None."""
    if isinstance(node, sympy.Mul) and part in node.args:
        return node / part
    return None


def tensors(expr: sympy.Basic, numbers: frozenset[sympy.Symbol]) -> set[sympy.Basic]:
    """The symbols of `expr` that may hold tensors: all but the non-tensor inputs."""
    return expr.free_symbols - numbers


def same(a: Expr, b: Expr) -> bool:
    return bool(a == b or sympy.expand(a - b) == 0)
