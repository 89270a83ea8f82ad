"""A condition several gradients share has its operands computed once in backward (Note [conditions
shared by gradients] in opgen/plan/conditions.py), and a sum SymPy multiplied a number into reads the
temporary it is a multiple of (Note [sums that are multiples of a temporary]), and a condition used
several times is computed once (Note [conditions computed once]): no aten call repeats on the same
tensors; values, gradients, second derivatives and forward-mode derivatives are plain autograd's of
the formula, in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import import_package
from torch.utils._python_dispatch import TorchDispatchMode

from opgen.cli import main

OPS = {
    # name: (inputs, formula, the same in PyTorch's ops)
    "hinge": ("x, y", "mean(relu(margin - x * y))", lambda x, y, m: F.relu(m - x * y).mean()),
    "ranking": (
        "x, y, t",
        "mean(max(0, -t * (x - y) + margin))",
        lambda x, y, t, m: torch.clamp_min(-t * (x - y) + m, 0).mean(),
    ),
    "squared": ("x, y", "max(0, margin - x * y)**2 / 2", lambda x, y, m: F.relu(m - x * y) ** 2 / 2),
    "clipped": (
        "x, y",
        "where(x * y < margin, x * y, margin)",
        lambda x, y, m: torch.where(x * y < m, x * y, torch.full_like(x, m)),
    ),
    "band": (
        "x, y, t",
        "where(abs(x - y) < t, (x - y)**2, t * abs(x - y))",
        lambda x, y, t, m: torch.where((x - y).abs() < t, (x - y) ** 2, t * (x - y).abs()),
    ),
    # The guard of the branch and the branch's own condition (Note [double where]): one comparison. A kink
    # both gradients share (Note [shared kinks]) whose product a temporary of CSE reads: the product was
    # defined after it (UnboundLocalError in backward).
    "guarded": (
        "x, y",
        "where(x > y, sqrt(x - y), 0)",
        lambda x, y, m: torch.where(x > y, torch.sqrt(torch.where(x > y, x - y, 1)), 0),
    ),
    # max's and min's ties compare the same pair both ways, in both gradients: two comparisons in all.
    "ties": (
        "x, y",
        "max(x, y)**2 - min(x, y) * margin",
        lambda x, y, m: torch.maximum(x, y) ** 2 - torch.minimum(x, y) * m,
    ),
}
# Left: the incoming gradient times a part two gradients share (squared) is computed for each; it is
# checked for its values only.
REPEAT_FREE = ["band", "clipped", "guarded", "hinge", "ranking"]


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared_conditions")
    specs = root / "specs"
    specs.mkdir()
    for name, (inputs, formula, _) in OPS.items():
        tensors = "".join(f"  {n}: Tensor\n" for n in inputs.split(", "))
        text = f"name: {name}\ninputs:\n{tensors}  margin: float = 0.5\noutputs:\n  out: {formula}\n"
        (specs / f"{name}.yaml").write_text(text, encoding="utf-8")
    assert main(["generate", str(specs), "-o", str(root / "cond_ops"), "--no-cache"]) == 0
    return import_package(root, "cond_ops")


class _Calls(TorchDispatchMode):
    """The aten calls that make a tensor of more than one element, each as its op and its arguments
    (tensors by identity)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[object, ...]]] = []
        self.keep: list[object] = []  # the results, alive, so no identity is reused

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        key = tuple(id(a) if isinstance(a, torch.Tensor) else repr(a) for a in args)
        if isinstance(out, torch.Tensor) and out.numel() > 1:
            self.calls.append((str(func), key))
        self.keep.append(out)
        return out


def _inputs(name: str, dtype: torch.dtype = torch.float64) -> list[torch.Tensor]:
    torch.manual_seed(0)
    count = len(OPS[name][0].split(", "))
    made = [torch.randn(6, 5, dtype=dtype) for _ in range(count)]
    if count == 3:
        made[2] = made[2].abs() + 0.5  # `band`'s width, and a target of either sign for `ranking`
    return [a.requires_grad_() for a in made]


def _repeats(calls: list[tuple[str, tuple[object, ...]]]) -> list[str]:
    """The calls made again on the same tensors; comparisons too (Note [conditions computed once])."""
    seen, repeated = set(), []
    for name, key in calls:
        if (name, key) in seen:
            repeated.append(name)
        seen.add((name, key))
    return repeated


@pytest.mark.parametrize("name", REPEAT_FREE)
def test_backward_computes_a_shared_condition_once(ops, name):
    args = _inputs(name)
    y = getattr(ops, name)(*args)
    g = torch.ones_like(y)
    with _Calls() as mode:
        torch.autograd.grad(y, args, g)
    assert _repeats(mode.calls) == []


def test_ties_compare_each_pair_once(ops):
    """`max(x, y)` and `min(x, y)` in both gradients: `x < y` and `y < x` once each (`x > y` is `y < x`);
    eight full-size comparisons before. (`2 * max(x, y)` is still computed for each gradient.)"""
    args = _inputs("ties")
    y = ops.ties(*args)
    with _Calls() as mode:
        torch.autograd.grad(y, args, torch.ones_like(y))
    assert sorted(name for name, _ in mode.calls if name.split(".")[1] in ("gt", "lt")) == ["aten.lt.Tensor"] * 2


@pytest.mark.parametrize("name", sorted(OPS))
def test_values_gradients_and_second_derivatives_are_plain_autograds(ops, name):
    op, plain = getattr(ops, name), OPS[name][2]
    args = _inputs(name)
    y, want = op(*args), plain(*args, 0.5)
    torch.testing.assert_close(y, want)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, args, g, create_graph=True)
    expected = torch.autograd.grad(want, args, g, create_graph=True)
    torch.testing.assert_close(got, expected)
    second = torch.autograd.grad(sum((a * a).sum() for a in got), args, allow_unused=True, materialize_grads=True)
    wanted = torch.autograd.grad(sum((b * b).sum() for b in expected), args, allow_unused=True, materialize_grads=True)
    torch.testing.assert_close(second, wanted)
    tangents = [torch.randn_like(a) for a in args]
    _, jvp = torch.func.jvp(lambda *a: op(*a), tuple(a.detach() for a in args), tuple(tangents))
    _, jvp_plain = torch.func.jvp(lambda *a: plain(*a, 0.5), tuple(a.detach() for a in args), tuple(tangents))
    torch.testing.assert_close(jvp, jvp_plain)
