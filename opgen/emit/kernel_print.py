"""Printing the kernel IR (opgen.optimize.kernels) and the stable functions of opgen.optimize.rewrite as torch code.

`KernelPrinting` is mixed into `TorchPrinter`: one `_print_<node>` method per node, so the
printer has one dispatch for everything it prints. With the printer setting `no_grad`
(Function.forward, which autograd never records) a primitive prints as in-place operations
on the temporaries it makes itself (Note [forward in place] in opgen.emit.kernel_lines).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sympy

from opgen.formula import functions as fn
from opgen.optimize import backward_kernels as kb
from opgen.optimize import kernels as k
from opgen.spec.names import Namer


class KernelPrinting:
    """`F.silu(u)`, `aten.silu_backward(g, u)`, `torch.sinc(u)`, ..."""

    if TYPE_CHECKING:  # provided by TorchPrinter
        torch: str
        math: str
        functional: str
        names: dict[sympy.Symbol, str]
        _settings: dict[str, Any]

        def _print(self, expr: Any, **kwargs: Any) -> str: ...

        def _call(self, name: str, *args: sympy.Basic) -> str: ...

        def is_tensor(self, expr: sympy.Basic) -> bool: ...

        def _as_tensor(self, value: sympy.Basic, like: sympy.Basic) -> str: ...

        def parenthesize(self, item: Any, level: int, strict: bool = False) -> str: ...

    def _functional(self, name: str, *args: sympy.Basic, extra: str = "") -> str:
        return f"{self.functional}.{name}({', '.join([*(self._print(a) for a in args), *([extra] if extra else [])])})"

    def _aten(self, name: str, *args: sympy.Basic | str) -> str:
        text = [a if isinstance(a, str) else self._print(a) for a in args]
        return f"{self.torch}.ops.aten.{name}({', '.join(text)})"

    def _print_xlogy(self, expr: fn.xlogy) -> str:
        x, y = expr.args
        if not self.is_tensor(expr):  # numbers: 0 where x is 0, as torch.xlogy
            return self._number_form(fn.where(sympy.Eq(x, 0), sympy.S.Zero, x * sympy.log(y)))
        y_text = self._print(y) if self.is_tensor(y) else self._as_tensor(y, x)  # torch.xlogy takes no number second
        return f"{self.torch}.xlogy({self._print(x)}, {y_text})"

    def _print_xlog1py(self, expr: fn.xlog1py) -> str:
        x, y = expr.args
        if not self.is_tensor(expr):  # numbers: 0 where x is 0, as torch.special.xlog1py
            return self._number_form(fn.where(sympy.Eq(x, 0), sympy.S.Zero, x * fn.log1p(y)))
        y_text = self._print(y) if self.is_tensor(y) else self._as_tensor(y, x)
        return f"{self.torch}.special.xlog1py({self._print(x)}, {y_text})"

    def _number_form(self, form: sympy.Basic) -> str:
        """`form` standing where the call was: in parentheses unless it is one name, number or call
        (`n / xlogy(K, n)` is `n / (K * math.log(n))`, not `n / K * math.log(n)`)."""
        text = self._print(form)
        return text if form.is_Atom or (form.is_Function and not isinstance(form, fn.where)) else f"({text})"

    def _zeros_like(self, expr: sympy.Basic) -> str:
        """A zero tensor of `expr`'s shape that costs no memory (huber's target)."""
        value = self._print(expr)
        operand = value if isinstance(expr, (sympy.Symbol, sympy.Function)) else f"({value})"
        return f"{operand}.new_zeros(()).expand_as({value})"

    # -- forward -----------------------------------------------------------------------------------

    def _print_silu(self, expr: k.silu) -> str:
        return self._functional("silu", *expr.args)

    def _print_log_sigmoid(self, expr: k.log_sigmoid) -> str:
        return self._functional("logsigmoid", *expr.args)

    def _print_mish(self, expr: k.mish) -> str:
        if not self._settings["no_grad"]:
            return self._functional("mish", *expr.args)
        # tanh(softplus(u)) = s (2 - s) / (1 + (1 - s)**2), s = sigmoid(u) (mish.fused_form), bound once.
        u = self._print(expr.args[0])
        s = Namer({*self.names.values(), self.torch, self.math}).fresh("s")
        return f"(2 - ({s} := {self.torch}.sigmoid({u}))).mul_({s}).div_((1 - {s}).square_().add_(1)).mul_({u})"

    def _print_gelu(self, expr: k.gelu) -> str:
        return self._functional("gelu", *expr.args)

    def _print_gelu_tanh(self, expr: k.gelu_tanh) -> str:
        if not self._settings["no_grad"]:
            return self._functional("gelu", *expr.args, extra='approximate="tanh"')
        # u * sigmoid(2c u (1 + kappa u**2)), c = sqrt(2 / pi) (gelu_tanh.fused_form)
        u = self._print(expr.args[0])
        kappa, scale = self._print(k.gelu_tanh.kappa), self._print(2 * sympy.sqrt(2 / sympy.pi))
        return f"{u}.square().mul_({kappa}).add_(1).mul_({u}).mul_({scale}).sigmoid_().mul_({u})"

    def _print_softplus_beta(self, expr: k.softplus_beta) -> str:
        return self._functional("softplus", *expr.args)

    def _print_elu(self, expr: k.elu) -> str:
        return self._functional("elu", *expr.args)

    def _print_leaky_relu(self, expr: k.leaky_relu) -> str:
        return self._functional("leaky_relu", *expr.args)

    def _print_hardtanh(self, expr: k.hardtanh) -> str:
        return self._functional("hardtanh", *expr.args)

    def _difference(self, d: sympy.Basic) -> tuple[sympy.Basic, sympy.Basic] | None:
        """Note [losses of a difference]
        ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
        PyTorch's Huber and smooth L1 kernels take an input and a target and compute their
        difference inside their one pass, forward and backward; the primitives hold the difference
        `d` (opgen.optimize.kernels). Where `d` is `a - b` of two tensors, the kernels are called on
        `a` and `b` (a pass and a buffer fewer each way) and broadcast them as `a - b` does; elsewhere
        on `d` and a zero target that costs no memory. Returns (a, b), or None."""
        if not isinstance(d, sympy.Add) or len(d.args) != 2:
            return None
        for a, negated in (d.args, d.args[::-1]):
            b = -negated
            if negated.could_extract_minus_sign() and self.is_tensor(a) and self.is_tensor(b):
                return a, b
        return None

    def _loss_pair(self, d: sympy.Basic) -> tuple[str, str]:
        """The input and target a loss kernel of the difference `d` takes: `a, b`, or `d` and a zero."""
        pair = self._difference(d)
        return (self._print(pair[0]), self._print(pair[1])) if pair else (self._print(d), self._zeros_like(d))

    def _within(self, kernel: str, bound: sympy.Basic, test: str, formula: sympy.Basic) -> str:
        """`kernel` where `bound` passes `test` (`> 0`), else `formula`: a kernel that refuses some values
        of a parameter input computes the formula there (Note [parameters of lowered primitives])."""
        if (bound.is_positive if test == "> 0" else bound.is_nonnegative) or self.is_tensor(bound):
            return kernel
        return f"({kernel} if {self._print(bound)} {test} else {self._print(formula)})"

    def _print_huber(self, expr: k.huber) -> str:
        d, delta = expr.args
        if self._difference(d):  # F.huber_loss warns where the shapes differ; its kernel broadcasts them
            kernel = self._aten("huber_loss", *self._loss_pair(d), "0", delta)
        else:
            target = self._zeros_like(d)
            kernel = self._functional("huber_loss", d, extra=f'{target}, reduction="none", delta={self._print(delta)}')
        return self._within(kernel, delta, "> 0", expr.elementary())

    def _print_smooth_l1(self, expr: k.smooth_l1) -> str:
        d, beta = expr.args
        if self._difference(d) and beta.is_positive:  # beta = 0: F.smooth_l1_loss calls l1_loss
            return self._aten("smooth_l1_loss", *self._loss_pair(d), "0", beta)
        target = self._zeros_like(d)
        kernel = self._functional("smooth_l1_loss", d, extra=f'{target}, reduction="none", beta={self._print(beta)}')
        return self._within(kernel, beta, ">= 0", expr.elementary())

    def _print_hardsigmoid(self, expr: k.hardsigmoid) -> str:
        return self._functional("hardsigmoid", *expr.args)

    def _print_hardswish(self, expr: k.hardswish) -> str:
        return self._functional("hardswish", *expr.args)

    def _print__Prime(self, expr: k._Prime) -> str:  # noqa: N802 - SymPy's dispatch name
        """A derivative left as a node (fused mode writes them out): its one call or its formula, grouped."""
        form = kb.written_out(expr)
        text = self._print(form)
        return f"({text})" if isinstance(form, (sympy.Add, sympy.Mul, sympy.Pow)) else text

    # -- backward kernels (Note [native backward kernels]) ----------------------------------------

    def _print_silu_backward(self, expr: kb.KernelBackward) -> str:
        return self._aten("silu_backward", *expr.args)

    def _print_mish_backward(self, expr: kb.KernelBackward) -> str:
        return self._aten("mish_backward", *expr.args)

    def _print_log_sigmoid_backward(self, expr: kb.KernelBackward) -> str:
        raise NotImplementedError("logsigmoid's kernel needs forward's buffer: backward works in place")

    def _print_gelu_backward(self, expr: kb.KernelBackward) -> str:
        return self._aten("gelu_backward", *expr.args)

    def _print_gelu_tanh_backward(self, expr: kb.KernelBackward) -> str:
        return self._aten("gelu_backward", *expr.args, 'approximate="tanh"')

    def _print_softplus_beta_backward(self, expr: kb.KernelBackward) -> str:
        return self._aten("softplus_backward", *expr.args, "20.0")

    def _print_elu_backward(self, expr: kb.KernelBackward) -> str:
        g, u, alpha = expr.args
        return self._aten("elu_backward", g, alpha, "1", "1", "False", u)

    def _print_leaky_relu_backward(self, expr: kb.KernelBackward) -> str:
        return self._aten("leaky_relu_backward", *expr.args, "False")

    def _print_hardtanh_backward(self, expr: kb.KernelBackward) -> str:
        return self._aten("hardtanh_backward", *expr.args)

    def _print_huber_backward(self, expr: kb.KernelBackward) -> str:
        g, d, delta = expr.args
        kernel = self._aten("huber_loss_backward", g, *self._loss_pair(d), "0", delta)
        return self._within(kernel, delta, "> 0", g * delta * fn.sign(d))  # delta <= 0: the linear branch

    def _print_smooth_l1_backward(self, expr: kb.KernelBackward) -> str:
        g, d, beta = expr.args
        kernel = self._aten("smooth_l1_loss_backward", g, *self._loss_pair(d), "0", beta)
        # beta = 0 is the L1 loss (F.smooth_l1_loss calls l1_loss there): the kernel's slope at d = 0 is -1;
        # beta < 0, which the kernel refuses, the linear branch.
        return self._within(kernel, beta, "> 0", g * fn.sign(d))

    def _print_hardsigmoid_backward(self, expr: kb.KernelBackward) -> str:
        return self._aten("hardsigmoid_backward", *expr.args)

    def _print_hardswish_backward(self, expr: kb.KernelBackward) -> str:
        return self._aten("hardswish_backward", *expr.args)

    def _print_sigmoid_backward(self, expr: kb.sigmoid_backward) -> str:
        return self._aten("sigmoid_backward", *expr.args)

    def _print_tanh_backward(self, expr: kb.tanh_backward) -> str:
        return self._aten("tanh_backward", *expr.args)

    def _print_threshold_backward(self, expr: kb.threshold_backward) -> str:
        return self._aten("threshold_backward", *expr.args, "0")

    # -- the stable functions of opgen.optimize.rewrite -------------------------------------------------------

    # Of plain numbers (Note [numbers and tensors]) each prints in a stable `math` form.

    def _print_sinc(self, expr: sympy.Function) -> str:
        u = expr.args[0]
        if not self.is_tensor(expr):
            return self._print(fn.where(sympy.Eq(u, 0), sympy.S.One, sympy.sin(sympy.pi * u) / (sympy.pi * u)))
        return self._call(f"{self.torch}.sinc", u)
