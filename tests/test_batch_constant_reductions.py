"""A reduction over every dimension of a term that is constant along the batch dimensions `...` as
simplified (`where(x > 9, 1, 1) * w` is `w`, a `Tensor[D]`, but has the shape [..., D] of `x` as written)
counts every entry as torch does: the batch's entries times the term's (Note [reductions of constant
dimensions] in opgen/formula/written.py). It was refused: "a reduction over every dimension of a term
constant along the batch dimensions `...`"."""

from __future__ import annotations

import pytest
import torch
from spec_ops import build_ops

KINDS = {
    "sum": lambda t: t.sum(),
    "mean": lambda t: t.mean(),
    "amax": lambda t: t.amax(),
    "var": lambda t: t.var(),
    "std": lambda t: t.std(),
    "norm": lambda t: torch.linalg.vector_norm(t),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_whole_reduction_of_a_term_constant_along_the_batch(tmp_path, kind):
    spec = f"""
        name: op
        inputs:
          x: Tensor[..., N, D]
          w: Tensor[D]
          s: Tensor[]
        outputs:
          y: x * {kind}(where(x > 9, 1, 1) * w)
          z: {kind}(where(x > 9, 1, 1) * s) + x
    """
    ops = build_ops(tmp_path, "batch_constant", {"op": spec})
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    s = torch.tensor(-0.7, dtype=torch.float64, requires_grad=True)  # negative: the norm of one entry is its size
    reduce = KINDS[kind]
    ones = torch.ones_like(x)
    want = (x * reduce(ones * w), reduce(ones * s) + x)
    got = ops.op(x, w, s)
    for g, v in zip(got, want, strict=True):
        torch.testing.assert_close(g, v)
    seeds = [torch.randn_like(v) for v in want]
    grads = [torch.autograd.grad(outs, (x, w, s), seeds, materialize_grads=True) for outs in (got, want)]
    if kind == "std":  # of equal entries: 0, as torch.std's documented gradient (its own is rounding noise)
        assert grads[0][2] == 0
        grads = [g[:2] for g in grads]
    for g, v in zip(*grads, strict=True):
        torch.testing.assert_close(g, v)
    # Another batch size: the count is taken at call time.
    x2 = torch.randn(7, 4, 5, dtype=torch.float64)
    torch.testing.assert_close(ops.op(x2, w, s)[0], x2 * reduce(torch.ones_like(x2) * w))


@pytest.mark.parametrize("kind", sorted(set(KINDS) - {"norm"}))
def test_a_whole_reduction_of_a_term_with_a_batch_and_a_narrowed_dimension(tmp_path, kind):
    """`where(x > 9, 1, 1) * mean(x, dim=-1, keepdim=true)` is [..., 1] simplified, [..., D] as written."""
    spec = f"""
        name: op
        inputs:
          x: Tensor[..., D]
          z: Tensor[..., N, K]
          y: Tensor[..., K, M]
        let:
          l: sum(z)
        outputs:
          u: {kind}(where(x > 9, 1, 1) * mean(x, dim=-1, keepdim=true)) + x
          v: {kind}(where(l < l, z, l) @ y) + z
    """
    ops = build_ops(tmp_path, "batch_narrowed", {"op": spec})
    x = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    z = torch.randn(2, 1, 3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(5, 4, 2, dtype=torch.float64, requires_grad=True)  # its batch broadcasts with z's
    reduce = KINDS[kind]
    ones, s = torch.ones_like(x), z.sum()
    want = (reduce(ones * x.mean(-1, keepdim=True)) + x, reduce(torch.where(s < s, z, s) @ y) + z)
    got = ops.op(x, z, y)
    for g, v in zip(got, want, strict=True):
        torch.testing.assert_close(g, v)
    seeds = [torch.randn_like(v) for v in want]
    grads = [torch.autograd.grad(outs, (x, z, y), seeds) for outs in (got, want)]
    for g, v in zip(*grads, strict=True):
        torch.testing.assert_close(g, v)


def test_the_norm_of_such_a_term_is_refused_with_a_way_out(tmp_path):
    spec = """
        name: op
        inputs:
          x: Tensor[..., D]
        outputs:
          y: norm(where(x > 9, 1, 1) * mean(x, dim=-1, keepdim=true)) + x
    """
    with pytest.raises(AssertionError, match=r"op.yaml:6:\d+: .*\[\.\.\., 1\], \[\.\.\., D\] as written: reduce"):
        build_ops(tmp_path, "batch_narrowed_norm", {"op": spec})
