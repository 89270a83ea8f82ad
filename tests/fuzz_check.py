"""Compare a generated op with plain autograd of the fuzzer's own trees, in float64.

Runs inside the fuzz worker (`fuzz_worker`): imports the generated package, calls the
functional on random inputs from the declared domains, and compares every output, the
first derivatives of every input that needs one (an overridden input: the override
formula, summed to the input's shape) and, unless `gradgrad: false` or an override,
second derivatives (a Hessian-vector product), with the same computed by
`fuzz_ast.Evaluator`. Returns the disagreements as text; empty means the op is right.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import torch
from fuzz_ast import Evaluator
from fuzz_funcs import check_jacobians, check_layouts, check_vmaps, wanted
from fuzz_specs import Case
from fuzz_transforms import check_float32, check_jvp, check_vmap, on_kinks

RTOL, ATOL = 1e-6, 1e-7
NEAR = 1e-7  # a comparison this close to switching (but not tied) is a kink reached by rounding: draw again


def import_fresh(parent: str, package: str) -> Any:
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]
    sys.path.insert(0, parent)
    try:
        importlib.invalidate_caches()
        return importlib.import_module(package)
    finally:
        sys.path.remove(parent)


def _sample(case: Case, seed: int, absent: frozenset[str]) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    sizes = dict(case.sizes)
    shapes = dict(case.shapes)
    values: dict[str, Any] = {}
    for decl in case.inputs:
        if not decl.tensor:
            values[decl.name] = decl.value
            continue
        if decl.name in absent:
            values[decl.name] = None
            continue
        shape: tuple[int, ...] = shapes.get(decl.name, (3, 4)) if decl.dims is None else ()
        for d in decl.dims or ():
            shape += case.batch if d == "..." else (sizes[d],)
        lo, hi = decl.domain
        margin = (hi - lo) * 1e-3
        values[decl.name] = torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo - 2 * margin) + lo + margin
    return values


def _leaves(case: Case, values: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for decl in case.inputs:
        v = values[decl.name]
        out[decl.name] = v.clone().requires_grad_(decl.name in case.requires) if isinstance(v, torch.Tensor) else v
    return out


def reference(case: Case, args: dict[str, Any], absent: frozenset[str]) -> tuple[list[torch.Tensor], Evaluator]:
    env: dict[str, torch.Tensor] = {}
    for name, size in case.sizes:
        env[name] = torch.tensor(float(size), dtype=torch.float64)
    for decl in case.inputs:
        v = args[decl.name]
        env[decl.name] = v if isinstance(v, torch.Tensor) or v is None else torch.tensor(float(v), dtype=torch.float64)
    ev = Evaluator(env)
    for name, node in case.lets:
        env[name] = ev(node)
    results = []
    for out in case.outputs:
        value = ev(out.node)
        for opt, term in out.optional_terms:
            if opt not in absent:
                value = value + ev(term)
        env[out.name] = value
        results.append(value.to(torch.float64) if value.dtype == torch.bool else value)
    return results, ev


def _close(what: str, got: Any, want: torch.Tensor | None, problems: list[str]) -> None:
    if want is None:  # plain autograd: no path from this input
        if isinstance(got, torch.Tensor) and got.numel() and float(got.detach().abs().max()) > ATOL:
            problems.append(f"{what}: expected zero or None, got max |value| {float(got.detach().abs().max()):.3g}")
        return
    if got is None:
        got = torch.zeros_like(want)
    if not isinstance(got, torch.Tensor):
        got = torch.tensor(float(got), dtype=torch.float64)
    got = got.detach().to(torch.float64)
    want = want.detach()
    if tuple(got.shape) != tuple(want.shape):
        problems.append(f"{what}: shape {list(got.shape)}, plain autograd gives {list(want.shape)}")
        return
    if not torch.isfinite(want).all():
        return  # outside what the grammar promises; not this op's fault
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    bad = ~torch.isclose(got, want, rtol=RTOL, atol=ATOL * scale) | ~torch.isfinite(got)
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        problems.append(
            f"{what}: {int(bad.sum())} of {bad.numel()} differ; at {list(index)} op {float(got[index]):.10g}, "
            f"plain autograd {float(want[index]):.10g}"
        )


def _override_value(case: Case, node: Any, env: dict[str, torch.Tensor], shape: torch.Size) -> torch.Tensor:
    with torch.no_grad():
        value = Evaluator(env)(node)
    target = torch.broadcast_shapes(value.shape, shape)
    return value.expand(target).sum_to_size(shape)


def check_case(parent: str, package: str, case: Case) -> dict[str, Any]:
    """Every disagreement of the generated op with plain autograd, for each None pattern of `Tensor?` inputs."""
    module = import_fresh(parent, package)
    function = getattr(module, case.op)
    problems: list[str] = []
    notes: list[str] = []
    optional = [d.name for d in case.inputs if d.kind == "Tensor?"]
    for absent in [frozenset(), *(frozenset([n]) for n in optional)]:
        for attempt in range(4):
            values = _sample(case, case.seed + attempt, absent)
            if case.seed % 2 == 0 and attempt < 2:  # half the cases first try points on the kinks
                values = on_kinks(case, values, case.seed + attempt)
            ref_args = _leaves(case, values)
            want, ev = reference(case, ref_args, absent)
            if ev.near >= NEAR:
                break
        else:
            notes.append("every sample sat within rounding of a kink")
            continue
        if not all(torch.isfinite(w).all() for w in want):
            notes.append("plain autograd is not finite here")
            continue
        tag = f" (with {', '.join(sorted(absent))} None)" if absent else ""
        _compare(case, function, values, ref_args, want, absent, tag, problems)
        if not problems:
            _transforms(case, function, values, absent, tag, problems)
    return {"problems": problems, "notes": notes}


def _transforms(
    case: Case, function: Any, values: dict[str, Any], absent: frozenset[str], tag: str, problems: list[str]
) -> None:
    """Forward mode, vmap, float32 (`fuzz_transforms`), torch.func and views (`fuzz_funcs`), against the same trees."""
    names = [d.name for d in case.inputs]

    def plain(*args: Any) -> tuple[torch.Tensor, ...]:
        return tuple(reference(case, dict(zip(names, args, strict=True)), absent)[0])

    problems += check_jvp(function, plain, case, values, tag)
    problems += check_vmap(function, case, values, tag)
    problems += check_float32(function, plain, case, values, tag)
    if wanted(case) and not problems:  # torch.func and inputs that are views (`fuzz_funcs`)
        for check in (check_jacobians, check_vmaps, check_layouts):
            problems += check(function, plain, case, values, tag)


def _compare(
    case: Case,
    function: Any,
    values: dict[str, Any],
    ref_args: dict[str, Any],
    want: list[torch.Tensor],
    absent: frozenset[str],
    tag: str,
    problems: list[str],
) -> None:
    args = _leaves(case, values)
    got = function(*(args[d.name] for d in case.inputs))
    got = got if isinstance(got, tuple) else (got,)
    if len(got) != len(want):
        problems.append(f"the op returns {len(got)} values for {len(want)} outputs{tag}")
        return
    for out, g, w in zip(case.outputs, got, want, strict=True):
        _close(f"value of {out.name}{tag}", g, w, problems)
        if not out.differentiable and isinstance(g, torch.Tensor) and g.requires_grad:
            problems.append(f"{out.name} is `differentiable: false` but requires grad{tag}")
    wrt = [d.name for d in case.inputs if d.name in case.requires and d.name not in absent]
    gen = torch.Generator().manual_seed(case.seed ^ 0x5EED)
    cotangents = {
        o.name: torch.randn(w.shape, generator=gen, dtype=torch.float64)
        for o, w in zip(case.outputs, want, strict=True)
    }
    pairs = [(o, g, w) for o, g, w in zip(case.outputs, got, want, strict=True) if o.differentiable]
    if not pairs or not wrt:
        return
    second = case.gradgrad and not case.overrides
    ref_loss = sum((w * cotangents[o.name]).sum() for o, _, w in pairs)
    ref_grads = _grad(ref_loss, [ref_args[n] for n in wrt], create_graph=second)
    op_terms = [(g * cotangents[o.name]).sum() for o, g, _ in pairs if isinstance(g, torch.Tensor) and g.requires_grad]
    op_grads = _grad(sum(op_terms), [args[n] for n in wrt], create_graph=second) if op_terms else [None] * len(wrt)
    env = _grad_env(case, ref_args, want, cotangents)
    for i, name in enumerate(wrt):
        override = dict(case.overrides).get(name)
        if override is not None:
            ref_grads[i] = _override_value(case, override, env, ref_args[name].shape)
        _close(f"d/d{name}{tag}", op_grads[i], ref_grads[i], problems)
    if not second or problems:
        return
    vectors = [torch.randn(args[n].shape, generator=gen, dtype=torch.float64) for n in wrt]
    ref_h = _hvp(ref_grads, vectors, [ref_args[n] for n in wrt])
    op_h = _hvp(op_grads, vectors, [args[n] for n in wrt])
    for i, name in enumerate(wrt):
        _close(f"second derivative (Hessian-vector product) for {name}{tag}", op_h[i], ref_h[i], problems)


def _grad(loss: Any, inputs: list[torch.Tensor], create_graph: bool) -> list[Any]:
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        return [None] * len(inputs)
    return list(torch.autograd.grad(loss, inputs, create_graph=create_graph, allow_unused=True))


def _hvp(grads: list[Any], vectors: list[torch.Tensor], inputs: list[torch.Tensor]) -> list[Any]:
    terms = [(g * v).sum() for g, v in zip(grads, vectors, strict=True) if g is not None and g.requires_grad]
    if not terms:
        return [None] * len(inputs)
    return _grad(sum(terms), inputs, create_graph=False)


def _grad_env(case: Case, ref_args: dict[str, Any], want: list[torch.Tensor], cot: dict[str, torch.Tensor]) -> dict:
    env: dict[str, torch.Tensor] = {n: torch.tensor(float(s), dtype=torch.float64) for n, s in case.sizes}
    for decl in case.inputs:
        v = ref_args[decl.name]
        if v is not None:
            env[decl.name] = v.detach() if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float64)
    ev = Evaluator(env)
    with torch.no_grad():
        for name, node in case.lets:
            env[name] = ev(node)
    for out, w in zip(case.outputs, want, strict=True):
        env[out.name] = w.detach()
        env["grad_" + out.name] = cot[out.name]
    differentiable = [o for o in case.outputs if o.differentiable]
    if len(differentiable) == 1:
        env["grad"] = cot[differentiable[0].name]
    return env
