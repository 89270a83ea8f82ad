"""The float32 accuracy checks of the generated tests: an op at extreme inputs against exact values.

Part of the checks every generated test file calls through `harness` (which re-exports
`check_extremes`); the exact values come from opgen's plan (opgen/plan/extremes.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .harness import Args, OpUnderTest, Reference


def extreme_inputs(op: OpUnderTest, args: Args, name: str, point: float, others: dict[str, float]) -> Args:
    """float32 inputs of one element: `name` at `point`, the other Tensor inputs at `others`."""
    args = list(args)
    for k in op.tensor_inputs:
        value = point if op.inputs[k] == name else others[op.inputs[k]]
        args[k] = torch.tensor([value], dtype=torch.float32, requires_grad=True)
    return args


# Note [what a float32 op can give]
# A float32 op computes with float32 intermediates: rounding one of them (`a * x` in
# `sin(a * x)` at x = 1e4) costs as much as moving the input by an ulp, and no formula in
# float32 avoids it. So a value may miss the exact one by 1e-5 relative (1e-6 absolute) plus
# its slack: how far the float64 reference moves when the moving input moves by two float32
# ulps either way. Numbers the spec computes from constants and non-tensor inputs alone (the
# clamp bound `1 - eps`) reach a float32 op rounded to float32; the exact rows are computed
# with them rounded so (opgen/plan/extremes.py).
ULPS = 2.0**-22


# Note [as accurate as the formula]
# A formula as written may itself lose digits in float32 that no form of it keeps cheaply: a
# difference of lgammas at 1e4, `y * log(p) + (1 - y) * log(1 - p)` near p = 1. A careful person
# writing the op by hand gives what the formula gives. So each row also allows MARGIN times the
# error of the spec's plain-torch reference evaluated in float32 at the same inputs (where that is
# finite, and near the exact value: within KEPT relative): an op as accurate as the formula as written
# passes, one that computes in a worse form (and loses digits the formula keeps) still fails. Where
# the formula as written keeps no digit (`(x + sqrt(x * x + 1)) / 2` at x = -1e4 is 0 in float32),
# it is no measure: the op must be accurate, by a stable form opgen or the user writes.
MARGIN = 2.0
KEPT = 0.5


def accurate(
    got: torch.Tensor, exact: float, rival: torch.Tensor | None = None, slack: float = 0.0, written: float | None = None
) -> bool:
    """Finite, and within 1e-5 relative (1e-6 absolute) plus `slack` of exact, or within MARGIN times
    the float32 error of the formula as written (`written`, its float32 value) where that keeps a
    digit, or no worse than PyTorch's op (`rival`, when finite)."""
    if not torch.isfinite(got).all():
        return False
    error = abs(got.item() - exact)
    allowed = 1e-6 + 1e-5 * abs(exact) + slack
    if written is not None and math.isfinite(written) and abs(written - exact) <= KEPT * abs(exact):
        allowed = max(allowed, MARGIN * abs(written - exact))
    if error <= allowed:
        return True
    return rival is not None and bool(torch.isfinite(rival).all()) and error <= abs(rival.item() - exact)


def written_in_float32(op: OpUnderTest, reference: Reference, inputs: Args, k: int) -> tuple[list[float], float]:
    """The reference's outputs, and the slope of their differentiable sum in input `k`, computed in
    float32 at the float32 `inputs` (Note [as accurate as the formula]); NaN where not computed."""
    moved = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in inputs]
    computed = reference(*moved)
    outs = [torch.as_tensor(computed[name]) for name in op.outputs]
    tracked = [outs[j].sum() for j in op.differentiable if outs[j].requires_grad]
    slope = math.nan
    if tracked:
        grad = torch.autograd.grad(tracked, [moved[k]], allow_unused=True, materialize_grads=True)[0]
        slope = grad.item() if grad.dtype == torch.float32 else math.nan
    return [out.item() if out.dtype == torch.float32 else math.nan for out in outs], slope


def reference_at(
    op: OpUnderTest, reference: Reference, inputs: Args, k: int, factor: float
) -> tuple[list[float], float]:
    """The float64 reference's outputs, and its slope in input `k`, with input `k` scaled by `factor`."""
    moved = [a.detach().to(torch.float64).requires_grad_() if isinstance(a, torch.Tensor) else a for a in inputs]
    moved[k] = (moved[k].detach() * factor).requires_grad_()
    computed = reference(*moved)
    outs = [torch.as_tensor(computed[name], dtype=torch.float64) for name in op.outputs]
    tracked = [outs[j].sum() for j in op.differentiable if outs[j].requires_grad]
    slope = torch.autograd.grad(tracked, [moved[k]], allow_unused=True, materialize_grads=True)[0] if tracked else 0
    return [out.item() for out in outs], float(slope)


def rounding_slack(op: OpUnderTest, reference: Reference, inputs: Args, k: int) -> tuple[list[float], float]:
    """The slack of each output and of the slope in input `k` (Note [what a float32 op can give]);
    0 where the reference is not finite."""
    values, slope = reference_at(op, reference, inputs, k, 1.0)
    slack = [0.0] * len(values)
    slope_slack = 0.0
    for factor in (1 - ULPS, 1 + ULPS):
        moved_values, moved_slope = reference_at(op, reference, inputs, k, factor)
        for j, (a, b) in enumerate(zip(values, moved_values, strict=True)):
            slack[j] = max(slack[j], finite_or_zero(abs(a - b)))
        slope_slack = max(slope_slack, finite_or_zero(abs(slope - moved_slope)))
    return slack, slope_slack


def finite_or_zero(value: float) -> float:
    return value if math.isfinite(value) else 0.0


def check_extremes(
    op: OpUnderTest,
    args: Args,
    extremes: Sequence[tuple[str, float, Sequence[float], float | None, str]],
    places: dict[str, dict[str, float]],
    reference: Reference,
    native: Callable[..., torch.Tensor] | None = None,
) -> None:
    """float32 values and derivatives at extreme inputs against exact ones (see EXTREMES, Note [what a
    float32 op can give] and Note [as accurate as the formula])."""
    bad: list[str] = []
    for name, point, exact, slope, at in extremes:
        inputs = extreme_inputs(op, args, name, point, places[at])
        k = op.inputs.index(name)
        outs = op(*inputs)
        slack, slope_slack = rounding_slack(op, reference, inputs, k)
        written, written_slope = written_in_float32(op, reference, inputs, k)
        rival = native(*inputs) if native is not None else None
        for j, (out, want) in enumerate(zip(outs, exact, strict=True)):
            if not accurate(out, want, rival if j == 0 else None, slack[j], written[j]):
                bad.append(f"output {j} at {name} = {point} ({at}): {out.item()!r}, exact {want!r}")
        if slope is None:
            continue
        rival_grad = None
        if rival is not None and rival.requires_grad and len(op.differentiable) == 1:
            (rival_grad,) = torch.autograd.grad(rival.sum(), [inputs[k]], allow_unused=True, materialize_grads=True)
        (grad,) = torch.autograd.grad(
            [outs[j].sum() for j in op.differentiable], [inputs[k]], allow_unused=True, materialize_grads=True
        )
        if not accurate(grad, slope, rival_grad, slope_slack, written_slope):
            bad.append(f"derivative at {name} = {point} ({at}): {grad.item()!r}, exact {slope!r}")
    assert not bad, "\n".join(bad)


def check_small_calls(
    op: OpUnderTest,
    function: Any,
    args: Args,
    extremes: Sequence[tuple[str, float, Sequence[float], float | None, str]],
    places: dict[str, dict[str, float]],
) -> None:
    """At each extreme row, float32 values, first and second derivatives of the small-call path
    (PyTorch's ops under autograd: Note [small calls] in opgen's emit) are the Function's: non-finite
    at the same places, within 1e-4 relative (1e-6 absolute) elsewhere."""
    bad: list[str] = []
    kept = function.native_below
    try:
        for name, point, _, _, at in extremes:
            paths = [
                _derivatives(op, function, below, extreme_inputs(op, args, name, point, places[at]), name)
                for below in (2**62, 0)
            ]
            for what, small, full in zip([*op.outputs, f"d/d{name}", f"d2/d{name}2"], *paths, strict=True):
                same = torch.equal(torch.isfinite(small), torch.isfinite(full))
                if not same or not torch.allclose(small, full, rtol=1e-4, atol=1e-6, equal_nan=True):
                    bad.append(
                        f"{what} at {name} = {point} ({at}): small call {small.item()!r}, Function {full.item()!r}"
                    )
    finally:
        function.native_below = kept
    assert not bad, "\n".join(bad)


def _derivatives(op: OpUnderTest, function: Any, below: int, inputs: Args, name: str) -> list[torch.Tensor]:
    """The outputs and the first and second derivatives of their sum in `name`, with `native_below` at `below`."""
    function.native_below = below
    k = op.inputs.index(name)
    outs = op(*inputs)
    total = torch.stack([outs[j].sum() for j in op.differentiable]).sum()
    (first,) = torch.autograd.grad(total, [inputs[k]], create_graph=True, materialize_grads=True)
    second = torch.zeros_like(first)
    if first.requires_grad:
        (second,) = torch.autograd.grad(first.sum(), [inputs[k]], allow_unused=True, materialize_grads=True)
    return [*(out.detach() for out in outs), first.detach(), second]
