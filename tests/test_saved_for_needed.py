"""A tensor only some gradients read is saved only when one of them is needed (Note [saved for the
gradients that read it] in opgen/plan/backward.py): counted in bytes with `saved_tensors_hooks`, and
the gradients of every combination of inputs that require one checked against plain autograd of the
same formula in float64, first and second order."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import ROOT, generate_specs, import_package

from benchmarks import work

OPS = {
    # name: (inputs, formula, the same in plain torch)
    "product": ("x: Tensor\n  w: Tensor", "x * w", lambda x, w: x * w),
    "weighted": ("x: Tensor\n  w: Tensor", "w * exp(x)", lambda x, w: w * torch.exp(x)),
    "three": (
        "a: Tensor\n  b: Tensor\n  c: Tensor",
        "a * b + sin(c) * b",
        lambda a, b, c: a * b + torch.sin(c) * b,
    ),
    "kl": (
        "input: Tensor[N, C]\n  target: Tensor[N, C]",
        "sum(xlogy(target, target) - target * input) / N",
        lambda i, t: (torch.xlogy(t, t) - t * i).sum() / i.shape[0],
    ),
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    texts = {
        name: f"name: {name}\ninputs:\n  {inputs}\noutputs:\n  y: {formula}\n"
        for name, (inputs, formula, _) in OPS.items()
    }
    return generate_specs(tmp_path_factory.mktemp("saved_for"), texts, "saved_ops")


def _saved_bytes(call, args) -> int:
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        call(*args)
    return sum(storages.values())


def _inputs(name: str, needs: tuple[bool, ...], rows: int = 6) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    count = len(needs)
    values = [torch.rand(rows, 5, generator=generator, dtype=torch.float64) + 0.1 for _ in range(count)]
    if name == "kl":
        values[1] = values[1] / values[1].sum(-1, keepdim=True)
    return [v.requires_grad_(n) for v, n in zip(values, needs, strict=True)]


@pytest.mark.parametrize("name", sorted(OPS))
def test_gradients_of_every_subset_of_inputs_are_plain_autograds(ops, name):
    op, plain = getattr(ops, name), OPS[name][2]
    arity = OPS[name][0].count("Tensor")
    checked = 0
    for needs in itertools.product((True, False), repeat=arity):
        if not any(needs):
            continue
        args = _inputs(name, needs)
        leaves = [a for a in args if a.requires_grad]
        y, want = op(*args), plain(*args)
        torch.testing.assert_close(y, want)
        g = torch.randn_like(want)
        got = torch.autograd.grad(y, leaves, g, create_graph=True)
        expected = torch.autograd.grad(want, leaves, g, create_graph=True)
        torch.testing.assert_close(got, expected)
        total, reference = sum((a * a).sum() for a in got), sum((b * b).sum() for b in expected)
        assert total.requires_grad == reference.requires_grad
        if reference.requires_grad:  # else the gradients are constant in the inputs that need one
            second = torch.autograd.grad(total, leaves, allow_unused=True, materialize_grads=True)
            again = torch.autograd.grad(reference, leaves, allow_unused=True, materialize_grads=True)
            torch.testing.assert_close(second, again)
        assert torch.autograd.gradcheck(lambda *ls, args=args: op(*_fill(args, ls)), leaves)
        checked += 1
    assert checked == 2**arity - 1


def _fill(args, leaves):
    it = iter(leaves)
    return [next(it) if a.requires_grad else a for a in args]


@pytest.mark.parametrize(
    ("name", "needs", "kept"),
    [
        ("product", (True, False), 1),  # w alone: x is read by w's gradient only
        ("product", (False, True), 1),
        ("product", (True, True), 2),
        ("weighted", (True, False), 1),  # grad_x = g * y: the output alone
        ("weighted", (False, True), 1),  # grad_w = g * exp(x): x alone
        ("three", (False, False, True), 2),  # b and c, not a
        ("three", (True, False, False), 1),  # b alone
        ("kl", (True, False), 1),  # target alone, as F.kl_div's input gradient needs
        ("kl", (False, True), 2),
    ],
)
def test_a_tensor_no_needed_gradient_reads_is_not_saved(ops, name, needs, kept):
    args = _inputs(name, needs, rows=4000)  # through the Function, not PyTorch's ops (Note [small calls])
    size = args[0].untyped_storage().nbytes()
    assert _saved_bytes(getattr(ops, name), args) == kept * size


@pytest.mark.parametrize("name", ["linear", "affine", "kl_div"])
def test_the_committed_ops_save_no_more_than_plain_autograd_for_the_first_input_alone(name):
    """`benchmarks.work --first-only`: a weight or a target that needs no gradient; `linear` kept its
    input beside its weight (10.6 times plain autograd's bytes), `affine` 25 times."""
    import_package(ROOT, "generated")
    counted = work.measure(name, scale=4, first_only=True)
    assert counted["generated"].saved <= counted["naive"].saved
