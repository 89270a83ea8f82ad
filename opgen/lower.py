"""Lowering stage: SymPy formulas -> calls of PyTorch's native kernels where a formula is one.

Receives a (rewritten) SymPy expression and the symbols of non-tensor inputs; returns the same
value with every subformula that is exactly a PyTorch primitive replaced by a node that
prints as that primitive's call: `x * sigmoid(x)` becomes `F.silu(x)`, `softplus(b*x)/b`
becomes `F.softplus(x, b)`, and so on (`PRIMITIVES`). `derive` applies it after the stable
rewrites and before differentiating, so a gradient holds the primitive's derivative as
one node, which the emitter prints as PyTorch's own backward kernel (`opgen.emit_kernels`).

Note [native backward kernels]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A primitive's backward kernel (`aten.silu_backward`, ...) does in one pass what the
derivative formula does in four or five, each allocating a tensor. Some of these kernels
have a derivative of their own in PyTorch (gelu, softplus, elu, sigmoid, tanh): backward
calls them always, and double backward goes through PyTorch's formulas. The others (silu)
are used only when autograd is not recording (`torch.is_grad_enabled()` is false in
backward unless `create_graph=True`); when it is, backward uses the derivative formula,
built from differentiable ops as Note [what backward may use] requires. A primitive may
give statements for the unrecorded case instead of a kernel (`backward_no_grad`: mish,
whose PyTorch kernels are slow on CPU, and logsigmoid, whose kernel needs a buffer), which
may work in place (Note [forward in place]).
"""

from __future__ import annotations

from typing import Any

import sympy
from sympy import Expr, S

from opgen import functions as fn
from opgen.names import Namer
from opgen.rewrite import logsigmoid, rewrite


class _Primitive(sympy.Function):
    """A PyTorch primitive: `args[0]` is the tensor, the others plain numbers."""

    is_real = True
    call = ""  # format string: {F} functional, {0} tensor, {1}... parameters
    backward = ""  # format string: {aten}, {g} incoming gradient, {0}... the primitive's args
    backward_differentiable = False
    # The derivative alone, where backward shares it between gradients (no kernel then):
    # format string as `call` (`{neg[k]}`: minus argument k); empty: the derivative formula.
    prime_call = ""
    fast = True  # fused mode leaves it alone: PyTorch's kernels are as quick as a compiled loop

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        raise NotImplementedError

    @classmethod
    def fused_form(cls, *args: Expr) -> Expr:
        """The formula fused mode compiles (opgen.fuse): the same function, cheap to fuse."""
        return cls.elementary(*args)

    def fdiff(self, argindex: int = 1) -> Expr:
        if argindex == 1:
            return _Prime(self.func.__name__, *self.args)  # type: ignore[no-any-return]
        t = sympy.Dummy("t", real=True)
        args = list(self.args)
        args[argindex - 1] = t
        return rewrite(sympy.diff(self.elementary(*args), t)).xreplace({t: self.args[argindex - 1]})  # type: ignore[no-any-return]

    def _eval_evalf(self, prec: int) -> Expr | None:
        if all(a.is_number for a in self.args):
            return self.elementary(*self.args).evalf(prec)  # type: ignore[no-any-return]
        return None

    call_no_grad = ""  # a quicker `call` for code autograd never records (Note [forward in place])
    # Statements for `var = g * prime(u)` when autograd does not record backward, using
    # the temporaries named in `backward_temps`; replaces the `backward` kernel.
    backward_no_grad: tuple[str, ...] = ()
    backward_temps: tuple[str, ...] = ()

    def _opgen_torch(self, printer: Any) -> str:
        args = [printer._print(a) for a in self.args]
        if not (self.call_no_grad and getattr(printer, "no_grad", False)):
            return self.call.format(*args, F=printer.functional, torch=printer.torch)
        # `{s}` in `call_no_grad` is a value computed once and bound with `:=`.
        name = Namer({*printer.names.values(), printer.torch, printer.math}).fresh("s")
        return self.call_no_grad.format(*args, F=printer.functional, torch=printer.torch, s=name)

    def _sympystr(self, printer: Any) -> str:
        """Docstrings show the formula, not the kernel."""
        return _grouped(printer, self.elementary(*self.args))


class silu(_Primitive):  # noqa: N801 - torch's names
    nargs = 1
    call = "{F}.silu({0})"
    backward = "{aten}.silu_backward({g}, {0})"

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        return args[0] * fn.sigmoid(args[0])  # type: ignore[no-any-return]


class log_sigmoid(_Primitive):  # noqa: N801
    """logsigmoid(u) (opgen.rewrite); its backward kernel needs a buffer forward would have to save."""

    nargs = 1
    call = "{F}.logsigmoid({0})"
    backward_no_grad = ("{var} = {torch}.neg({0}).sigmoid_().mul_({g})",)

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        return logsigmoid(args[0])  # type: ignore[no-any-return]


class mish(_Primitive):  # noqa: N801
    nargs = 1
    call = "{F}.mish({0})"
    # tanh(softplus(u)) = s (2 - s) / (1 + (1 - s)**2), s = sigmoid(u): see `fused_form`.
    call_no_grad = "(2 - ({s} := {torch}.sigmoid({0}))).mul_({s}).div_((1 - {s}).square_().add_(1)).mul_({0})"
    backward = "{aten}.mish_backward({g}, {0})"
    # mish' = t + u s (1 - t**2) with t = s (2 - s) / d, d = 1 + q**2, q = 1 - s, and
    # 1 - t**2 = 4 q**2 / d**2 exactly: no cancellation where t is near 1.
    backward_no_grad = (
        "{s} = {torch}.sigmoid({0})",
        "{q} = 1 - {s}",
        "{d} = {q}.square().add_(1)",
        "{var} = (2 - {s}).mul_({s}).div_({d})",
        "{var}.add_({q}.square_().mul_({s}).mul_({0}).mul_(4).div_({d}.square_()))",
        "{var}.mul_({g})",
    )
    backward_temps = ("s", "q", "d")
    fast = False

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        return args[0] * sympy.tanh(fn.softplus(args[0]))  # type: ignore[no-any-return]

    @classmethod
    def fused_form(cls, *args: Expr) -> Expr:
        """tanh(softplus(u)) = s (2 - s) / (1 + (1 - s)**2) with s = sigmoid(u), exactly.

        One sigmoid instead of softplus and tanh (tanh is ten times slower than sigmoid on
        CPU), with no cancellation or overflow anywhere: s lies in [0, 1].
        """
        s = fn.sigmoid(args[0])
        return args[0] * s * (2 - s) / (1 + (1 - s) ** 2)  # type: ignore[no-any-return]


class gelu(_Primitive):  # noqa: N801
    fast = False  # inductor's fused loop beats PyTorch's kernels (measured, fused mode)
    nargs = 1
    call = "{F}.gelu({0})"
    backward = "{aten}.gelu_backward({g}, {0})"
    backward_differentiable = True

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        return args[0] * (1 + sympy.erf(args[0] / sympy.sqrt(2))) / 2  # type: ignore[no-any-return]


class gelu_tanh(_Primitive):  # noqa: N801
    """u (1 + tanh(z)) / 2 with z = sqrt(2/pi) (u + 0.044715 u**3), which is u sigmoid(2 z) exactly.

    Forward (and fused mode) runs the sigmoid form: one sigmoid instead of tanh, ten times
    slower on CPU, and no cancellation in 1 + tanh(z) for negative u. Backward keeps
    PyTorch's kernel: the sigmoid form needs more temporaries than it saves time.
    """

    nargs = 1
    call = "{F}.gelu({0}, approximate='tanh')"
    # u * sigmoid(2c u (1 + k u**2)), 2c = 2 sqrt(2/pi), k = 0.044715
    call_no_grad = "{0}.square().mul_(0.044715).add_(1).mul_({0}).mul_(1.5957691216057308).sigmoid_().mul_({0})"
    backward = "{aten}.gelu_backward({g}, {0}, approximate='tanh')"
    backward_differentiable = True
    fast = False
    kappa = sympy.Rational("0.044715")

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        u = args[0]
        return u * (1 + sympy.tanh(sympy.sqrt(2 / sympy.pi) * (u + cls.kappa * u**3))) / 2  # type: ignore[no-any-return]

    @classmethod
    def fused_form(cls, *args: Expr) -> Expr:
        u = args[0]
        return u * fn.sigmoid(2 * sympy.sqrt(2 / sympy.pi) * (u + cls.kappa * u**3))  # type: ignore[no-any-return]


class softplus_beta(_Primitive):  # noqa: N801
    """softplus(beta * u) / beta, as F.softplus(u, beta) (linear where beta * u > 20, as PyTorch)."""

    nargs = 2
    call = "{F}.softplus({0}, {1})"
    backward = "{aten}.softplus_backward({g}, {0}, {1}, 20.0)"
    backward_differentiable = True

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        return fn.softplus(args[1] * args[0]) / args[1]  # type: ignore[no-any-return]


class elu(_Primitive):  # noqa: N801
    fast = False  # inductor's fused loop beats PyTorch's kernels (measured, fused mode)
    nargs = 2
    call = "{F}.elu({0}, {1})"
    backward = "{aten}.elu_backward({g}, {1}, 1, 1, False, {0})"
    backward_differentiable = True

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        u, alpha = args
        return fn.where(sympy.StrictGreaterThan(u, 0), u, alpha * fn.expm1(u))  # type: ignore[no-any-return]


class leaky_relu(_Primitive):  # noqa: N801
    """where(u > 0, u, slope * u): the slope below 0 and at 0 itself, as PyTorch's kernels."""

    nargs = 2
    call = "{F}.leaky_relu({0}, {1})"
    backward = "{aten}.leaky_relu_backward({g}, {0}, {1}, False)"
    backward_differentiable = True

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        u, slope = args
        return fn.where(sympy.StrictGreaterThan(u, 0), u, slope * u)  # type: ignore[no-any-return]


class hardtanh(_Primitive):  # noqa: N801
    """max(min(u, hi), lo): gradient 1 strictly between the bounds, 0 at them (F.hardtanh).

    F.hardtanh refuses lo > hi, where the formula would be the constant lo: a clear error
    for what is almost surely a mistake in the arguments.
    """

    nargs = 3
    call = "{F}.hardtanh({0}, {1}, {2})"
    backward = "{aten}.hardtanh_backward({g}, {0}, {1}, {2})"
    backward_differentiable = True

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        u, lo, hi = args
        return fn.maximum(fn.minimum(u, hi, S.Zero), lo, S.Zero)  # type: ignore[no-any-return]


class huber(_Primitive):  # noqa: N801
    """The Huber function of a difference `d`, quadratic within delta of 0 and linear beyond.

    PyTorch's kernels take an input and a target; the target here is a zero that costs no
    memory (`expand_as`), so one kernel pass replaces three selects, each slow on CPU.
    F.huber_loss refuses delta <= 0, where the formula would be linear everywhere: a clear
    error for what is almost surely a mistake in the arguments.
    """

    nargs = 2
    call = "{F}.huber_loss({0}, {0}.new_zeros(()).expand_as({0}), reduction='none', delta={1})"
    backward = "{aten}.huber_loss_backward({g}, {0}, {0}.new_zeros(()).expand_as({0}), 0, {1})"
    backward_differentiable = True
    # d itself within delta of 0, delta * sign(d) beyond: d clipped, with a zero gradient at
    # the clip points as the formula's (as F.hardtanh's).
    prime_call = "{F}.hardtanh({0}, {neg[1]}, {1})"

    @classmethod
    def elementary(cls, *args: Expr) -> Expr:
        d, delta = args
        quadratic, linear = d**2 / 2, delta * (sympy.Abs(d) - delta / 2)
        return fn.where(sympy.StrictLessThan(sympy.Abs(d), delta), quadratic, linear)  # type: ignore[no-any-return]


PRIMITIVES: dict[str, type[_Primitive]] = {
    c.__name__: c for c in (silu, log_sigmoid, mish, gelu, gelu_tanh, softplus_beta, elu, leaky_relu, hardtanh, huber)
}


class _Prime(sympy.Function):
    """The derivative of a primitive in its tensor argument: `args` = (name, *primitive args)."""

    is_real = True

    def __new__(cls, name: str | sympy.Symbol, *args: Expr) -> Expr:
        tag = name if isinstance(name, sympy.Symbol) else sympy.Symbol(name)
        return super().__new__(cls, tag, *args)  # type: ignore[no-any-return]

    @property
    def primitive(self) -> type[_Primitive]:
        return PRIMITIVES[str(self.args[0])]

    def elementary(self, form: str = "elementary") -> Expr:
        """The derivative as a formula: of the primitive's `elementary` or `fused_form`."""
        t = sympy.Dummy("t", real=True)
        args = [t, *self.args[2:]]
        formula = getattr(self.primitive, form)(*args)
        return rewrite(sympy.diff(formula, t)).xreplace({t: self.args[1]})  # type: ignore[no-any-return]

    def _eval_derivative(self, s: sympy.Symbol) -> Expr:
        return sympy.diff(self.elementary(), s)  # type: ignore[no-any-return]

    def _eval_evalf(self, prec: int) -> Expr | None:
        return self.elementary().evalf(prec)  # type: ignore[no-any-return]

    @property
    def free_symbols(self) -> set[sympy.Basic]:
        return set().union(*(a.free_symbols for a in self.args[1:]))

    def _opgen_torch(self, printer: Any) -> str:
        if self.primitive.prime_call:
            args = [printer._print(a) for a in self.args[1:]]
            negated = [printer._print(-a) for a in self.args[1:]]
            return self.primitive.prime_call.format(*args, neg=negated, F=printer.functional, torch=printer.torch)
        return _grouped(printer, self.elementary())

    def _sympystr(self, printer: Any) -> str:
        return _grouped(printer, self.elementary())


def _grouped(printer: Any, expr: Expr) -> str:
    """`expr` printed to stand as one factor wherever it is used."""
    text = str(printer._print(expr))
    return f"({text})" if isinstance(expr, (sympy.Add, sympy.Mul, sympy.Pow)) else text


# -- matching ------------------------------------------------------------------------------------


def _split(node: Expr, part: Expr) -> Expr | None:
    """`node / part` when `node` is a product holding `part`, else None."""
    if isinstance(node, sympy.Mul) and part in node.args:
        return node / part  # type: ignore[no-any-return]
    return None


def _match_silu(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, sympy.Mul):
        return None
    for factor in node.args:
        if isinstance(factor, fn.sigmoid) and _split(node, factor) == factor.args[0]:
            return silu(factor.args[0])
    return None


def _match_mish(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, sympy.Mul):
        return None
    for factor in node.args:
        if isinstance(factor, sympy.tanh) and isinstance(factor.args[0], fn.softplus):
            u = factor.args[0].args[0]
            if _split(node, factor) == u:
                return mish(u)
    return None


def _match_gelu(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, sympy.Mul):
        return None
    for e in node.atoms(sympy.erf):
        u = sympy.expand(e.args[0] * sympy.sqrt(2))
        if _same(node, gelu.elementary(u)):
            return gelu(u)
    for t in node.atoms(sympy.tanh):
        for u in sorted(_tensors(t, numbers), key=sympy.default_sort_key):
            if _same(node, gelu_tanh.elementary(u)):
                return gelu_tanh(u)
    return None


def _tensors(expr: sympy.Basic, numbers: frozenset[sympy.Symbol]) -> set[sympy.Basic]:
    """The symbols of `expr` that may hold tensors: all but the non-tensor inputs."""
    return expr.free_symbols - numbers


def _same(a: Expr, b: Expr) -> bool:
    return bool(a == b or sympy.expand(a - b) == 0)


def _match_softplus(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, sympy.Mul):
        return None
    for factor in node.args:
        if isinstance(factor, fn.softplus) and _tensors(factor, numbers):  # of a number: `math`, not a kernel
            beta, u = factor.args[0].as_independent(*_tensors(factor, numbers), as_Add=False)
            if beta != 1 and _split(node, factor) == 1 / beta:
                return softplus_beta(u, beta)
    return None


def _match_elu(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, fn.where):
        return None
    cond, u, other = node.args
    if cond != sympy.StrictGreaterThan(u, 0) or not _tensors(u, numbers):
        return None
    alpha = _split(other, fn.expm1(u)) if isinstance(other, sympy.Mul) else (S.One if other == fn.expm1(u) else None)
    if alpha is None or _tensors(alpha, numbers):
        return None
    return elu(u, alpha)


def _match_leaky_relu(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, fn.where):
        return None
    cond, u, other = node.args
    if cond != sympy.StrictGreaterThan(u, 0) or not _tensors(u, numbers):
        return None
    slope = _split(other, u)
    if slope is None or _tensors(slope, numbers):
        return None
    return leaky_relu(u, slope)


def _bound(node: Expr, kind: type[sympy.Function], numbers: frozenset[sympy.Symbol]) -> tuple[Expr, Expr] | None:
    """(operand, number) when `node` is `kind(operand, number)` in either order."""
    if not isinstance(node, kind) or node.args[2] != 0:
        return None
    a, b = node.args[0], node.args[1]
    if not _tensors(b, numbers):
        return a, b
    if not _tensors(a, numbers):
        return b, a
    return None


def _match_hardtanh(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    """max(min(u, hi), lo) or min(max(u, lo), hi): the same function and gradient when lo < hi."""
    for outer, inner in ((fn.maximum, fn.minimum), (fn.minimum, fn.maximum)):
        found = _bound(node, outer, numbers)
        inside = _bound(found[0], inner, numbers) if found else None
        if found and inside and _tensors(inside[0], numbers):
            lo, hi = (found[1], inside[1]) if outer is fn.maximum else (inside[1], found[1])
            if (lo - hi).is_number and not (lo - hi).is_negative:
                return None  # constant bounds the wrong way round: keep the formula's meaning
            return hardtanh(inside[0], lo, hi)
    return None


def _match_huber(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    if not isinstance(node, fn.where) or not isinstance(node.args[0], sympy.StrictLessThan):
        return None
    size, delta = node.args[0].args
    if not isinstance(size, sympy.Abs) or _tensors(delta, numbers) or (delta.is_number and not delta.is_positive):
        return None
    d = size.args[0]
    return huber(d, delta) if _same(node, huber.elementary(d, delta)) else None


def _match_log_sigmoid(node: Expr, numbers: frozenset[sympy.Symbol]) -> Expr | None:
    return log_sigmoid(node.args[0]) if isinstance(node, logsigmoid) else None


_MATCHERS = (
    _match_silu,
    _match_log_sigmoid,
    _match_mish,
    _match_gelu,
    _match_softplus,
    _match_elu,
    _match_leaky_relu,
    _match_hardtanh,
    _match_huber,
)


def lower(expr: Expr, numbers: frozenset[sympy.Symbol]) -> Expr:
    """`expr` with every subformula that is a PyTorch primitive replaced by it.

    `numbers` are the symbols of the non-tensor inputs: a primitive's parameters
    (softplus's beta, elu's alpha) must be made of these and constants.
    """
    if expr.is_Atom or not expr.args or not _tensors(expr, numbers):
        return expr
    args = tuple(lower(a, numbers) if isinstance(a, Expr) else a for a in expr.args)
    node = expr.func(*args) if args != expr.args else expr
    for match in _MATCHERS:
        found = match(node, numbers)
        if found is not None:
            return found
    return node  # type: ignore[no-any-return]
