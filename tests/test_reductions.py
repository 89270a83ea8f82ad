"""Stable rewrites over reductions (Note [stable rewrites over reductions] in opgen/optimize/reductions.py).

Specs written the textbook way -- `exp(x) / sum(exp(x))`, `log(sum(exp(x)))`, a cross-entropy
through them -- become PyTorch's stable ops: the same values and gradients as plain torch
autograd of the formula as written (float64, moderate logits), as torch.softmax /
torch.logsumexp / F.cross_entropy in float32 at logits of ±1000 and ±1e4, where the formula as
written gives inf or NaN, and double backward (gradgradcheck) still works.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import import_package

from opgen.cli import main

# name -> (formula, lets, the same formula in plain torch, PyTorch's stable op)
LSE = torch.logsumexp
LN2 = math.log(2)


def _amax(x, keepdim=False):
    return x.amax(-1, keepdim=keepdim)


def _naive_sum_exp(x, keepdim=False):
    return torch.exp(x).sum(-1, keepdim=keepdim)


OPS = {
    "softmax_textbook": (
        "exp(x) / sum(exp(x), dim=-1, keepdim=true)",
        "",
        lambda x: torch.exp(x) / _naive_sum_exp(x, True),
        lambda x: torch.softmax(x, -1),
    ),
    "softmax_let": (
        "e / sum(e, dim=-1, keepdim=true)",
        "  e: exp(x)\n",
        lambda x: torch.exp(x) / _naive_sum_exp(x, True),
        lambda x: torch.softmax(x, -1),
    ),
    "softmax_shifted": (
        "exp(x - m) / sum(exp(x - m), dim=-1, keepdim=true)",
        "  m: amax(x, dim=-1, keepdim=true)\n",
        lambda x: torch.exp(x - _amax(x, True)) / torch.exp(x - _amax(x, True)).sum(-1, keepdim=True),
        lambda x: torch.softmax(x, -1),
    ),
    "softmax_scaled": (
        "exp(x / 2) / sum(exp(x / 2), dim=-1, keepdim=true)",
        "",
        lambda x: torch.exp(x / 2) / _naive_sum_exp(x / 2, True),
        lambda x: torch.softmax(x / 2, -1),
    ),
    "lse_textbook": ("log(sum(exp(x), dim=-1))", "", lambda x: torch.log(_naive_sum_exp(x)), lambda x: LSE(x, -1)),
    "lse_keepdim": (
        "log(sum(exp(x), dim=-1, keepdim=true))",
        "",
        lambda x: torch.log(_naive_sum_exp(x, True)),
        lambda x: LSE(x, -1, keepdim=True),
    ),
    "lse_factor": (
        "log(sum(3 * exp(x), dim=-1) / 5)",
        "",
        lambda x: torch.log((3 * torch.exp(x)).sum(-1) / 5),
        lambda x: LSE(x, -1) + torch.log(torch.tensor(0.6, dtype=x.dtype)),
    ),
    "lse_max_by_hand": (
        "m + log(sum(exp(x - m), dim=-1, keepdim=true))",
        "  m: amax(x, dim=-1, keepdim=true)\n",
        lambda x: _amax(x, True) + torch.log(torch.exp(x - _amax(x, True)).sum(-1, keepdim=True)),
        lambda x: LSE(x, -1, keepdim=True),
    ),
    "lse_max_inline": (
        "amax(x, dim=-1) + log(sum(exp(x - amax(x, dim=-1, keepdim=true)), dim=-1))",
        "",
        lambda x: _amax(x) + torch.log(torch.exp(x - _amax(x, True)).sum(-1)),
        lambda x: LSE(x, -1),
    ),
    "log_softmax_of_softmax": (
        "log(exp(x) / sum(exp(x), dim=-1, keepdim=true))",
        "",
        lambda x: torch.log(torch.exp(x) / _naive_sum_exp(x, True)),
        lambda x: torch.log_softmax(x, -1),
    ),
    "log_softmax_minus_lse": (
        "x - log(sum(exp(x), dim=-1, keepdim=true))",
        "",
        lambda x: x - torch.log(_naive_sum_exp(x, True)),
        lambda x: torch.log_softmax(x, -1),
    ),
    "lse_base_two": (
        "log2(sum(2**x, dim=-1))",
        "",
        lambda x: torch.log2(torch.exp2(x).sum(-1)),
        lambda x: LSE(x * LN2, -1) / LN2,  # torch.logaddexp2 over a dim
    ),
    "softmax_base_two": (
        "2**x / sum(2**x, dim=-1, keepdim=true)",
        "",
        lambda x: torch.exp2(x) / torch.exp2(x).sum(-1, keepdim=True),
        lambda x: torch.softmax(x * LN2, -1),
    ),
}

# A cross-entropy with probability targets through log-sum-exp, and one through the softmax.
CROSS_ENTROPY = {
    "ce_lse": "sum(t * (log(sum(exp(x), dim=-1, keepdim=true)) - x), dim=-1)",
    "ce_log_softmax": "-sum(t * log(exp(x) / sum(exp(x), dim=-1, keepdim=true)), dim=-1)",
    "ce_let": "sum(t * (lse - x), dim=-1)",
}
CE_LETS = {"ce_let": "let:\n  lse: log(sum(exp(x), dim=-1, keepdim=true))\n"}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reductions")
    specs = folder / "specs"
    specs.mkdir()
    for name, (formula, lets, _, _) in OPS.items():
        let = f"let:\n{lets}" if lets else ""
        (specs / f"{name}.yaml").write_text(
            f"name: {name}\ninputs:\n  x: Tensor[..., N]\n{let}outputs:\n  y: {formula}\n"
        )
    for name, formula in CROSS_ENTROPY.items():
        text = f"name: {name}\ninputs:\n  x: Tensor[..., N]\n  t: Tensor[..., N]\n{CE_LETS.get(name, '')}"
        (specs / f"{name}.yaml").write_text(text + f"outputs:\n  y: {formula}\n")
    assert main(["generate", str(specs), "-o", str(folder / "reduction_ops")]) == 0
    return import_package(folder, "reduction_ops")


def _value_and_grad(f, x, g):
    x = x.detach().requires_grad_()
    y = f(x)
    (grad,) = torch.autograd.grad(y, x, g)
    return y.detach(), grad


@pytest.mark.parametrize("name", OPS)
def test_the_op_is_the_formula_as_written_in_float64(ops, name):
    torch.manual_seed(0)
    x = torch.randn(3, 5, dtype=torch.float64) * 3
    op, naive = getattr(ops, name), OPS[name][2]
    g = torch.randn_like(naive(x))
    for got, want in zip(_value_and_grad(op, x, g), _value_and_grad(naive, x, g), strict=True):
        torch.testing.assert_close(got, want)
    x.requires_grad_()
    assert torch.autograd.gradgradcheck(op, (x,))


@pytest.mark.parametrize("scale", [1.0, 1000.0, 1e4])
@pytest.mark.parametrize("name", OPS)
def test_the_op_is_pytorchs_stable_op_in_float32_at_large_logits(ops, name, scale):
    torch.manual_seed(1)
    x = torch.randn(4, 7) * scale
    x[0, 0], x[1] = scale, -scale  # a row with one dominant logit, a row of ties
    op, native = getattr(ops, name), OPS[name][3]
    g = torch.randn_like(native(x))
    got, want = _value_and_grad(op, x, g), _value_and_grad(native, x, g)
    assert all(torch.isfinite(t).all() for t in got), got
    for a, b in zip(got, want, strict=True):
        _close32(a, b)


def test_the_formulas_as_written_are_not_finite_there():
    """What the rewrites are for: the textbook formulas overflow at logits of 1000."""
    x = torch.tensor([[1000.0, 0.0, -1000.0]], requires_grad=True)
    for name in ("softmax_textbook", "lse_textbook", "log_softmax_minus_lse", "lse_base_two", "softmax_base_two"):
        y = OPS[name][2](x)
        (grad,) = torch.autograd.grad(y.sum(), x)
        assert not (torch.isfinite(y).all() and torch.isfinite(grad).all()), name


def _close32(got, want):
    """float32 agreement: a few units in the last place of the largest value (logsumexp of 1e4 is ~1e4)."""
    torch.testing.assert_close(got, want, atol=1e-6 * max(1.0, want.abs().max().item()), rtol=1e-5)


def _cross_entropy_native(x, t):
    return F.cross_entropy(x, t, reduction="none")


@pytest.mark.parametrize("scale", [1.0, 1000.0, 1e4])
@pytest.mark.parametrize("name", CROSS_ENTROPY)
def test_cross_entropy_with_probability_targets_is_f_cross_entropy(ops, name, scale):
    torch.manual_seed(2)
    x = torch.randn(6, 5) * scale
    t = torch.softmax(torch.randn(6, 5), -1)
    t[0] = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0])  # a hard target, where p = 0 elsewhere
    x[0, 2] = -scale
    op = getattr(ops, name)
    g = torch.randn(6)
    xs, ts = x.requires_grad_(), t.requires_grad_()
    got = torch.autograd.grad(op(xs, ts), (xs, ts), g)
    want = torch.autograd.grad(_cross_entropy_native(xs, ts), (xs, ts), g)
    _close32(op(x, t), _cross_entropy_native(x, t))
    for a, b in zip(got, want, strict=True):
        assert torch.isfinite(a).all()
        _close32(a, b)
    x64, t64 = x.detach().double().div(scale).requires_grad_(), t.detach().double().requires_grad_()
    assert torch.autograd.gradgradcheck(op, (x64, t64))


def test_rewritten_forms_print_pytorchs_ops(ops):
    import inspect

    def source(name: str) -> str:
        return inspect.getsource(getattr(ops, name.title().replace("_", "") + "Function"))

    assert "torch.softmax(x, -1)" in source("softmax_textbook")
    assert "torch.softmax(x, -1)" in source("softmax_let") and "torch.exp" not in source("softmax_let")
    assert "amax" not in source("softmax_shifted") and "amax" not in source("lse_max_by_hand")
    assert "logsumexp(-1)" in source("lse_textbook") and "torch.exp(x)" not in source("lse_textbook")
    assert "torch.log_softmax(x, -1)" in source("log_softmax_minus_lse")
    assert "logsumexp(-1)" in source("lse_base_two") and "2 ** (x)" not in source("lse_base_two")
    assert "torch.softmax(" in source("softmax_base_two") and "2 ** (x)" not in source("softmax_base_two")
    assert "_log_softmax_backward_data" in source("ce_lse")


@pytest.mark.parametrize("scale", [1.0, 1000.0, 1e4])
def test_library_softmax_naive_is_torch_softmax_at_large_logits(scale):
    """specs/softmax_naive.yaml, as committed in generated/: written the textbook way."""
    from conftest import GENERATED

    op = import_package(GENERATED.parent, "generated").softmax_naive
    torch.manual_seed(3)
    x = torch.randn(2, 3, 6) * scale
    g = torch.randn_like(x)
    for a, b in zip(_value_and_grad(op, x, g), _value_and_grad(lambda v: torch.softmax(v, -1), x, g), strict=True):
        assert torch.isfinite(a).all()
        _close32(a, b)
