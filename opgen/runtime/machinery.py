"""What every op of this package shares, written once: the op modules keep only their formulas.

- `Function`: the base of each op's `torch.autograd.Function`, with a faster `apply`;
  `without_jvp` makes the twin that torch.compile traces (it cannot trace a custom `jvp`).
- `capture`: a functional called while `torch.fx.symbolic_trace` traces records itself as one
  node, so the captured graph keeps the op's own backward (a gradient override, a guarded
  `where`), which inlining the forward would lose.
- `outputs_only`, `recorded`: an ONNX export or `torch.jit.trace` records the op's forward as torch
  ops, its outputs alone (Note [outputs only]); the TorchScript-based ONNX exporter gets a
  translation of the few PyTorch ops it lacks (`xlogy`, `sinc`, `huber_loss`, `smooth_l1_loss`).
- `floating`, `autocast_apply`: the functional's argument checks, the promotion of integer and
  mixed floating dtypes and the casts of an op's autocast policy, as PyTorch's own ops and
  `torch.amp.custom_fwd` do them.
- `transforms_active`, `first_order_only`, `may_work_in_place`: when an op computes with its
  plain formula instead of a native, compiled or in-place kernel (under torch.func transforms or
  in double backward, what such a kernel does would not be recorded or batched).
- `not_scriptable`: TorchScript cannot compile an autograd Function; scripted code calls the
  functional as Python, and scripting the functional itself says what works.

The torch internals used here are the only ones the package touches; each has a fallback for
a torch release that lacks it, the slower or plainer path that is always right.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound="type[Function]")
C = TypeVar("C", bound=Callable[..., Any])


def _internal(owner: object, path: str) -> Any:
    """The torch internal at `path` below `owner`, or None where this release lacks it."""
    for part in path.split("."):
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    return owner


_transforms_active = _internal(torch, "_C._are_functorch_transforms_active")
_unwrap_dead_wrappers = _internal(torch, "_functorch.utils.unwrap_dead_wrappers")
_legacy_batched = _internal(torch, "_C._functorch.is_legacy_batchedtensor")
_autocast_enabled = _internal(torch, "_C._is_any_autocast_enabled")
_fx_tracing = _internal(torch, "fx._symbolic_trace.is_fx_symbolic_tracing")
_jit_tracing = _internal(torch, "jit.is_tracing")
_register_symbolic = _internal(torch, "onnx.register_custom_op_symbolic")
_interpreters = _internal(torch, "_functorch.pyfunctorch.retrieve_all_functorch_interpreters")
_jvp_transform = _internal(torch, "_C._functorch.TransformType.Jvp")


def transforms_active() -> bool:
    """A torch.func transform (vmap, grad, jvp, ...) is running (always, where torch cannot tell)."""
    return True if _transforms_active is None else bool(_transforms_active())


def nested_forward_mode() -> bool:
    """A torch.func forward-mode transform runs inside another (`jacfwd(jacfwd(f))`, `jvp` of `jvp`):
    Note [forward mode in forward mode]. Never where torch cannot tell."""
    if _interpreters is None or _jvp_transform is None or not transforms_active():
        return False
    return sum(1 for interpreter in _interpreters() if interpreter.key() == _jvp_transform) > 1


# Note [forward mode in forward mode]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch.func runs an autograd.Function's `jvp` on tensors unwrapped from the outer forward-mode
# levels, so a derivative of the tangent it returns is lost: `jacfwd(jacfwd(f))` through any
# Function, opgen's or a hand-written one, is silently 0 (pytorch/pytorch#197867), though
# `jacfwd(jacrev(f))`, `jacrev(jacfwd(f))` and `jacrev(jacrev(f))` are right. So in forward mode
# inside forward mode the functional runs its Function's `forward` as torch ops (`outputs_only`),
# which torch.func differentiates to any order; an op whose gradient is not that of its forward
# formula (a gradient override, a guarded `where`) refuses instead (`Function.apply`), naming the
# orders that work.


def legacy_batched(tensor: torch.Tensor) -> bool:
    """`tensor` is batched by autograd's `is_grads_batched` (always, where torch cannot tell)."""
    return True if _legacy_batched is None else bool(_legacy_batched(tensor))


def backward_kernels() -> bool:
    """Backward may call PyTorch's backward kernels whose own derivatives PyTorch gets wrong (Note [layer
    norm under torch.func] in opgen/nodes/layer_norm.py): no torch.func transform runs, and nothing
    differentiates backward again (grad mode is on in backward only under `create_graph=True`)."""
    return not torch.is_grad_enabled() and not transforms_active()


def first_order_only(grad: torch.Tensor) -> bool:
    """Backward computes a first derivative that nothing differentiates again (autograd records
    nothing: no double backward), under no torch.func transform, and `grad`, the incoming gradient,
    is not batched by `autograd.grad(is_grads_batched=True)`: compiled gradients (which cannot be
    differentiated again, nor batched from eager) may then replace the differentiable code."""
    if torch.is_grad_enabled() or transforms_active():
        return False
    return torch.compiler.is_compiling() or not legacy_batched(grad)


def may_work_in_place(grad: torch.Tensor) -> bool:
    """`first_order_only(grad)`, and not compiling: backward may then work in place on the temporaries it
    makes itself (under vmap an unbatched saved tensor cannot be multiplied in place by a batched
    gradient; compiled code fuses the plain operations anyway)."""
    return not torch.compiler.is_compiling() and first_order_only(grad)


class Function(torch.autograd.Function):
    """`torch.autograd.Function` whose `apply` does not bind `forward`'s signature on every call:
    the generated `forward` has no defaults to fill, and the binding is a third of a small call's
    time. Under torch.func transforms (which need it), `apply` is PyTorch's own."""

    generate_vmap_rule = True

    @classmethod
    def apply(cls, *args: Any) -> Any:
        if _unwrap_dead_wrappers is None or transforms_active():
            if nested_forward_mode() and not torch.compiler.is_compiling():
                op = cls.__module__.rpartition(".")[2]
                raise NotImplementedError(
                    f"{op}: forward mode inside forward mode (jacfwd of jacfwd, jvp of jvp) loses the derivative"
                    " of an autograd.Function's jvp in PyTorch (pytorch/pytorch#197867), and this op's gradient"
                    " is not that of its forward formula (an override or a guarded where); take one of the two"
                    " derivatives in reverse mode: jacfwd(jacrev(f)), jacrev(jacfwd(f)) or jacrev(jacrev(f))"
                )
            return super().apply(*args)  # type: ignore[no-untyped-call, unused-ignore]
        # past `Function.apply` (which binds the signature) to autograd's own, in C
        return super(torch.autograd.Function, cls).apply(*_unwrap_dead_wrappers(args))  # type: ignore[misc]


def without_jvp(function: F) -> F:
    """`function` without its `jvp`, for torch.compile, which cannot trace a custom jvp (it derives
    forward-mode gradients from the traced formulas instead)."""
    members = {"jvp": staticmethod(torch.autograd.Function.jvp), "__module__": function.__module__}
    metaclass: Any = type(function)  # autograd's FunctionMeta, which makes the twin's backward class
    twin: F = metaclass(f"{function.__name__}Compiled", (function,), members)
    return twin


def capture(functional: Callable[..., Any], *args: Any) -> Any:
    """While torch.fx traces and a `torch.fx.Proxy` is among `args`: the call recorded as one node
    of the graph (what `torch.fx.wrap` does, wherever the functional is called from); else None."""
    if _fx_tracing is not None and not _fx_tracing():
        return None
    for arg in args:
        if torch.fx.Proxy in arg.__class__.__mro__:  # not `isinstance`: a Proxy answers any attribute
            return arg.tracer.create_proxy("call_function", functional, args, {})
    return None


def floating(op: str, required: dict[str, Any], optional: dict[str, Any] | None = None, promote: bool = True) -> Any:
    """The tensor arguments a gradient flows to (`required`, then `optional`, which may be None), as the
    op computes with them: an integer or bool tensor cast to the floating dtype the others promote to
    (the default dtype when none is floating), as `torch.tanh` or `torch.logsumexp` promote it; with
    `promote`, mixed floating dtypes cast to their promoted dtype, as PyTorch's elementwise ops promote
    them (the Function then sees one dtype, which its backward kernels need, and autograd casts each
    gradient back to its input's dtype). One argument is returned alone, several as a tuple.

    A TypeError names an argument that is not a tensor, or a complex one (the derivation is over the
    reals: its gradients would not be conjugated); a RuntimeError names the op and the arguments when
    they are on different devices (torch's own message, from deep inside the formula, names neither);
    a 0-dim CPU tensor goes with any device, as in PyTorch's ops."""
    given = {**required, **(optional or {})}
    floats: set[torch.dtype] = set()
    whole = False  # an integer or bool tensor among them
    for name, value in given.items():
        if value is None and name in required or value is not None and not _real(value):
            _not_real(op, name, value)
        if value is not None:
            if value.is_floating_point():
                floats.add(value.dtype)
            else:
                whole = True
    if len(given) > 1:
        _one_device(op, required, optional or {})
    values = tuple(given.values())
    if whole or (len(floats) > 1 and promote):
        dtype = _promoted(floats) if floats else torch.get_default_dtype()
        values = tuple(_cast(t, dtype, promote) for t in values)
    return values[0] if len(values) == 1 else values


def _real(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not value.is_complex()


def _promoted(dtypes: set[torch.dtype]) -> torch.dtype:
    dtype = next(iter(dtypes))
    for other in dtypes:
        dtype = torch.promote_types(dtype, other)
    return dtype


def _cast(value: Any, dtype: torch.dtype, promote: bool) -> Any:
    if value is None or value.dtype == dtype or (value.is_floating_point() and not promote):
        return value
    return value.to(dtype)


def _one_device(op: str, required: dict[str, Any], optional: dict[str, Any]) -> None:
    first: tuple[str, torch.device] | None = None
    for name, value in (*required.items(), *optional.items()):
        if value is None or (value.dim() == 0 and value.device.type == "cpu"):
            continue
        if first is None:
            first = (name, value.device)
        elif value.device != first[1]:
            raise RuntimeError(
                f"{op}(): argument '{name}' is on {value.device} but '{first[0]}' is on {first[1]}; "
                f"move every tensor argument to one device, e.g. {name}.to({first[0]}.device)"
            )


def _not_real(op: str, name: str, value: Any) -> None:
    got = value.dtype if isinstance(value, torch.Tensor) else value.__class__.__name__
    raise TypeError(f"{op}(): argument '{name}' must be a real Tensor (floating-point, integer or bool), got {got}")


def autocast_apply(run: Callable[..., Any], *args: Any, cast: str = "lower") -> Any:
    """`run(*args)` (an autograd Function's `apply`, or a custom op) as `torch.amp.custom_fwd` runs a
    forward, on the inputs' device type: while autocast is on there, the floating tensor inputs are cast
    (recorded operations) to autocast's dtype (`cast="lower"`, as torch.matmul), to float32
    (`"float32"`, custom_fwd(cast_inputs=torch.float32)) or not at all (`"inputs"`), and the op runs
    with autocast off, so forward, the saved tensors and backward share one dtype, and autograd casts
    each gradient back to its input's dtype."""
    if _autocast_enabled is not None and not _autocast_enabled():
        return run(*args)
    device = next(a for a in args if torch.is_tensor(a)).device.type
    if not torch.is_autocast_enabled(device):
        return run(*args)
    dtype = {"lower": torch.get_autocast_dtype(device), "float32": torch.float32}.get(cast)
    if dtype is not None:
        args = tuple(a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)
    with torch.autocast(device, enabled=False):
        return run(*args)


def not_scriptable(functional: C) -> C:
    """`functional` marked for TorchScript: scripted code that calls it runs it as a Python call (with
    the op's gradient), and scripting it raises a message naming what works."""
    torch.jit.ignore(functional)  # type: ignore[no-untyped-call, unused-ignore]
    name = getattr(functional, "__name__", "this op")
    message = (
        f"{name} runs a torch.autograd.Function, which TorchScript cannot compile: call it from scripted code"
        " (a Python call that torch.jit.save refuses), or capture it with torch.compile, torch.export or"
        " torch.jit.trace"
    )
    setattr(functional, "__script_unsupported", message)  # noqa: B010 - a name mypy does not know
    return functional


# Note [outputs only]
# ~~~~~~~~~~~~~~~~~~~
# A generated Function returns its residuals after its outputs, and the functional keeps the outputs
# (`[0]`). The TorchScript-based ONNX exporter (`torch.onnx.export(..., dynamo=False)`) inlines a
# multi-output Function and may wire another of its outputs to the functional's result: tanhshrink
# exported `tanh(x)`, rms_norm its rstd, quantize_ste `code` for `y`, all without an error. So
# while an ONNX exporter (either) or `torch.jit.trace` records the call, the functional calls the
# Function's `forward` as plain Python and returns its outputs: the graph holds torch ops only, no
# residual reaches it, and a traced graph can be saved (a Function cannot). The custom_op form
# decomposes the same way for ONNX, which knows no custom op (`jit.trace` keeps it as one node).
# What is given up: `torch.jit.trace` then differentiates the forward formula, which for a gradient
# override or a guarded `where` is not the op's gradient; such an op (`onnx_only`) keeps the Function
# under `jit.trace` (in-process training keeps its gradient; saving it fails), whatever the grad
# mode: jit.trace checks its trace by tracing again under no_grad, and the two must agree. An ONNX
# graph is for inference and always gets the forward.


def recorded() -> bool:
    """torch.export, an ONNX exporter or torch.jit.trace records this call (forward then works on no
    tensor autograd may have saved)."""
    return torch.compiler.is_exporting() or jit_tracing() or torch.onnx.is_in_onnx_export()


def jit_tracing() -> bool:
    """torch.jit.trace records this call (never, where torch cannot tell)."""
    return False if _jit_tracing is None else bool(_jit_tracing())


def outputs_only(onnx_only: bool = False) -> bool:
    """The functional should return its Function's `forward` outputs, as torch ops (Note [outputs
    only]): under an ONNX exporter, and under torch.jit.trace or forward mode inside forward mode (Note
    [forward mode in forward mode]) unless `onnx_only` (a custom op, one node of a traced graph; an op
    whose gradient the forward formula would lose)."""
    if torch.onnx.is_in_onnx_export():
        _onnx_translations()
        return True
    return not onnx_only and (jit_tracing() or nested_forward_mode())


def _onnx_translations() -> None:
    """Teach the TorchScript-based ONNX exporter the PyTorch ops it lacks and generated forwards call,
    written out in ONNX ops with PyTorch's values (NaN too); once, and never over a translation torch
    has."""
    helper = _internal(torch, "onnx.symbolic_helper")
    registry = _internal(torch, "onnx._internal.torchscript_exporter.registration.registry")
    if helper is None or registry is None or _register_symbolic is None:
        return
    for name, symbolic in (
        ("aten::xlogy", _xlogy),
        ("aten::sinc", _sinc),
        ("aten::huber_loss", helper.parse_args("v", "v", "i", "f")(_huber_loss)),
        ("aten::smooth_l1_loss", helper.parse_args("v", "v", "i", "f")(_smooth_l1_loss)),
        ("aten::expm1", lambda g, x: g.op("Sub", g.op("Exp", x), _like(g, 1.0, x))),
        ("aten::erfc", lambda g, x: g.op("Sub", _like(g, 1.0, x), g.op("Erf", x))),
        ("aten::sinh", lambda g, x: g.op("Sinh", x)),
        ("aten::cosh", lambda g, x: g.op("Cosh", x)),
        ("aten::asinh", lambda g, x: g.op("Asinh", x)),
        ("aten::acosh", lambda g, x: g.op("Acosh", x)),
        ("aten::atanh", lambda g, x: g.op("Atanh", x)),
        ("aten::trunc", _trunc),
        ("aten::hypot", lambda g, a, b: g.op("Sqrt", g.op("Add", g.op("Mul", a, a), g.op("Mul", b, b)))),
        ("aten::logaddexp", lambda g, a, b: _logaddexp(g, a, b, math.e)),
        ("aten::logaddexp2", lambda g, a, b: _logaddexp(g, a, b, 2.0)),
    ):
        if not registry.is_registered_op(name, _ONNX_OPSET):
            _register_symbolic(name, symbolic, _ONNX_OPSET)


_ONNX_OPSET = 15  # CastLike: constants take their operand's dtype


def _like(g: Any, value: float, like: Any) -> Any:
    return g.op("CastLike", g.op("Constant", value_t=torch.tensor(value)), like)


def _xlogy(g: Any, x: Any, y: Any) -> Any:
    """torch.xlogy: NaN where y is, else 0 where x is 0, else x * log(y)."""
    product = g.op("Mul", x, g.op("Log", y))
    zero_x = g.op("Where", g.op("Equal", x, _like(g, 0.0, x)), _like(g, 0.0, product), product)
    return g.op("Where", g.op("IsNaN", y), g.op("CastLike", y, product), zero_x)


def _sinc(g: Any, x: Any) -> Any:
    """torch.sinc: sin(pi x) / (pi x), 1 at 0."""
    pi_x = g.op("Mul", x, _like(g, math.pi, x))
    quotient = g.op("Div", g.op("Sin", pi_x), pi_x)
    return g.op("Where", g.op("Equal", x, _like(g, 0.0, x)), _like(g, 1.0, x), quotient)


def _trunc(g: Any, x: Any) -> Any:
    """torch.trunc: toward zero (ONNX has Floor and Ceil)."""
    return g.op("Where", g.op("Less", x, _like(g, 0.0, x)), g.op("Ceil", x), g.op("Floor", x))


def _logaddexp(g: Any, a: Any, b: Any, base: float) -> Any:
    """torch.logaddexp (base e) and logaddexp2 (base 2): max(a, b) + log_base(1 + base**-|a - b|), and `a`
    plus log_base(2) where a == b (two equal infinities, whose difference is NaN)."""
    log_base = math.log(base)
    gap = g.op("Neg", g.op("Abs", g.op("Sub", a, b)))
    tail = g.op("Log", g.op("Add", _like(g, 1.0, a), g.op("Exp", g.op("Mul", gap, _like(g, log_base, a)))))
    joined = g.op("Add", g.op("Max", a, b), g.op("Div", tail, _like(g, log_base, a)))
    same = g.op("Add", a, _like(g, math.log(2.0) / log_base, a))
    return g.op("Where", g.op("Equal", a, b), same, joined)


def _elementwise_loss(g: Any, reduction: int, loss: Any) -> Any:
    if reduction != 0:  # generated ops ask for reduction="none"
        raise RuntimeError("the ONNX translation of this loss takes reduction='none' only")
    return loss


def _huber_loss(g: Any, input: Any, target: Any, reduction: int, delta: float) -> Any:
    """torch.nn.functional.huber_loss: 0.5 d**2 where |d| < delta, else delta * (|d| - 0.5 delta)."""
    d = g.op("Sub", input, target)
    size = g.op("Abs", d)
    square = g.op("Mul", _like(g, 0.5, d), g.op("Mul", d, d))
    linear = g.op("Mul", _like(g, delta, d), g.op("Sub", size, _like(g, 0.5 * delta, d)))
    return _elementwise_loss(g, reduction, g.op("Where", g.op("Less", size, _like(g, delta, d)), square, linear))


def _smooth_l1_loss(g: Any, input: Any, target: Any, reduction: int, beta: float) -> Any:
    """torch.nn.functional.smooth_l1_loss: 0.5 d**2 / beta where |d| < beta, else |d| - 0.5 beta."""
    d = g.op("Sub", input, target)
    size = g.op("Abs", d)
    if beta == 0:
        return _elementwise_loss(g, reduction, size)
    square = g.op("Mul", _like(g, 0.5 / beta, d), g.op("Mul", d, d))
    linear = g.op("Sub", size, _like(g, 0.5 * beta, d))
    return _elementwise_loss(g, reduction, g.op("Where", g.op("Less", size, _like(g, beta, d)), square, linear))
