"""A negated product negates its smallest factor, not the product (Note [negating the smallest factor]
in opgen/emit/printer.py): `-(alpha * grad)` was a product and a negation, two passes over the
tensor; a gradient that is another's negated branch by branch is written as its negation (Note
[gradients that negate another] in opgen/plan/backward.py); counted with the work benchmark's
counter, and checked against plain autograd of the same formula in float64 (gradcheck, gradgradcheck)."""

from __future__ import annotations

import pytest
import torch
from conftest import generate_specs

from benchmarks import work

OPS = {
    # name: (inputs, formula, plain torch, Tensor input shapes)
    "neg_scaled": ("x: Tensor\n  alpha: float = 0.5", "-(alpha * x)", lambda x, a: -(a * x), [(64, 300)]),
    "neg_mean_product": (
        "input: Tensor[N, C]\n  target: Tensor[N, C]",
        "-sum(target * input) / N",
        lambda i, t: -(t * i).sum() / i.shape[0],
        [(64, 300), (64, 300)],
    ),
    "neg_rowwise": (
        "x: Tensor[N, C]\n  w: Tensor[N, C]",
        "-sum(w * x, dim=-1)",
        lambda x, w: -(w * x).sum(-1),
        [(64, 300), (64, 300)],
    ),
    "neg_branches": (
        "x: Tensor\n  t: Tensor",
        "where(x - t > 0, 2 * (x - t), -(x - t) / 2)",
        lambda x, t: torch.where(x - t > 0, 2 * (x - t), -(x - t) / 2),
        [(64, 300), (64, 300)],
    ),
}


PASSES = {"neg_scaled": 1, "neg_mean_product": 2, "neg_rowwise": 2, "neg_branches": 5}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    texts = {
        name: f"name: {name}\ninputs:\n  {inputs}\noutputs:\n  y: {formula}\n"
        for name, (inputs, formula, _, _) in OPS.items()
    }
    return generate_specs(tmp_path_factory.mktemp("negated"), texts, "neg_ops")


def _args(name: str, dtype: torch.dtype) -> list[object]:
    generator = torch.Generator().manual_seed(0)
    shapes = OPS[name][3]
    tensors = [torch.randn(s, generator=generator, dtype=dtype).requires_grad_() for s in shapes]
    return [*tensors, 0.5] if name == "neg_scaled" else tensors


@pytest.mark.parametrize("name", sorted(OPS))
def test_one_pass_per_gradient_and_no_negation_of_a_full_tensor(ops, name):
    op = getattr(ops, name)
    args = _args(name, torch.float32)
    counted = work.count_work(getattr(ops.ops, name).__dict__[_function(name)].apply, args)
    # one multiplication sweeping the data per gradient; negations only of numbers or one-element tensors;
    # the branches: the condition (sub, gt), one select and product for both gradients, and a negation
    assert counted.passes == PASSES[name], counted.names
    assert counted.names.count("where") <= 1
    assert work.count_work(op, args).passes == counted.passes


def _function(name: str) -> str:
    return "".join(part.title() for part in name.split("_")) + "Function"


@pytest.mark.parametrize("name", sorted(OPS))
def test_gradients_are_plain_autograds(ops, name):
    op, plain = getattr(ops, name), OPS[name][2]
    args = _args(name, torch.float64)
    small = [a[:3, :4].detach().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    inputs = [a for a in small if isinstance(a, torch.Tensor)]
    y, want = op(*small), plain(*small)
    torch.testing.assert_close(y, want)
    g = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(y, inputs, g), torch.autograd.grad(want, inputs, g))
    rest = small[len(inputs) :]
    assert torch.autograd.gradcheck(lambda *ts: op(*ts, *rest), inputs)
    assert torch.autograd.gradgradcheck(lambda *ts: op(*ts, *rest), inputs)
