"""Backward reads the tensor operations forward computes from residuals instead of recomputing them
(Note [saved tensor operations] in opgen.optimize.save_tensors): cross-entropy's backward reads the
saved log-softmax, never `input`, and still matches F.cross_entropy to second order."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, import_package
from spec_ops import build_ops


@pytest.fixture(scope="module")
def generated():
    return import_package(ROOT, "generated")


def _inputs(smoothing: float | None = None):
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 7, generator=generator, dtype=torch.float64) * 3).requires_grad_()
    p = torch.rand(5, 7, generator=generator, dtype=torch.float64)
    t = (p / p.sum(-1, keepdim=True)).requires_grad_()
    return x, t


OPS = {
    "cross_entropy": (lambda ops: ops.cross_entropy, lambda x, t: F.cross_entropy(x, t)),
    "label_smoothing_ce": (
        lambda ops: lambda x, t: ops.label_smoothing_ce(x, t, 0.2),
        lambda x, t: F.cross_entropy(x, t, label_smoothing=0.2),
    ),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_backward_reads_the_saved_log_softmax_not_the_input(generated, name, monkeypatch):
    op = OPS[name][0](generated)
    x, t = _inputs()
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda s: saved.append(s) or s, lambda s: s):
        loss = op(x, t)
    assert not any(s.data_ptr() == x.data_ptr() for s in saved), "the input is saved for backward"
    assert any(s.shape == x.shape and torch.equal(s, torch.log_softmax(x, -1).detach()) for s in saved)
    calls: list[str] = []
    for fn in ("log_softmax", "softmax", "logsumexp"):
        original = getattr(torch, fn)
        monkeypatch.setattr(torch, fn, lambda *a, _f=original, _n=fn, **k: calls.append(_n) or _f(*a, **k))
    gx, gt = torch.autograd.grad(loss, (x, t))
    assert calls == [], f"backward recomputes {calls}"
    monkeypatch.undo()
    wx, wt = torch.autograd.grad(OPS[name][1](x, t), (x, t))
    torch.testing.assert_close(gx, wx)
    torch.testing.assert_close(gt, wt)


@pytest.mark.parametrize("name", sorted(OPS))
def test_values_gradients_and_second_derivatives_match_f_cross_entropy(generated, name):
    op, native = OPS[name][0](generated), OPS[name][1]
    x, t = _inputs()
    torch.testing.assert_close(op(x, t), native(x, t))
    got = torch.autograd.grad(op(x, t), (x, t), create_graph=True)
    want = torch.autograd.grad(native(x, t), (x, t), create_graph=True)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    # Double backward differentiates through the saved log-softmax (a hidden output).
    second = torch.autograd.grad(sum((g * g.cos()).sum() for g in got), (x, t))
    expected = torch.autograd.grad(sum((w * w.cos()).sum() for w in want), (x, t))
    for g, w in zip(second, expected, strict=True):
        torch.testing.assert_close(g, w)
    assert torch.autograd.gradgradcheck(op, (x, t))
    hessian = torch.func.hessian(lambda x: op(x, t.detach()))(x.detach())
    torch.testing.assert_close(hessian, torch.func.hessian(lambda x: native(x, t.detach()))(x.detach()))


SPECS = {
    # a loss per row: the incoming gradient made zeros, where it is None, has the output's shape
    "rows_ce": """
        name: rows_ce
        inputs:
          x: Tensor[N, C]
          t: Tensor[N, C]
        outputs:
          loss: -sum(t * (x - logsumexp(x, dim=-1, keepdim=true)), dim=-1)
    """,
    # softmax read by backward: saved in place of x
    "soft_dot": """
        name: soft_dot
        inputs:
          x: Tensor[N, C]
          t: Tensor[N, C]
        outputs:
          loss: sum(t * exp(x - logsumexp(x, dim=-1, keepdim=true)), dim=-1)
    """,
}
PLAIN = {
    "rows_ce": lambda x, t: -(t * torch.log_softmax(x, -1)).sum(-1),
    "soft_dot": lambda x, t: (t * torch.softmax(x, -1)).sum(-1),
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory):
    return build_ops(tmp_path_factory.mktemp("saved_tensor_ops"), "saved_tensor_ops", SPECS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_specs_reading_saved_tensor_ops_match_plain_autograd_to_second_order(ops, name):
    op, plain = getattr(ops, name), PLAIN[name]
    x, t = _inputs()
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda s: saved.append(s) or s, lambda s: s):
        out = op(x, t)
    assert not any(s.data_ptr() == x.data_ptr() for s in saved), "the input is saved for backward"
    torch.testing.assert_close(out, plain(x, t))
    weights = torch.linspace(-1, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
    got = torch.autograd.grad((op(x, t) * weights).sum(), (x, t), create_graph=True)
    want = torch.autograd.grad((plain(x, t) * weights).sum(), (x, t), create_graph=True)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    second = torch.autograd.grad(sum(g.sin().sum() for g in got), (x, t))
    expected = torch.autograd.grad(sum(w.sin().sum() for w in want), (x, t))
    for g, w in zip(second, expected, strict=True):
        torch.testing.assert_close(g, w)
    assert torch.autograd.gradgradcheck(op, (x, t))
    tangent = torch.ones_like(x)
    _, jvp = torch.func.jvp(lambda x: op(x, t.detach()), (x.detach(),), (tangent,))
    _, jvp_plain = torch.func.jvp(lambda x: plain(x, t.detach()), (x.detach(),), (tangent,))
    torch.testing.assert_close(jvp, jvp_plain)
    batched = torch.func.vmap(op)(x.detach()[None].repeat(2, 1, 1), t.detach()[None].repeat(2, 1, 1))
    torch.testing.assert_close(batched[0], plain(x, t).detach())


def _assert_two_orders(op, plain, x: torch.Tensor, weights: torch.Tensor) -> None:
    """The op's gradient of a weighted sum, and the gradient of that gradient, equal plain autograd's."""
    (got,) = torch.autograd.grad((op(x) * weights).sum(), x, create_graph=True)
    (want,) = torch.autograd.grad((plain(x) * weights).sum(), x, create_graph=True)
    torch.testing.assert_close(got, want)
    (second,) = torch.autograd.grad(got.sin().sum(), x)
    (expected,) = torch.autograd.grad(want.sin().sum(), x)
    torch.testing.assert_close(second, expected)


VAR_AND_MIN = """
    name: var_and_min
    inputs:
      x: Tensor[N, C]
    outputs:
      y: 1 / sqrt(var(x, dim=-1, keepdim=true) + 1) - amin(x, dim=-1, keepdim=true)
"""


def test_a_term_through_several_residuals_survives_a_none_gradient(tmp_path):
    """Two residuals (the saved var and amax); in double backward amax's, read only by a comparison,
    gets None while var's gets a gradient: the term through both must still count var's part."""
    op = build_ops(tmp_path, "several_residuals", {"var_and_min": VAR_AND_MIN}).var_and_min
    source = (tmp_path / "several_residuals" / "ops" / "var_and_min.py").read_text()
    assert "grad_saved_var" in source and "grad_saved_amax" in source  # both are residuals

    def plain(x: torch.Tensor) -> torch.Tensor:
        return 1 / torch.sqrt(x.var(-1, keepdim=True) + 1) - x.amin(-1, keepdim=True)

    x, _ = _inputs()
    _assert_two_orders(op, plain, x, torch.linspace(-1, 2, 5, dtype=x.dtype).reshape(5, 1))
    hessian = torch.func.hessian(lambda x: op(x).sum())(x.detach())
    torch.testing.assert_close(hessian, torch.func.hessian(lambda x: plain(x).sum())(x.detach()))
    assert torch.autograd.gradgradcheck(op, (x,))


SHARED_THROUGH_RESIDUAL = """
    name: shared_residual
    inputs:
      x: Tensor[N, K]
    let:
      u: 3.0 * tanh(x @ x.T)
    outputs:
      o: u - log(sum(exp(u), dim=1, keepdim=true))
    optimize: {rewrite: false}
"""


def test_a_part_shared_through_a_residual_runs_only_where_its_gradient_is_not_none(tmp_path):
    """The saved sum's incoming gradient appears twice in the term through it (`g @ x + g.T @ x`);
    CSE named the shared part `tmp = grad_saved_sum * ...` before the `is not None` guard, and the
    first backward, where that gradient is None, multiplied None."""
    op = build_ops(tmp_path, "shared_residual", {"shared_residual": SHARED_THROUGH_RESIDUAL}).shared_residual

    def plain(x: torch.Tensor) -> torch.Tensor:
        u = 3.0 * torch.tanh(x @ x.T)
        return u - torch.log(torch.exp(u).sum(1, keepdim=True))

    x = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(3, 4).requires_grad_()
    _assert_two_orders(op, plain, x, torch.linspace(-1, 2, 9, dtype=x.dtype).reshape(3, 3))
    assert torch.autograd.gradgradcheck(op, (x,))
