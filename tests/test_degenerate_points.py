"""Ops at degenerate points of their formulas: a std of equal entries (or of one entry), a norm of zeros, a gradient
that SymPy proves zero through a whole reduction. Each op equals plain torch autograd of the same
formula there: value, gradient, second derivative and forward mode (torch.func.jvp), wherever plain
autograd is finite."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from spec_ops import build_ops

Reference = Callable[[torch.Tensor], torch.Tensor]

# name -> (formula over x: Tensor, the same in plain torch)
OPS: dict[str, tuple[str, Reference]] = {
    "exp_std": ("exp(std(x, correction=0))", lambda x: torch.exp(torch.std(x, correction=0))),
    "std_cubed": ("std(x, correction=0) ** 3", lambda x: torch.std(x, correction=0) ** 3),
    "std_rows": ("sin(std(x, dim=-1, keepdim=true)) * x", lambda x: torch.sin(torch.std(x, dim=-1, keepdim=True)) * x),
    "std_plus": ("std(x) + sum(x)", lambda x: torch.std(x) + torch.sum(x)),
    # relu masks every entry below 0, where the norm is 0: its second derivative was 0 / 0.
    "norm_relu": ("norm(relu(x))", lambda x: torch.linalg.vector_norm(torch.relu(x))),
    "norm_rows": (
        "norm(relu(x), dim=-1) * sum(x, dim=-1)",
        lambda x: torch.linalg.vector_norm(torch.relu(x), dim=-1) * x.sum(-1),
    ),
    # min(...) is the number 0.5 (erf + 2 > 0.5): the gradient simplifies to 0; backward printed `(0).sum_to_size`.
    "zero_through_std": (
        "min(erf(exp(std(x, correction=0) ** 3)) + 2, 0.5)",
        lambda x: torch.minimum(torch.erf(torch.exp(torch.std(x, correction=0) ** 3)) + 2, torch.tensor(0.5)),
    ),
}
POINTS = {
    "equal": lambda: torch.full((2, 3), 0.5, dtype=torch.float64),
    "negative": lambda: torch.full((2, 3), -0.5, dtype=torch.float64),
    "one": lambda: torch.full((1,), 0.5, dtype=torch.float64),
    "scalar": lambda: torch.tensor(0.5, dtype=torch.float64),
    "random": lambda: torch.rand((2, 3), generator=torch.Generator().manual_seed(0), dtype=torch.float64),
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("degenerate")
    specs = {
        name: f"name: {name}\ninputs:\n  x: {'Tensor[..., D]' if 'dim=' in text else 'Tensor'}\noutputs:\n  y: {text}\n"
        for name, (text, _) in OPS.items()
    }
    return build_ops(folder, "degenerate_ops", specs)


def _derivatives(f: Reference, x0: torch.Tensor) -> list[torch.Tensor]:
    x = x0.clone().requires_grad_()
    y = f(x)
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True, allow_unused=True, materialize_grads=True)
    v = torch.linspace(-1, 1, x.numel(), dtype=torch.float64).reshape(x.shape)
    hvp = 0 * x
    if g.requires_grad:
        hvp = torch.autograd.grad((g * v).sum(), x, allow_unused=True, materialize_grads=True)[0]
    _, tangent = torch.func.jvp(f, (x0,), (v,))
    return [y.detach(), g.detach(), hvp, tangent]


# Every op at every point, but the row reductions at a 0-dim point (a row needs a dimension).
CASES = [
    (name, point)
    for name in sorted(OPS)
    for point in sorted(POINTS)
    if not (name in ("std_rows", "norm_rows") and POINTS[point]().dim() == 0)
]


@pytest.mark.parametrize(("name", "point"), CASES)
def test_degenerate_points_agree_with_autograd(ops, name: str, point: str) -> None:
    x0 = POINTS[point]()
    got, want = _derivatives(getattr(ops, name), x0), _derivatives(OPS[name][1], x0)
    for what, g, w in zip(("value", "gradient", "second derivative", "jvp"), got, want, strict=True):
        w = w.to(g.dtype).expand_as(g)
        known = torch.isfinite(w)  # torch.std's second derivative at 0 is NaN; the op's is finite there
        torch.testing.assert_close(g[known], w[known], msg=lambda m, what=what: f"{name} {what}: {m}")


# Gradients SymPy proves zero only once CSE rebuilds them (`n > n` kept unevaluated by the reader for the
# output's shape): a backward kernel or matrix product of that zero printed `_log_softmax_backward_data(0, ...)`
# or `tmp0 = 0` then `tmp0 @ x`, and backward crashed.
VANISHING = {
    "kernel": "where(n > n, log_softmax(x @ x.T, dim=1), 1 - n) + x @ x.T",
    "softmax": "where(n > n, softmax(x @ x.T, dim=0), 0) + x @ x.T",
}


@pytest.mark.parametrize("name", sorted(VANISHING))
def test_gradients_that_vanish_once_rebuilt(tmp_path, name: str) -> None:
    spec = f"name: {name}\ninputs:\n  x: Tensor[K, M]\n  n: int = 1\noutputs:\n  y: {VANISHING[name]}\n"
    op = getattr(build_ops(tmp_path, f"vanishing_{name}", {name: spec}), name)
    x = torch.rand((3, 4), generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(op(x, 1), x @ x.T)  # n > n is false, and 1 - n is 0
    assert torch.autograd.gradcheck(lambda x: op(x, 1), (x,))
    assert torch.autograd.gradgradcheck(lambda x: op(x, 1), (x,))


def test_a_reduction_of_a_decided_condition_keeps_its_count(tmp_path) -> None:
    """`x != x` is kept unevaluated for the shape of `where(x != x, 0.5, 0.25)`; the CSE of forward mode
    decided it and printed `(0.25).sum(-1)`, which raised (Note [comparisons CSE would decide])."""
    formula = "sum(where(v != v, 0.5, 0.25)) * sum(exp(w.T @ w), dim=-2)"
    spec = f"name: decided\ninputs:\n  v: Tensor[K]\n  w: Tensor[K, M]\noutputs:\n  y: {formula}\n"
    op = build_ops(tmp_path, "decided_ops", {"decided": spec}).decided
    generator = torch.Generator().manual_seed(2)
    v, w, t = (torch.rand(shape, generator=generator, dtype=torch.float64) for shape in ((3,), (3, 4), (3, 4)))

    def plain(v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.where(v != v, 0.5, 0.25).sum() * torch.exp(w.T @ w).sum(-2)

    got = torch.func.jvp(lambda w: op(v, w), (w,), (t,))
    want = torch.func.jvp(lambda w: plain(v, w), (w,), (t,))
    torch.testing.assert_close(got, want)
    assert torch.autograd.gradgradcheck(lambda w: op(v, w), (w.requires_grad_(),))


def test_a_clamp_of_a_smaller_tensor_between_tensor_bounds(tmp_path) -> None:
    """torch.clamp's own backward fails where x is smaller than its tensor bounds ('output with shape [3]
    doesn't match the broadcast shape [2, 3]'): the op's forward, and its backward that autograd
    differentiates again, clamp the three broadcast together."""
    spec = "name: clamped\ninputs:\n  x: Tensor\n  t: Tensor\noutputs:\n  y: clamp(x, 0.001, 0.001 + abs(t)) ** 2\n"
    op = build_ops(tmp_path, "clamped_ops", {"clamped": spec}).clamped
    generator = torch.Generator().manual_seed(3)
    x, t = (torch.randn(shape, generator=generator, dtype=torch.float64) for shape in ((3,), (2, 3)))
    x.requires_grad_()
    t.requires_grad_()
    want = torch.clamp(*torch.broadcast_tensors(x, torch.tensor(0.001, dtype=torch.float64), 0.001 + t.abs())) ** 2
    torch.testing.assert_close(op(x, t), want)
    assert torch.autograd.gradcheck(op, (x, t))
    assert torch.autograd.gradgradcheck(op, (x, t))


def test_abs_of_a_value_sympy_cannot_prove_real_keeps_inner_abs(tmp_path) -> None:
    """SymPy differentiates `abs(u)` of a `u` it cannot prove real (`lgamma`, `log`) through real and
    imaginary parts and rewrote an `abs(y)` inside `u` as `y / sign(y)`: NaN at y = 0 (Note [real kinks])."""
    formula = "abs(log(x + abs(y))) + abs(lgamma(x + abs(y)))"
    spec = f"name: inner\ninputs:\n  x: Tensor\n  y: Tensor\noutputs:\n  z: {formula}\n"
    op = build_ops(tmp_path, "inner_ops", {"inner": spec}).inner
    x = torch.tensor([0.5, 1.5, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0.0, 0.0, 0.5, -0.5], dtype=torch.float64, requires_grad=True)

    def plain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.log(x + y.abs()).abs() + torch.lgamma(x + y.abs()).abs()

    got = torch.autograd.grad(op(x, y).sum(), (x, y))
    want = torch.autograd.grad(plain(x, y).sum(), (x, y))
    torch.testing.assert_close(got, want)


def test_backward_does_not_read_a_non_differentiable_output_for_its_formula(tmp_path) -> None:
    """`o2` uses `o1: {differentiable: false}`; backward read the saved `o1` in place of `sum(x, dim=1)`,
    a constant to double backward (marked non-differentiable): the second derivative missed its terms."""
    spec = (
        "name: reads\ninputs:\n  x: Tensor[K, M]\noutputs:\n"
        "  o1: {formula: 'sum(x, dim=1)', differentiable: false}\n  o2: log_softmax(o1 * o1, dim=-1)\n"
    )
    op = build_ops(tmp_path, "reads_ops", {"reads": spec}).reads
    x = torch.rand(3, 4, generator=torch.Generator().manual_seed(4), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x: op(x)[1], (x,))


def test_a_formula_sympy_prints_inside_itself_reads(tmp_path) -> None:
    """An assumption query made SymPy print the formula, and its printer took the op's `Transpose` for its
    matrix transpose: 'internal error: Transpose object has no attribute arg'."""
    inner = "x.T @ x @ x.T + -10 * n - atan2(exp(x.T) / sum(exp(x.T), dim=-2, keepdim=true), 1.25 + expit(n) ** 2)"
    formula = f"27.0 * tanh({inner}) - log(sum(exp(27.0 * tanh({inner})), dim=1, keepdim=true))"
    spec = f"name: printed\ninputs:\n  x: Tensor[K, M]\n  n: int = 1\noutputs:\n  y: {formula}\n"
    op = build_ops(tmp_path, "printed_ops", {"printed": spec + "optimize: {rewrite: false}\n"}).printed
    x = torch.rand(3, 4, generator=torch.Generator().manual_seed(6), dtype=torch.float64, requires_grad=True)
    sig = 1 / (1 + math.exp(-1))
    u = 27.0 * torch.tanh(x.T @ x @ x.T - 10 - torch.atan2(torch.softmax(x.T, dim=-2), torch.tensor(1.25 + sig**2)))
    torch.testing.assert_close(op(x, 1), torch.log_softmax(u, dim=1))
