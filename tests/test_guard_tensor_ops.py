"""A `where` guards the restricted arguments of its branches (Note [double where] in
opgen/derive/guard.py), but not inside a tensor operation: there the condition's entries are
not the operation's. `where(7 < x0, -x0, sum(... acosh(2 + x1) ...))` with x0 [N, K] and x1
[K, M] put `where(7 >= x0, x1 + 2, 2)` inside the sum, and was refused as "cannot broadcast
[N, K] with [K, M]"."""

from __future__ import annotations

import sympy
import torch
from spec_ops import build_ops

from opgen.derive.guard import guard_branches
from opgen.formula import functions as fn
from opgen.formula.tensor import reduction

SPEC = """
    name: op
    inputs:
      x0: Tensor[N, K]
      x1: Tensor[K, M]
    outputs:
      o: where(7 < x0, -x0, sum(fmax(softmax(acosh(2 + x1), dim=0), 3)))
"""


def _plain(x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
    inner = torch.fmax(torch.softmax(torch.acosh(2 + x1), 0), torch.tensor(3.0, dtype=x1.dtype)).sum()
    return torch.where(7 < x0, -x0, inner)


def test_a_guard_stays_out_of_a_tensor_operation(tmp_path):
    ops = build_ops(tmp_path, "guard_tensor_ops", {"op": SPEC})
    x0 = (torch.arange(6, dtype=torch.float64).reshape(2, 3) * 2.5).requires_grad_()
    x1 = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    got, want = ops.op(x0, x1), _plain(x0, x1)
    torch.testing.assert_close(got, want)
    seed = torch.rand_like(want)
    grads = torch.autograd.grad((got * seed).sum(), (x0, x1))
    wants = torch.autograd.grad((want * seed).sum(), (x0, x1))
    for g, w in zip(grads, wants, strict=True):
        torch.testing.assert_close(g, w)


def test_the_guard_of_an_elementwise_branch_but_not_of_a_reduction():
    x, y = sympy.symbols("x y", real=True)
    inside = reduction("sum", sympy.log(y), (-1,), True)
    guarded = guard_branches(fn.where(x > 0, sympy.log(x) + inside, 0), frozenset({x, y}))
    assert guarded == fn.where(x > 0, sympy.log(fn.where(x > 0, x, 1)) + inside, 0)
