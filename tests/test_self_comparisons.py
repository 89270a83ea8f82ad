"""A `where` whose condition compares a value with itself (`l < l`) drops a branch, and the shape that
branch broadcast with as written, as soon as SymPy decides the comparison: for a let's symbol not when
the formula is read, but once the let is read in, or once CSE names `sqrt(s)` by a real symbol. A
reduction read over `[N, N]` then summed one copy of the other branch instead of N: a gradient N times
too small (Note [comparisons of a value with itself] in opgen/formula/functions.py, Note [reductions
of constant dimensions] in opgen/formula/written.py). Checked against plain torch autograd of the
formula as written, in float64, first and second derivatives."""

from __future__ import annotations

import pytest
import torch
from spec_ops import build_ops

LETS = {"s": "sum(x)", "q": "sqrt(sum(x))", "d": "std(abs(sum(x, dim=0)))", "s2": "sum(x)"}
REF_LETS = {
    "s": lambda x: x.sum(),
    "q": lambda x: x.sum().sqrt(),
    "d": lambda x: x.sum(0).abs().std(),
    "s2": lambda x: x.sum(),
}


def _full(t, x):
    return t.expand(x.shape[0], x.shape[0])


CASES = {
    # the fuzz case: the let read in decides `d < d`
    "sum_keepdim": (
        "sum(9.0 * tanh(where(d < d, square(x @ x.T), -d)), dim=-2, keepdim=true)",
        lambda x, v: 9 * torch.tanh(torch.where(v["d"] < v["d"], (x @ x.T) ** 2, -v["d"])).sum(-2, keepdim=True),
    ),
    # CSE decides `tmp < tmp` of `sqrt(sum(x))`
    "sum_sqrt": (
        "sum(tanh(where(q < q, x @ x.T, -q)), dim=-2, keepdim=true)",
        lambda x, v: torch.tanh(torch.where(v["q"] < v["q"], x @ x.T, -v["q"])).sum(-2, keepdim=True),
    ),
    "true_branch": (
        "sum(tanh(where(q <= q, -q, x @ x.T)), dim=-1)",
        lambda x, v: torch.tanh(torch.where(v["q"] <= v["q"], -v["q"], x @ x.T)).sum(-1),
    ),
    # two lets of the same formula
    "two_lets": (
        "sum(tanh(where(s < s2, x @ x.T, -s / 9)), dim=0) + mean(where(s != s2, x @ x.T, s ** 2), dim=-2)",
        lambda x, v: (
            torch.tanh(torch.where(v["s"] < v["s2"], x @ x.T, -v["s"] / 9)).sum(0)
            + torch.where(v["s"] != v["s2"], x @ x.T, v["s"] ** 2).mean(-2)
        ),
    ),
    "norm_logsumexp_var": (
        "norm(where(q > q, x @ x.T, q), dim=-1) + logsumexp(where(d < d, x @ x.T, -d), dim=-1)"
        " + var(where(d < d, x @ x.T, -d), dim=-2)",
        lambda x, v: (
            torch.linalg.vector_norm(_full(torch.where(v["q"] > v["q"], x @ x.T, v["q"]), x), dim=-1)
            + torch.logsumexp(_full(torch.where(v["d"] < v["d"], x @ x.T, -v["d"]), x), -1)
            + _full(torch.where(v["d"] < v["d"], x @ x.T, -v["d"]), x).var(-2)
        ),
    ),
    "or_condition": (
        "sum(where((q < q) | (x > 3), x, q), dim=0)",
        lambda x, v: torch.where((v["q"] < v["q"]) | (x > 3), x, v["q"]).sum(0),
    ),
}


def _spec(formula: str, policy: str) -> str:
    lets = "".join(f'  {name}: "{text}"\n' for name, text in LETS.items())
    return (
        "name: op\ninputs:\n  x: Tensor[N, N]\n  p: Tensor[N]?\n"
        f'let:\n{lets}outputs:\n  o: "{formula}"\n  o2: "x + p"\noptimize: {{policy: {policy}}}\n'
    )


def _grads(outputs, x, weights):
    (g,) = torch.autograd.grad(outputs, x, weights, create_graph=True)
    (gg,) = torch.autograd.grad((g * torch.linspace(-1, 1, g.numel(), dtype=g.dtype).view_as(g)).sum(), x)
    return g, gg


@pytest.mark.parametrize("policy", ["speed", "memory"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_decided_comparison_keeps_the_shape_as_written(tmp_path, case, policy):
    formula, reference = CASES[case]
    ops = build_ops(tmp_path, f"self_{case}_{policy}", {"op": _spec(formula, policy)})
    torch.manual_seed(0)
    x = (torch.rand(4, 4, dtype=torch.float64) * 0.09 + 0.01).requires_grad_()
    p = torch.randn(4, dtype=torch.float64)
    for given in (p, None):
        got, _ = ops.op(x, given)
        want = reference(x, {name: f(x) for name, f in REF_LETS.items()})
        torch.testing.assert_close(got, want.expand(got.shape))
        weights = torch.randn(got.shape, dtype=torch.float64)
        for mine, theirs in zip(_grads(got, x, weights), _grads(want.expand(got.shape), x, weights), strict=True):
            torch.testing.assert_close(mine, theirs)
