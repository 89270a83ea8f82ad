"""torch.compile(fullgraph=False) of a generated op on a random spec (`fuzz_specs`), in the fuzz worker:
values and the gradients of the inputs that need one equal the op called eagerly (which `fuzz_check`
compares with plain autograd), in float64 at the fuzzer's own samples. Slow: long runs only."""

from __future__ import annotations

from typing import Any

import torch
from fuzz_check import _close, _leaves, _sample, import_fresh
from fuzz_specs import Case


def check_compiled(parent: str, package: str, case: Case) -> list[str]:
    function = getattr(import_fresh(parent, package), case.op)
    torch._dynamo.reset()
    compiled = torch.compile(function, fullgraph=False, dynamic=False)
    values = _sample(case, case.seed, frozenset())
    problems: list[str] = []
    eager, mine = _leaves(case, values), _leaves(case, values)
    want = _outputs(function(*(eager[d.name] for d in case.inputs)))
    got = _outputs(compiled(*(mine[d.name] for d in case.inputs)))
    for out, g, w in zip(case.outputs, got, want, strict=True):
        _close(f"compiled value of {out.name}", g, w, problems)
    wrt = [d.name for d in case.inputs if d.name in case.requires]
    pairs = [(g, w) for o, g, w in zip(case.outputs, got, want, strict=True) if o.differentiable and w.requires_grad]
    if problems or not pairs or not wrt:
        return problems
    gen = torch.Generator().manual_seed(case.seed)
    weights = [torch.randn(w.shape, generator=gen, dtype=torch.float64) for _, w in pairs]
    theirs = torch.autograd.grad(
        sum((w * c).sum() for (_, w), c in zip(pairs, weights, strict=True)), [eager[n] for n in wrt], allow_unused=True
    )
    terms = [(g * c).sum() for (g, _), c in zip(pairs, weights, strict=True) if g.requires_grad]
    if not terms:
        return ["the compiled op's outputs need no gradient"]
    ours = torch.autograd.grad(sum(terms), [mine[n] for n in wrt], allow_unused=True)
    for name, g, w in zip(wrt, ours, theirs, strict=True):
        _close(f"compiled d/d{name}", g, w, problems)
    return problems


def _outputs(result: Any) -> tuple[Any, ...]:
    return result if isinstance(result, tuple) else (result,)
