"""Gradients at the exact kink points follow PyTorch's own ops (Note [kink conventions])."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from spec_ops import build_ops

SPECS = {
    "k_abs": "abs(x)",
    "k_relu": "max(x, 0)",
    "k_relu_flipped": "max(0, x)",
    "k_clamp": "clamp(x, -1, 1)",
    "k_hardtanh": "max(min(x, 1), -1)",
    "k_relu6": "min(max(x, 0), 6)",
    "k_leaky": "where(x > 0, x, 0.1 * x)",
    "k_sign": "sign(x)",
    "k_round": "round(x)",
    "k_floor": "floor(x)",
}
TWO = {
    "k_maximum": "max(a, b)",
    "k_minimum": "min(a, b)",
    "k_clamp_tensors": "clamp(x, a, b)",
}
NATIVE = {
    "k_abs": torch.abs,
    "k_relu": torch.relu,
    "k_relu_flipped": torch.relu,
    "k_clamp": lambda x: torch.clamp(x, -1, 1),
    "k_hardtanh": F.hardtanh,
    "k_relu6": F.relu6,
    "k_leaky": lambda x: F.leaky_relu(x, 0.1),
    "k_sign": torch.sign,
    "k_round": torch.round,
    "k_floor": torch.floor,
}
KINKS = [-6.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.5, 6.0, 7.0]


def spec_text(name, formula, inputs):
    lines = [f"name: {name}", "inputs:"] + [f"  {i}: Tensor" for i in inputs] + ["outputs:", f"  y: {formula}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    specs = {name: spec_text(name, f, ["x"]) for name, f in SPECS.items()}
    specs["k_maximum"] = spec_text("k_maximum", TWO["k_maximum"], ["a", "b"])
    specs["k_minimum"] = spec_text("k_minimum", TWO["k_minimum"], ["a", "b"])
    specs["k_clamp_tensors"] = spec_text("k_clamp_tensors", TWO["k_clamp_tensors"], ["x", "a", "b"])
    return build_ops(tmp_path_factory.mktemp("kinks"), "kink_ops", specs)


def grads(f, *values):
    tensors = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in values]
    out = f(*tensors)
    return out.detach(), torch.autograd.grad(out.sum(), tensors, allow_unused=True, materialize_grads=True)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_one_input_kinks_match_pytorch(ops, name):
    got_value, (got,) = grads(getattr(ops, name), KINKS)
    want_value, (want,) = grads(NATIVE[name], KINKS)
    torch.testing.assert_close(got_value, want_value)
    torch.testing.assert_close(got, want, msg=lambda m: f"{SPECS[name]} at {KINKS}: {m}")


def test_the_conventions_differ_where_pytorch_differs(ops):
    """clamp passes the gradient at its bounds, hardtanh and relu do not (as in PyTorch)."""
    _, (clamp,) = grads(ops.k_clamp, [-1.0, 1.0])
    _, (hardtanh,) = grads(ops.k_hardtanh, [-1.0, 1.0])
    _, (relu,) = grads(ops.k_relu, [0.0])
    assert clamp.tolist() == [1.0, 1.0] and hardtanh.tolist() == [0.0, 0.0] and relu.tolist() == [0.0]


@pytest.mark.parametrize(("name", "native"), [("k_maximum", torch.maximum), ("k_minimum", torch.minimum)])
def test_ties_split_the_gradient_like_pytorch(ops, name, native):
    a = [0.0, 1.0, -2.0, 3.0]
    b = [0.0, 1.0, 1.0, -3.0]
    got_value, got = grads(getattr(ops, name), a, b)
    want_value, want = grads(native, a, b)
    torch.testing.assert_close(got_value, want_value)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert got[0][:2].tolist() == [0.5, 0.5]  # the tie: half to each side


def test_clamp_with_tensor_bounds_matches_pytorch_at_the_bounds(ops):
    x = [-1.0, 1.0, 0.0, -2.0, 2.0]
    lo = [-1.0, -1.0, -1.0, -1.0, -1.0]
    hi = [1.0, 1.0, 1.0, 1.0, 1.0]
    got_value, got = grads(ops.k_clamp_tensors, x, lo, hi)
    want_value, want = grads(torch.clamp, x, lo, hi)
    torch.testing.assert_close(got_value, want_value)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
