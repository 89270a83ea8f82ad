"""Emission of the native kernels: how `forward` and `backward` call a lowered primitive.

Used by `opgen.emit`: `forward_printer` lets `Function.forward` print primitives as their
in-place forms (Note [forward in place]); `backward_lines` prints a gradient `g * prime(u)`
as PyTorch's backward kernel, or as in-place statements where autograd does not record
(Note [native backward kernels] in `opgen.lower`).
"""

from __future__ import annotations

import copy

import sympy
from sympy import Expr, S

from opgen.lower import _Prime
from opgen.names import Namer
from opgen.printer import TorchPrinter


def forward_printer(printer: TorchPrinter) -> TorchPrinter:
    """A printer for `Function.forward`, which autograd never records (Note [forward in place]).

    Note [forward in place]
    ~~~~~~~~~~~~~~~~~~~~~~~
    `torch.autograd.Function.forward` runs with autograd off, so a primitive may print there
    as in-place operations on the temporaries it creates itself (`call_no_grad`): every
    temporary of a 1M-element float32 formula is a fresh 4 MB buffer, and on CPU getting
    the memory costs as much as the arithmetic. Backward, which autograd records under
    `create_graph=True`, always prints `call`.
    """
    forward = copy.copy(printer)
    forward.no_grad = True  # type: ignore[attr-defined]
    return forward


def backward_lines(var: str, total: Expr, printer: TorchPrinter, torch: str) -> list[str]:
    """`var = total`, through a native backward kernel where `total` is `g * prime(u)`.

    See Note [native backward kernels].
    """
    primes = [f for f in (total.args if isinstance(total, sympy.Mul) else (total,)) if isinstance(f, _Prime)]
    output_kernel = _output_kernel(total, printer, torch)
    if output_kernel is not None:
        return [f"{var} = {output_kernel}"]
    if len(primes) != 1:
        return [f"{var} = {printer._print(total)}"]
    prime = primes[0]
    primitive = prime.primitive
    g = printer._print(total / prime)
    args = [printer._print(a) for a in prime.args[1:]]
    fast = primitive.backward.format(*args, g=g, aten=f"{torch}.ops.aten")
    if primitive.backward_differentiable and not primitive.backward_no_grad:
        return [f"{var} = {fast}"]
    recorded = (
        fast if primitive.backward_differentiable else printer._print(total.xreplace({prime: prime.elementary()}))
    )
    if primitive.backward_no_grad:
        namer = Namer(set(printer.names.values()))
        temps = {t: namer.fresh(f"{var}_{t}") for t in primitive.backward_temps}
        lines = [line.format(*args, g=g, var=var, torch=torch, **temps) for line in primitive.backward_no_grad]
        comment = "  # in place on its own temporaries (Note [forward in place])"
    else:
        lines, comment = [f"{var} = {fast}"], ""
    why = "no in-place operations" if primitive.backward_no_grad else f"{primitive.__name__}'s kernel has no derivative"
    return [
        f"if {torch}.is_grad_enabled():  # double backward: {why}",
        f"    {var} = {recorded}",
        f"else:{comment}",
        *(f"    {line}" for line in lines),
    ]


def _output_kernel(total: Expr, printer: TorchPrinter, torch: str) -> str | None:
    """`g * s * (1 - s)` -> sigmoid_backward(g, s); `g * (1 - t**2)` -> tanh_backward(g, t).

    Both kernels compute exactly these products and have derivatives; `s` and `t` are
    tensors backward already has (saved outputs, typically).
    """
    if not isinstance(total, sympy.Mul):
        return None
    factors = list(total.args)
    for k, factor in enumerate(factors):
        rest = [f for i, f in enumerate(factors) if i != k]
        for s in rest:
            if s.is_Symbol and factor == 1 - s and s in printer.tensors:  # type: ignore[attr-defined]
                g = sympy.Mul(*[f for f in rest if f is not s])
                return f"{torch}.ops.aten.sigmoid_backward({printer._print(g)}, {printer._print(s)})"
        if isinstance(factor, sympy.Add) and len(factor.args) == 2 and S.One in factor.args:
            other = factor.args[0] if factor.args[1] == S.One else factor.args[1]
            base, power = (-other).as_base_exp()
            if power == 2 and base.is_Symbol and base in printer.tensors:  # type: ignore[attr-defined]
                g = sympy.Mul(*rest)
                return f"{torch}.ops.aten.tanh_backward({printer._print(g)}, {printer._print(base)})"
    return None
