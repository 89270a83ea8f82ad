"""Random specs with a `module:` section: some Tensor inputs of a random formula (`fuzz_specs`) held as
parameters (a random shape and init), its float and int inputs as attributes filled from constructor
args with defaults. `module_case` writes the section; `check_module` (in the fuzz worker) builds the
module and compares it with the functional and with plain autograd of the fuzzer's trees: the
parameters' shapes and init range, the value, and the gradients of the parameters and the inputs
through `torch.func.functional_call` and through `.backward()`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from fuzz_check import _close, import_fresh, reference
from fuzz_specs import Case


def module_case(case: Case, held: int) -> tuple[Case, tuple[str, ...]] | None:
    """`case` with a module holding up to `held` of its plain Tensor inputs (never the first: the module
    takes it in `forward`) and its float and int inputs; None when it has one Tensor input only, or
    overrides a gradient (the reference here is plain autograd)."""
    if case.overrides:
        return None
    tensors = [d for d in case.inputs if d.kind == "Tensor"]
    params = tuple(d.name for d in tensors[1 : 1 + held])
    if not params:
        return None
    lines = ["", "  args:"]
    scalars = [d for d in case.inputs if d.kind in ("float", "int")]
    lines += [f"    {d.name}: {d.kind} = {d.value!r}" for d in scalars]
    if not scalars:
        lines.pop()
    lines.append("  parameters:")
    for decl in tensors[1 : 1 + held]:
        lo, hi = decl.domain
        margin = (hi - lo) * 1e-3
        shape = list(_shape(case, decl))
        lines.append(f"    {decl.name}: {{shape: {shape}, init: uniform({lo + margin}, {hi - margin})}}")
    extra = dict(case.extra, module="\n".join(lines))
    return replace(case, extra=extra), params


def check_module(parent: str, package: str, case: Case, params: tuple[str, ...]) -> list[str]:
    """What differs between the generated module and plain autograd of the case's trees."""
    found = vars(import_fresh(parent, package)).values()
    module_class = next(v for v in found if isinstance(v, type) and issubclass(v, torch.nn.Module))
    torch.manual_seed(case.seed)
    module = module_class().double()
    problems: list[str] = []
    for name in params:
        decl = next(d for d in case.inputs if d.name == name)
        value = getattr(module, name)
        if not isinstance(value, torch.nn.Parameter):
            return [f"{name} is not a Parameter of the module: {type(value).__name__}"]
        if tuple(value.shape) != _shape(case, decl):
            problems.append(f"parameter {name} has shape {list(value.shape)}")
        if value.numel() and not (decl.domain[0] <= float(value.min()) and float(value.max()) <= decl.domain[1]):
            problems.append(f"parameter {name} is outside its init range {decl.domain}")
    if problems:
        return problems
    gen = torch.Generator().manual_seed(case.seed)
    free = [d for d in case.inputs if d.name not in params and d.kind not in ("float", "int")]
    values: dict[str, Any] = {}
    for decl in free:
        if not decl.tensor:
            values[decl.name] = decl.value
            continue
        lo, hi = decl.domain
        draw = torch.rand(_shape(case, decl), generator=gen, dtype=torch.float64)
        values[decl.name] = draw * (hi - lo) * 0.998 + lo + (hi - lo) * 1e-3
    args = [values[d.name] for d in free]
    leaves = {d.name: values[d.name].clone().requires_grad_() for d in free if d.name in case.requires}
    everything = dict(values, **{d.name: d.value for d in case.inputs if d.kind in ("float", "int")})
    everything.update({n: getattr(module, n).detach().clone().requires_grad_() for n in params})
    everything.update(leaves)
    want, _ = reference(case, everything, frozenset())
    weights = [torch.randn(w.shape, generator=gen, dtype=torch.float64) for w in want]
    differentiable = [i for i, o in enumerate(case.outputs) if o.differentiable and want[i].requires_grad]
    wrt = [*params, *leaves]
    theirs = _grads(
        [want[i] for i in differentiable], [weights[i] for i in differentiable], [everything[n] for n in wrt]
    )
    own = {n: everything[n].detach().clone().requires_grad_() for n in params}
    mine_args = [leaves[d.name].detach().clone().requires_grad_() if d.name in leaves else values[d.name] for d in free]
    got = torch.func.functional_call(module, own, tuple(mine_args))
    got = got if isinstance(got, tuple) else (got,)
    for out, g, w in zip(case.outputs, got, want, strict=True):
        _close(f"module output {out.name}", g, w, problems)
    if problems or not differentiable:
        return problems
    inputs = [own[n] for n in params] + [a for a, d in zip(mine_args, free, strict=True) if d.name in leaves]
    mine = _grads([got[i] for i in differentiable], [weights[i] for i in differentiable], inputs)
    for name, g, w in zip(wrt, mine, theirs, strict=True):
        _close(f"d/d{name} through functional_call", g, w, problems)
    called = module(*args)
    called = called if isinstance(called, tuple) else (called,)
    sum((called[i] * weights[i]).sum() for i in differentiable).backward()  # type: ignore[union-attr]
    for name, w in zip(params, theirs, strict=False):
        _close(f"d/d{name} through .backward()", getattr(module, name).grad, w, problems)
    return problems


def _shape(case: Case, decl: Any) -> tuple[int, ...]:
    """The shape of a Tensor input in the call, as `fuzz_check._sample` draws it (a `Tensor[]`: none)."""
    return () if decl.dims == () else tuple(dict(case.shapes).get(decl.name, (3, 4)))


def _grads(outputs: list[torch.Tensor], weights: list[torch.Tensor], leaves: list[torch.Tensor]) -> list[Any]:
    terms = [(o * w).sum() for o, w in zip(outputs, weights, strict=True) if o.requires_grad]
    if not terms:
        return [None] * len(leaves)
    return list(torch.autograd.grad(sum(terms), leaves, allow_unused=True))
