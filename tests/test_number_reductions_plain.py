"""A reduction over plain Tensors (`Tensor`, no declared dimensions) whose operand SymPy
simplifies to a number (`norm(0 * x)`) is that number's reduction whatever the count, where the
count does not matter (Note [reductions of a number] in opgen/formula/written.py): the mean
and the maximum are the number, the sum, the norm and the population variance of zeros are 0.
They were refused as "a reduction takes a tensor" (the operand as written is one), or as "over
entries counted only at call time"; the ones that need the count still are."""

from __future__ import annotations

import pytest
import torch
from spec_ops import build_ops

from opgen.emit.render import Renderer
from opgen.pipeline import build

PLAIN = {
    "norm(0 * x1) + x0": lambda x0, x1: torch.linalg.vector_norm(0 * x1) + x0,
    "sum(0 * x1) * x0": lambda x0, x1: torch.sum(0 * x1) * x0,
    "mean(3 + 0 * x1) * x0": lambda x0, x1: torch.mean(3 + 0 * x1) * x0,
    "x0 + amax(0 * x1 + 2)": lambda x0, x1: x0 + torch.amax(0 * x1 + 2),
    "norm(x0 - x0) * x1 + x0": lambda x0, x1: torch.linalg.vector_norm(x0 - x0) * x1 + x0,
}


@pytest.mark.parametrize("formula", sorted(PLAIN))
def test_a_reduction_of_a_number_over_plain_tensors(tmp_path, formula):
    spec = f"name: op\ninputs:\n  x0: Tensor\n  x1: Tensor\noutputs:\n  o: {formula}\n"
    ops = build_ops(tmp_path, "number_reduction", {"op": spec})
    x0 = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    x1 = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    got, want = ops.op(x0, x1), PLAIN[formula](x0, x1)
    torch.testing.assert_close(got, want)
    seed = torch.rand_like(want)
    grads = torch.autograd.grad((got * seed).sum(), (x0, x1), allow_unused=True)
    wants = torch.autograd.grad((want * seed).sum(), (x0, x1), allow_unused=True)
    for g, w in zip(grads, wants, strict=True):
        torch.testing.assert_close(g if g is not None else torch.zeros_like(x0), w)


@pytest.mark.parametrize("formula", ["sum(1 + 0 * x1) + x0", "var(0 * x1) + x0"])
def test_a_reduction_that_needs_the_count_is_still_refused(tmp_path, formula):
    spec = tmp_path / "op.yaml"
    spec.write_text(f"name: op\ninputs:\n  x0: Tensor\n  x1: Tensor\noutputs:\n  o: {formula}\n")
    result = build([str(spec)], Renderer())
    assert "over entries counted only at call time" in "\n".join(result.problems.report())
