"""torch.func and unusual calls of a generated op, against plain autograd of the fuzzer's trees
(`fuzz_check`): `jacrev`, `jacfwd`, `hessian`, per-sample gradients (`vmap(grad(f))`), `vmap` with the
batch along the last dimension and over two inputs at once, and inputs that are not contiguous, are
expanded views, or have no dimensions.

The reference of every first derivative is reverse mode of plain torch (`jacrev`), of the Hessian
plain torch's, where its forward-over-reverse and reverse-over-reverse agree:
the op's forward mode follows its backward's tie conventions (spec-format "Gradients where a formula
has no derivative"), and PyTorch's own forward formulas break some ties otherwise (`clamp` at
min == max). In CI a quarter of the cases run these checks (`case.seed % 4 == 0`), so the fuzz tests
take as long as before; with OPGEN_FUZZ_EXAMPLES set every case does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from fuzz_transforms import _differences, bind

EVERY_CASE = bool(int(os.environ.get("OPGEN_FUZZ_EXAMPLES", "0")))
TOL = 1e-6


def wanted(case: Any) -> bool:
    return EVERY_CASE or case.seed % 4 == 0


def _moving(case: Any, values: dict[str, Any], count: int) -> list[str]:
    """Up to `count` tensor inputs that need a gradient (none when the spec overrides one: its own rules)."""
    if case.overrides:
        return []
    return [d.name for d in case.inputs if d.name in case.requires and isinstance(values[d.name], torch.Tensor)][:count]


def _flat(tree: Any) -> tuple[torch.Tensor, ...]:
    """The tensors of a nested tuple (jacrev of several outputs and inputs), in order."""
    if isinstance(tree, torch.Tensor):
        return (tree,)
    return tuple(t for part in tree for t in _flat(part))


def _loss(f: Callable[..., Any], weights: tuple[torch.Tensor, ...]) -> Callable[..., torch.Tensor]:
    def loss(*moving: torch.Tensor) -> torch.Tensor:
        return sum((o * w).sum() for o, w in zip(f(*moving), weights, strict=True))  # type: ignore[return-value]

    return loss


def _attempt(what: str, tag: str, run: Callable[[], Any]) -> tuple[Any, list[str]]:
    try:
        return run(), []
    except Exception as error:  # noqa: BLE001 - a crash is the finding
        return None, [f"{what} of the op raised {type(error).__name__}: {str(error)[:300]}{tag}"]


def check_jacobians(function: Any, plain: Any, case: Any, values: dict[str, Any], tag: str) -> list[str]:
    """jacrev and jacfwd of the op over two inputs, and the Hessian of a weighted sum of its outputs."""
    names = _moving(case, values, 2)
    if not names:
        return []
    primals = tuple(values[n] for n in names)
    argnums = tuple(range(len(names)))
    op, ref = bind(function, case, values, names), bind(plain, case, values, names)
    want = _flat(torch.func.jacrev(ref, argnums=argnums)(*primals))
    problems: list[str] = []
    for what, transform in (("jacrev", torch.func.jacrev), ("jacfwd", torch.func.jacfwd)):
        got, crashed = _attempt(what, tag, lambda t=transform: _flat(t(op, argnums=argnums)(*primals)))
        problems += crashed or _differences(what, got, want, tag, TOL)
    if problems or not case.gradgrad:
        return problems
    gen = torch.Generator().manual_seed(case.seed ^ 0x4E55)
    weights = tuple(torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in ref(*primals))
    # Where plain torch's two compositions disagree (a singular point, `xlogy(x, x)` at 0: forward over
    # reverse and reverse over reverse put their NaNs in different blocks), no entry is compared.
    loss = _loss(ref, weights)
    outer = _flat(torch.func.hessian(loss, argnums)(*primals))
    inner = _flat(torch.func.jacrev(torch.func.jacrev(loss, argnums), argnums)(*primals))
    want = tuple(torch.where(torch.isclose(a, b), a, torch.nan) for a, b in zip(outer, inner, strict=True))
    got, crashed = _attempt("hessian", tag, lambda: _flat(torch.func.hessian(_loss(op, weights), argnums)(*primals)))
    return crashed or _differences("hessian", got, want, tag, TOL)


def _batched(values: dict[str, Any], name: str) -> torch.Tensor:
    """Two samples of input `name` stacked on a new first dimension: its value and a mix of it, inside its
    domain, uneven so that it makes no ties of its own (an even mix of a flip is symmetric: `amin` ties)."""
    value = values[name]
    return torch.stack([value, value.flip(tuple(range(value.dim()))) * 0.1 + value * 0.9])


def check_vmaps(function: Any, plain: Any, case: Any, values: dict[str, Any], tag: str) -> list[str]:
    """Per-sample gradients, `vmap(grad(loss))`, and `vmap` over two inputs batched along their last dimension."""
    names = _moving(case, values, 2)
    if not names:
        return []
    op, ref = bind(function, case, values, names), bind(plain, case, values, names)
    stacks = [_batched(values, n) for n in names]
    gen = torch.Generator().manual_seed(case.seed ^ 0x7A9)
    weights = tuple(torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in ref(*(values[n] for n in names)))
    argnums = tuple(range(len(names)))
    want = []
    for k in range(2):
        leaves = [s[k].clone().requires_grad_() for s in stacks]
        want.append(_grads(ref(*leaves), list(weights), leaves))
    per_sample = tuple(torch.stack([want[0][i], want[1][i]]) for i in range(len(names)))
    got, problems = _attempt(
        "vmap(grad(f))", tag, lambda: torch.func.vmap(torch.func.grad(_loss(op, weights), argnums))(*stacks)
    )
    problems = problems or _differences("vmap(grad(f))", got, per_sample, tag, TOL)
    last = [s.movedim(0, -1) for s in stacks]  # the batch along each input's last dimension: in_dims=-1
    plain_out = [ref(*(s[k] for s in stacks)) for k in range(2)]
    want_out = tuple(torch.stack([a, b]) for a, b in zip(*plain_out, strict=True))
    # out_dims stays 0: PyTorch's vmap expands an output that does not depend on the batch to a garbage
    # size with out_dims=-1 ([34359738370, 4]).
    got, crashed = _attempt("vmap(in_dims=-1)", tag, lambda: torch.func.vmap(op, tuple([-1] * len(names)))(*last))
    return problems + (crashed or _differences("vmap(in_dims=-1)", got, want_out, tag, 1e-9))


def _strange(value: torch.Tensor, how: int) -> torch.Tensor:
    """The same values as a non-contiguous tensor (a transpose of a copy), or with a zero stride where
    the value repeats along a dimension (an expanded view); a 0-dim tensor as it is."""
    if value.dim() >= 2 and how == 0:
        return value.mT.contiguous().mT
    if value.dim() >= 1 and value.shape[-1] > 1 and how == 1:
        return value[..., :1].expand(value.shape)  # equal entries along the last dimension: a view
    if value.dim() >= 1:
        return value.unsqueeze(-1).expand(*value.shape, 2)[..., 0]  # a stride of 2 elements
    return value


def check_layouts(function: Any, plain: Any, case: Any, values: dict[str, Any], tag: str) -> list[str]:
    """Every tensor input as a non-contiguous or expanded view: values and gradients equal plain autograd
    of the same tensors (the op must not read a view's storage as if it were dense)."""
    how = case.seed % 3
    strange = {k: _strange(v, how) if isinstance(v, torch.Tensor) else v for k, v in values.items()}
    names = _moving(case, strange, 3)
    problems: list[str] = []
    leaves = {n: strange[n].detach().requires_grad_() for n in names}
    got_args = dict(strange, **leaves)
    got, crashed = _attempt("a call with views as inputs", tag, lambda: bind(function, case, got_args, [])())
    if crashed:
        return crashed
    ref_leaves = {n: strange[n].detach().clone().requires_grad_() for n in names}
    want = bind(plain, case, dict(strange, **ref_leaves), [])()
    problems += _differences("value with views as inputs", got, want, tag, 1e-9)
    if problems or not names or not got:
        return problems
    gen = torch.Generator().manual_seed(case.seed ^ 0x1A7)
    weights = [torch.randn(w.shape, generator=gen, dtype=torch.float64) for w in want]
    mine = _grads(got, weights, [leaves[n] for n in names])
    theirs = _grads(want, weights, [ref_leaves[n] for n in names])
    return _differences("gradient with views as inputs", tuple(mine), tuple(theirs), tag, TOL)


def _grads(outputs: tuple[torch.Tensor, ...], weights: list[torch.Tensor], leaves: list[torch.Tensor]) -> list[Any]:
    terms = [(o * w).sum() for o, w in zip(outputs, weights, strict=True) if o.requires_grad]
    if not terms:
        return [torch.zeros_like(v) for v in leaves]
    found = torch.autograd.grad(sum(terms), leaves, allow_unused=True)
    return [torch.zeros_like(v) if g is None else g for g, v in zip(found, leaves, strict=True)]
