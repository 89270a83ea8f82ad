"""Gradients of several inputs share their common product with the incoming gradient, sign included
(Note [gradients that share a product] in opgen/plan/backward.py): counted with the work benchmark's
counter against plain autograd of the same formula, and checked against it in float64 for every
subset of inputs that require a gradient (gradcheck, gradgradcheck)."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import generate_specs

from benchmarks import work

OPS = {
    # name: (Tensor inputs, formula, plain torch, backward passes: 10 and 14 before, plain autograd's 8 and
    # 9, which saves twice the bytes: its partial products)
    "neg_scaled_product": (2, "-(alpha * a * b * exp(a))", lambda a, b, alpha: -(alpha * a * b * torch.exp(a)), 7),
    "three_products": (3, "a * b * c * exp(a + b)", lambda a, b, c, alpha: a * b * c * torch.exp(a + b), 12),
}
NAMES = "abc"


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    texts = {}
    for name, (count, formula, _, _) in OPS.items():
        inputs = "".join(f"  {n}: Tensor\n" for n in NAMES[:count]) + "  alpha: float = 0.5\n"
        texts[name] = f"name: {name}\ninputs:\n{inputs}outputs:\n  y: {formula}\n"
    return generate_specs(tmp_path_factory.mktemp("shared_products"), texts, "product_ops")


def _args(count: int, needs: tuple[bool, ...], n: int, dtype: torch.dtype) -> list[object]:
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(n, generator=generator, dtype=dtype).requires_grad_(r) for r in needs]
    return [*tensors, 0.5]


@pytest.mark.parametrize("name", sorted(OPS))
def test_the_common_product_is_computed_once(ops, name):
    count, _, plain, passes = OPS[name]
    args = _args(count, (True,) * count, 40000, torch.float32)
    counted = work.count_work(getattr(ops, name), args)
    assert counted.passes == passes, counted.names  # one product with the incoming gradient, no negation
    naive = work.count_work(plain, args)
    assert counted.saved < naive.saved and (counted.passes < naive.passes or name == "three_products")
    assert "neg" not in counted.names


@pytest.mark.parametrize("name", sorted(OPS))
def test_gradients_of_every_subset_are_plain_autograds(ops, name):
    count, _, plain, _ = OPS[name]
    op = getattr(ops, name)
    for needs in itertools.product((True, False), repeat=count):
        if not any(needs):
            continue
        args = _args(count, needs, 30, torch.float64)
        leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        y, want = op(*args), plain(*args)
        g = torch.randn_like(want)
        torch.testing.assert_close(torch.autograd.grad(y, leaves, g), torch.autograd.grad(want, leaves, g))

        def call(*ls, args=args):
            it = iter(ls)
            return op(*[next(it) if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args])

        assert torch.autograd.gradcheck(call, leaves)
        assert torch.autograd.gradgradcheck(call, leaves)
