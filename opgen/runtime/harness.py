"""Checks shared by the generated tests of every op.

Each `test_<op>.py` describes its op (an `OpUnderTest`), writes the spec's formulas as a
plain-torch reference, samples inputs, and calls these checks. All comparisons are in
float64 against independent references: autograd of the reference, the spec's gradient
overrides evaluated on their own, PyTorch's own op, `gradcheck` and `gradgradcheck`.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .accuracy import check_extremes as check_extremes  # the float32 extremes checks (accuracy.py)
from .accuracy import check_small_calls as check_small_calls

DTYPE = torch.float64

Args = list[Any]  # an op's arguments in spec order: tensors, numbers, None for an absent `Tensor?`
Reference = Callable[..., dict[str, Any]]  # the spec's formulas in plain torch: output name -> value


class Applied(Protocol):
    """A generated `torch.autograd.Function` class, as the checks use it: its (typed) `apply`."""

    def apply(self, *args: Any) -> Any: ...


def as_tensor(value: torch.Tensor | float) -> torch.Tensor:
    """A tensor (of DTYPE) of a plain number; tensors pass through."""
    return value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=DTYPE)


def fit_to(value: torch.Tensor | float, shape: torch.Size) -> torch.Tensor:
    """`value` broadcast to `shape`, then summed back to it: how an op fits a gradient to its input."""
    value = as_tensor(value)
    shape_of_both = torch.broadcast_shapes(value.shape, shape)  # type: ignore[no-untyped-call, unused-ignore]
    return value.expand(shape_of_both).sum_to_size(shape)


# Note [NaN alike]
# A NaN where the reference (or the loop, or PyTorch's op) has NaN too is agreement: every
# check compares through `close`, so no check fails on a NaN another accepts. Where the
# gradient of the plain formula is NaN only because a `where` branch not taken is undefined,
# the op must be finite instead (`check_gradient`).
def close(actual: torch.Tensor, expected: torch.Tensor, **options: Any) -> None:
    """`torch.testing.assert_close` with NaN equal to NaN (Note [NaN alike])."""
    torch.testing.assert_close(actual, expected, equal_nan=True, **options)


def as_tuple(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


def prefixed(prefix: str) -> Callable[[str], str]:
    """An `assert_close` message: `prefix`, then what assert_close says."""
    return lambda message: f"{prefix}: {message}"


def counted(result: object, count: int, what: str) -> tuple[torch.Tensor, ...]:
    """`result` as a tuple, after checking it holds `count` tensors: one Tensor, or a tuple of several."""
    if count == 1:
        assert isinstance(result, torch.Tensor), f"{what} returned {type(result).__name__}, expected one Tensor"
        return (result,)
    assert isinstance(result, tuple), f"{what} returned {type(result).__name__}, expected a tuple of {count}"
    assert len(result) == count, f"{what} returned {len(result)} outputs, expected {count}"
    return result


def uniform(generator: torch.Generator, shape: Sequence[int], low: float, high: float) -> torch.Tensor:
    """A float64 tensor drawn uniformly from [low, high), requiring grad."""
    values = torch.rand(shape, generator=generator, dtype=DTYPE)
    return (low + (high - low) * values).requires_grad_()


# Samplers of the `tests: domain` kinds (Note [domain kinds] in opgen's spec model): each takes the
# interval the spec's kind gives, draws float64 values, and requires grad.
def binary(generator: torch.Generator, shape: Sequence[int], low: float, high: float) -> torch.Tensor:
    """0/1 masks, each entry 0 or 1 with even odds."""
    values = torch.rand(shape, generator=generator, dtype=DTYPE) < 0.5
    return torch.where(values, high, low).to(DTYPE).requires_grad_()


def integer(generator: torch.Generator, shape: Sequence[int], low: float, high: float) -> torch.Tensor:
    """Whole numbers from low to high, both included."""
    values = torch.randint(int(low), int(high) + 1, tuple(shape), generator=generator)
    return values.to(DTYPE).requires_grad_()


def probability(generator: torch.Generator, shape: Sequence[int], low: float, high: float) -> torch.Tensor:
    """Rows on the simplex along the last dimension, every entry at least a twentieth of the row's mean."""
    values = torch.rand(shape, generator=generator, dtype=DTYPE) + 0.05
    return (values / values.sum(-1, keepdim=True)).requires_grad_()


def spd(generator: torch.Generator, shape: Sequence[int], low: float, high: float) -> torch.Tensor:
    """Symmetric positive-definite matrices over the last two dimensions: `A @ A.mT / n + I`."""
    a = torch.rand(shape, generator=generator, dtype=DTYPE) * 2 - 1
    n = shape[-1]
    return (a @ a.mT / n + torch.eye(n, dtype=DTYPE)).requires_grad_()


@dataclass(frozen=True)
class OpUnderTest:
    """A generated op as its spec declares it; positions index `inputs` and `outputs`."""

    functional: Callable[..., Any]
    inputs: Sequence[str]
    outputs: Sequence[str]
    tensor_inputs: Sequence[int]  # positions of the Tensor inputs
    checked: Sequence[int]  # Tensor inputs whose gradient is derived, not overridden
    differentiable: Sequence[int]  # positions of the differentiable outputs
    scope: Sequence[str] = ()  # the spec's input, let and output names: the first parameters of an override
    # input position -> its override, evaluated independently
    overrides: dict[int, Callable[..., torch.Tensor]] = field(default_factory=dict)
    symmetric: Sequence[int] = ()  # spd inputs: gradcheck perturbs them symmetrically

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        return counted(self.functional(*args), len(self.outputs), "the functional")

    def present(self, args: Sequence[Any]) -> list[int]:
        return [k for k in self.tensor_inputs if args[k] is not None]


def incoming_gradients(op: OpUnderTest, outs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(outs[k].shape, generator=generator, dtype=DTYPE) for k in op.differentiable]


def expected_gradients(
    op: OpUnderTest, args: Args, reference: Reference, grads_out: list[torch.Tensor]
) -> dict[int, torch.Tensor]:
    """Autograd of the reference, or the override formula, for every present Tensor input."""
    values = reference(*args)
    outs = tuple(values[name] for name in op.outputs)
    present = [k for k in op.present(args) if k in op.checked]
    # A reference output of steps only (sign, round, ...) has no autograd graph: zero gradient.
    pairs = [(outs[k], g) for k, g in zip(op.differentiable, grads_out, strict=True) if outs[k].requires_grad]
    derived: Sequence[torch.Tensor] = [torch.zeros_like(args[k]) for k in present]
    if pairs and present:
        derived = torch.autograd.grad(
            [o for o, _ in pairs],
            [args[k] for k in present],
            [g for _, g in pairs],
            allow_unused=True,
            materialize_grads=True,
        )
    expected = dict(zip(present, derived, strict=True))
    # A condition output (a mask) is a bool tensor in the reference and a float one in the op.
    named = dict(zip(op.inputs, args, strict=True)) | {name: value.detach().to(DTYPE) for name, value in values.items()}
    for k, override in op.overrides.items():
        if args[k] is not None:
            # By position: a spec name may be `grad_<output>` itself.
            expected[k] = fit_to(override(*(named.get(name) for name in op.scope), *grads_out), args[k].shape)
    return expected


def check_against_reference(op: OpUnderTest, args: Args, reference: Reference) -> None:
    """Forward values and every gradient equal the reference's, with and without `create_graph`
    (an op may compute its gradient another way when it must be differentiable again)."""
    outs = op(*args)
    values = reference(*args)
    for name, out in zip(op.outputs, outs, strict=True):
        close(out, values[name].to(out.dtype).expand_as(out), msg=prefixed(name))
    grads_out = incoming_gradients(op, outs)
    present = op.present(args)
    expected = expected_gradients(op, args, reference, grads_out)
    for create_graph in (False, True):
        got = torch.autograd.grad(
            [outs[k] for k in op.differentiable],
            [args[k] for k in present],
            grads_out,
            allow_unused=True,
            materialize_grads=True,
            retain_graph=True,
            create_graph=create_graph,
        )
        for k, grad in zip(present, got, strict=True):
            check_gradient(op.inputs[k], grad, expected[k], args[k].shape)


def check_gradient(name: str, grad: torch.Tensor, expected: torch.Tensor, shape: torch.Size) -> None:
    assert grad.shape == shape, f"gradient of {name} has shape {tuple(grad.shape)}"
    # Autograd of the plain formula is NaN where a `where` branch not taken is undefined;
    # the op must stay finite there (gradcheck checks its value).
    naive = ~torch.isfinite(expected)
    assert torch.isfinite(grad[naive]).all(), f"gradient of {name} is not finite"
    close(grad[~naive], expected[~naive], msg=prefixed(f"gradient of {name}"))


def only(
    op: OpUnderTest, args: Args, positions: Sequence[int]
) -> tuple[Callable[..., tuple[torch.Tensor, ...]], list[torch.Tensor]]:
    """A function of the tensors at `positions` (the other arguments fixed), for gradcheck."""

    def call(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        full = list(args)
        for k, tensor in zip(positions, tensors, strict=True):
            full[k] = (tensor + tensor.mT) / 2 if k in op.symmetric else tensor
        outs = op(*full)
        return tuple(outs[k] for k in op.differentiable)

    return call, [args[k] for k in positions]


def check_gradients(
    op: OpUnderTest, args: Args, second_order: bool = False, positions: Sequence[int] | None = None
) -> None:
    """gradcheck (and gradgradcheck) in the derived gradients and the derived forward mode (jvp, and
    forward over reverse), the other tensors held fixed."""
    if positions is None:
        positions = [k for k in op.checked if args[k] is not None]
    if not positions:
        return
    fixed = [a.detach() if isinstance(a, torch.Tensor) and k not in positions else a for k, a in enumerate(args)]
    # check_batched_grad: backward under vmap too (Note [in place under vmap] in opgen's emit);
    # check_undefined_grad: backward given None (an output that does not reach the loss)
    assert torch.autograd.gradcheck(
        *only(op, fixed, positions),
        check_forward_ad=True,
        check_backward_ad=True,
        check_batched_grad=True,
        check_undefined_grad=True,
    )
    if second_order:
        assert torch.autograd.gradgradcheck(*only(op, fixed, positions), check_fwd_over_rev=True)


def check_jvp(op: OpUnderTest, args: Args, reference: Reference) -> None:
    """`torch.func.jvp` of the op along every derived Tensor input at once equals forward-mode AD of
    the reference (the tangent of each differentiable output); finite where the reference's is not."""
    positions = [k for k in op.checked if args[k] is not None]
    if not positions:
        return
    fixed = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    generator = torch.Generator().manual_seed(3)
    tangents = tuple(torch.rand(fixed[k].shape, generator=generator, dtype=DTYPE) * 2 - 1 for k in positions)

    def along(fn: Callable[..., Any], pick: Callable[[Any], list[Any]]) -> Callable[..., tuple[torch.Tensor, ...]]:
        def call(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
            full = list(fixed)
            for k, tensor in zip(positions, tensors, strict=True):
                full[k] = tensor
            return tuple(as_tensor(value) for value in pick(fn(*full)))

        return call

    primals = tuple(fixed[k] for k in positions)
    got = torch.func.jvp(along(op, lambda outs: [outs[k] for k in op.differentiable]), primals, tangents)[1]
    named = along(reference, lambda values: [values[op.outputs[k]] for k in op.differentiable])
    want = torch.func.jvp(named, primals, tangents)[1]
    for k, tangent, wanted in zip(op.differentiable, got, want, strict=True):
        name, expected = op.outputs[k], wanted.to(tangent.dtype).expand_as(tangent)
        naive = ~torch.isfinite(expected)  # as in check_gradient
        assert torch.isfinite(tangent[naive]).all(), f"tangent of {name} is not finite"
        close(tangent[~naive], expected[~naive], msg=prefixed(f"tangent of {name}"))


def check_function_apply(op: OpUnderTest, function: Applied, args: Args, residuals: int = 0) -> None:
    """`Function.apply` returns the outputs and then the `residuals` tensors backward reads; the
    functional returns the outputs alone, equal to apply's."""
    got = counted(function.apply(*args), len(op.outputs) + residuals, "Function.apply")
    for name, a, b in zip(op.outputs, got[: len(op.outputs)], op(*args), strict=True):
        close(a, b, msg=prefixed(name))


def check_autocast(op: OpUnderTest, args: Args, policy: str | None, native: Callable[..., Any] | None = None) -> None:
    """Under bfloat16 autocast on CPU (and float16 on CUDA, where there is one), from float32 inputs:
    each differentiable output has the dtype of the op's autocast policy (`lower`: autocast's; else
    float32, as `float32`, `inputs` and type promotion give), that of PyTorch's own op where there is
    one, and float32's values within the lower precision."""
    devices = [("cpu", torch.bfloat16)] + ([("cuda", torch.float16)] if torch.cuda.is_available() else [])
    for device, low in devices:
        xs = [
            a.detach().to(device, torch.float32) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in args
        ]
        want = op(*xs)
        with torch.autocast(device, dtype=low):
            outs = op(*xs)
            theirs = native(*xs) if native is not None else None
        dtype = low if policy == "lower" else torch.float32
        for k in op.differentiable:
            assert outs[k].dtype == dtype, f"{op.outputs[k]}: {outs[k].dtype} under {device} autocast, not {dtype}"
            close(outs[k].float(), want[k].float(), rtol=0.05, atol=0.05)
        if theirs is not None and op.differentiable:
            assert outs[op.differentiable[0]].dtype == theirs.dtype, "PyTorch's own op has another dtype"


def check_non_differentiable_outputs(op: OpUnderTest, args: Args) -> None:
    outs = op(*args)
    for k, (name, out) in enumerate(zip(op.outputs, outs, strict=True)):
        assert out.requires_grad == (k in op.differentiable), name
    torch.autograd.backward(torch.stack([out.sum() for out in outs]).sum())  # the others' backward still works


def check_finite(op: OpUnderTest, args: Args, second_order: bool) -> None:
    """Values, first (and second) derivatives are finite at `args`."""
    outs = op(*args)
    for name, out in zip(op.outputs, outs, strict=True):
        assert torch.isfinite(out).all(), f"{name}: {out}"
    tensors = [args[k] for k in op.tensor_inputs]
    first = torch.autograd.grad(
        [outs[k].sum() for k in op.differentiable],
        tensors,
        create_graph=True,
        allow_unused=True,
        materialize_grads=True,
    )
    for k, grad in zip(op.tensor_inputs, first, strict=True):
        assert torch.isfinite(grad).all(), f"first derivative in {op.inputs[k]}: {grad}"
    if not second_order:
        return
    for k, grad in zip(op.tensor_inputs, first, strict=True):
        if grad.requires_grad:
            second = torch.autograd.grad(
                grad.sum(), tensors, retain_graph=True, allow_unused=True, materialize_grads=True
            )
            for j, value in zip(op.tensor_inputs, second, strict=True):
                assert torch.isfinite(value).all(), f"d2 / d{op.inputs[k]} d{op.inputs[j]}: {value}"


def check_against_native(op: OpUnderTest, args: Args, native: Callable[..., torch.Tensor]) -> None:
    """The first output and its derived gradients equal PyTorch's own op's."""
    out = op(*args)[0]
    expected = native(*args)
    close(out, expected)
    checked = [args[k] for k in op.checked]
    if not checked:
        return  # every gradient is an override, meant to differ from the op's
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(4), dtype=DTYPE)
    got = torch.autograd.grad(out, checked, grad_out, allow_unused=True, materialize_grads=True)
    want = torch.autograd.grad(expected, checked, grad_out, allow_unused=True, materialize_grads=True)
    for k, a, b in zip(op.checked, got, want, strict=True):
        close(a, b, msg=prefixed(f"gradient of {op.inputs[k]}"))


def check_saved(
    op: OpUnderTest,
    function: Applied,
    args: Args,
    saved: Sequence[str],
    residuals: Sequence[str] = (),
) -> None:
    """The tensors saved for backward are, in order, the inputs and outputs named in `saved` (what
    opgen's plan chose): each the very tensor `Function.apply` received or returned, never another
    intermediate. `residuals` names what apply returns after the outputs, for backward alone."""
    stored: list[torch.Tensor] = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        stored.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        returned = counted(function.apply(*args), len(op.outputs) + len(residuals), "Function.apply")
    named = dict(zip(op.inputs, args, strict=True)) | dict(zip((*op.outputs, *residuals), returned, strict=True))
    present = [name for name in saved if named[name] is not None]
    assert len(stored) == len(present), f"saved {len(stored)} tensors, expected {present}"
    for name, tensor in zip(present, stored, strict=True):
        want = named[name]
        assert tensor.data_ptr() == want.data_ptr() and tensor.shape == want.shape, f"saved a tensor that is not {name}"


def check_module(module: torch.nn.Module, op: OpUnderTest, forward_args: Args, full_args: Args) -> None:
    """The module equals the functional on its parameters, and every parameter gets a gradient."""
    got = counted(module(*forward_args), len(op.outputs), "the module")
    for a, b in zip(got, op(*full_args), strict=True):
        close(a, b)
    torch.autograd.backward(torch.stack([got[k].sum() for k in op.differentiable]).sum())
    for name, param in module.named_parameters():
        assert param.grad is not None and param.grad.shape == param.shape, name
    module.reset_parameters()  # type: ignore[operator, unused-ignore]


def check_vmap(op: OpUnderTest, samples: Sequence[Args]) -> None:
    """torch.func.vmap of the op over the samples (every present Tensor input batched) equals a
    Python loop over them, output by output."""
    base = samples[0]
    present = op.present(base)

    def call(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args = list(base)
        for k, tensor in zip(present, tensors, strict=True):
            args[k] = tensor
        return tuple(op(*args))

    got = torch.func.vmap(call)(*(torch.stack([s[k] for s in samples]) for k in present))
    rows = [call(*(s[k] for k in present)) for s in samples]
    for j, name in enumerate(op.outputs):
        want = torch.stack([row[j] for row in rows])
        close(got[j], want, msg=prefixed(f"vmap of {name}"))
