"""More checks of a generated op against plain autograd of the fuzzer's trees (`fuzz_check`):
forward mode (`torch.func.jvp`), `torch.func.vmap` over a batch of calls, float32 in float32 out,
and samples put ON the kinks of a formula (entries exactly 0, at the domain's edges, equal inputs,
equal entries along a row), where the tie conventions of spec-format "Gradients where a formula
has no derivative" decide the gradient.

Each check appends its disagreements to `problems` as text, as `fuzz_check._compare` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

F32_TOL = 2e-3  # relative to the output's scale: float32 keeps about 7 digits, a formula loses a few


def on_kinks(case: Any, values: dict[str, Any], seed: int) -> dict[str, Any]:
    """`values` with some entries moved onto kinks: 0, the domain's ends, another input's entries,
    a row's first entry. Only inside each input's domain; the first attempt keeps plain samples."""
    gen = torch.Generator().manual_seed(seed)
    pick = lambda n: int(torch.randint(0, n, (1,), generator=gen))  # noqa: E731
    out = dict(values)
    tensors = [d for d in case.inputs if isinstance(values.get(d.name), torch.Tensor)]
    for decl in tensors:
        v = out[decl.name].clone()
        lo, hi = decl.domain
        kind = pick(4)
        mask = torch.rand(v.shape, generator=gen) < 0.5
        if kind == 0 and lo <= 0 <= hi:
            v = torch.where(mask, torch.zeros_like(v), v)
        elif kind == 1:
            v = torch.where(mask, torch.full_like(v, lo if pick(2) else hi), v)
        elif kind == 2 and v.dim() > 0 and v.shape[-1] > 1:
            v = torch.where(mask, v[..., :1].expand_as(v), v)  # ties along the last dimension
        elif kind == 3:
            others = [d for d in tensors if d is not decl and out[d.name].shape == v.shape]
            if others:
                other = others[pick(len(others))]
                v = torch.where(mask, out[other.name].clamp(lo, hi), v)  # equal inputs
        out[decl.name] = v
    return out


def check_jvp(
    function: Callable[..., Any], reference: Callable[..., Any], case: Any, values: dict[str, Any], tag: str
) -> list[str]:
    """`torch.func.jvp` of the op along random tangents of the inputs that need a gradient."""
    names = [d.name for d in case.inputs if d.name in case.requires and isinstance(values[d.name], torch.Tensor)]
    if not names or case.overrides:  # an override's forward mode is its own (Note [jvp of an override])
        return []
    gen = torch.Generator().manual_seed(case.seed ^ 0x17)
    tangents = tuple(torch.randn(values[n].shape, generator=gen, dtype=values[n].dtype) for n in names)
    primals = tuple(values[n] for n in names)

    try:
        _, got = torch.func.jvp(bind(function, case, values, names), primals, tangents)
    except Exception as error:  # noqa: BLE001 - a crash is the finding
        return [f"torch.func.jvp of the op raised {type(error).__name__}: {str(error)[:300]}{tag}"]
    want = reverse_jvp(bind(reference, case, values, names), primals, tangents)
    return _differences("jvp", got, want, tag, 1e-6)


def bind(f: Callable[..., Any], case: Any, values: dict[str, Any], names: list[str]) -> Callable[..., Any]:
    """`f` of the tensors `names`, the other inputs fixed at `values`; its differentiable outputs as a tuple."""

    def call(*moving: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args = dict(values, **dict(zip(names, moving, strict=True)))
        result = f(*(args[d.name] for d in case.inputs))
        result = result if isinstance(result, tuple) else (result,)
        return tuple(r for r, o in zip(result, case.outputs, strict=True) if o.differentiable)

    return call


def reverse_jvp(
    f: Callable[..., tuple[torch.Tensor, ...]], primals: tuple[torch.Tensor, ...], tangents: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, ...]:
    """J t of `f` by reverse mode twice (the vjp of the vjp, linear in its cotangent): the tie conventions
    of PyTorch's backward formulas, which the op's forward mode follows; PyTorch's own forward formulas
    break some ties otherwise (`clamp(x, lo, hi)` at lo == hi gives lo's tangent, its backward none)."""
    outputs, pull = torch.func.vjp(f, *primals)
    _, push = torch.func.vjp(pull, tuple(torch.zeros_like(o) for o in outputs))
    return tuple(push(tuple(tangents))[0])


def check_vmap(function: Callable[..., Any], case: Any, values: dict[str, Any], tag: str) -> list[str]:
    """`torch.func.vmap` of the op over two calls (the first tensor input batched) equals the two calls."""
    batched = [d.name for d in case.inputs if isinstance(values[d.name], torch.Tensor)][:1]
    if not batched:
        return []
    name = batched[0]
    second = values[name].flip(tuple(range(values[name].dim()))) * 0.5 + values[name] * 0.5
    stacked = torch.stack([values[name], second])

    def call(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args = dict(values, **{name: x})
        result = function(*(args[d.name] for d in case.inputs))
        return result if isinstance(result, tuple) else (result,)

    try:
        got = torch.func.vmap(call)(stacked)
    except Exception as error:  # noqa: BLE001
        return [f"torch.func.vmap of the op raised {type(error).__name__}: {str(error)[:300]}{tag}"]
    one, two = call(values[name]), call(second)
    want = tuple(torch.stack([a.expand(b.shape) if a.dim() < b.dim() else a, b]) for a, b in zip(one, two, strict=True))
    return _differences("vmap", tuple(g.detach() for g in got), tuple(w.detach() for w in want), tag, 1e-9)


def check_float32(
    function: Callable[..., Any], reference: Callable[..., Any], case: Any, values: dict[str, Any], tag: str
) -> list[str]:
    """The op in float32 returns float32, near the float64 formula wherever float32 autograd of the
    formula as written is (a formula that loses its digits in float32 as written is not the op's fault)."""
    single = {k: v.to(torch.float32) if isinstance(v, torch.Tensor) else v for k, v in values.items()}
    got = function(*(single[d.name] for d in case.inputs))
    got = got if isinstance(got, tuple) else (got,)
    exact = reference(*(values[d.name] for d in case.inputs))
    try:
        plain = reference(*(single[d.name] for d in case.inputs))
    except RuntimeError:  # the fuzzer's float32 reference mixing dtypes (a float64 `heaviside` meets `@`)
        return []
    problems = []
    for out, g, e, p in zip(case.outputs, got, exact, plain, strict=True):
        if not isinstance(g, torch.Tensor):
            continue
        if g.dtype != torch.float32 and g.dtype != torch.bool:
            problems.append(f"{out.name} in float32: dtype {g.dtype}{tag}")
            continue
        e, p, g = e.to(torch.float64), p.to(torch.float64), g.detach().to(torch.float64)
        if g.shape != e.shape or not torch.isfinite(e).all():
            continue
        scale = max(1.0, float(e.abs().max())) if e.numel() else 1.0
        # Only gross errors: rounding in float32 of an ill-conditioned formula (sin of lgamma near 5000) is
        # noise that float32 as written may escape by luck; a float32 path that loses the value is not.
        good = (p - e).abs() <= F32_TOL * scale / 10
        bad = good & ~((g - e).abs() <= 25 * F32_TOL * scale)
        if bad.any():
            where = _first(bad, g, e)
            problems.append(f"{out.name} in float32 is far from float64: {where} (float32 as written fits){tag}")
    return problems


def _first(bad: torch.Tensor, got: torch.Tensor, want: torch.Tensor) -> str:
    index = tuple(int(i) for i in bad.nonzero()[0])
    values = f"op {float(got[index]):.10g}, plain torch {float(want[index]):.10g}"
    return f"{int(bad.sum())} of {bad.numel()}; at {list(index)} {values}"


def _differences(what: str, got: tuple[Any, ...], want: tuple[Any, ...], tag: str, tol: float) -> list[str]:
    problems = []
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        w = w.detach().to(torch.float64)
        g = torch.zeros_like(w) if g is None else g.detach().to(torch.float64)
        if g.shape != w.shape:
            problems.append(f"{what} of output {k}: shape {list(g.shape)}, plain torch {list(w.shape)}{tag}")
            continue
        known = torch.isfinite(w)
        scale = max(1.0, float(w[known].abs().max())) if known.any() else 1.0
        bad = known & ~torch.isclose(g, w, rtol=tol * 10, atol=tol * scale)
        if bad.any():
            problems.append(f"{what} of output {k} differs: {_first(bad, g, w)}{tag}")
    return problems
