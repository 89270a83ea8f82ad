"""Layer norm and RMS norm written in unusual ways: lowered where they are exactly the kernel's or
the saved-rstd form (opgen.optimize.norms), right everywhere, against PyTorch's own ops in float64."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from opgen.cli import main

RMS = {
    "rsqrt": "x * rsqrt(mean(x**2, dim=-1, keepdim=true) + eps)",
    "sqrt": "x / sqrt(mean(x**2, dim=-1, keepdim=true) + eps)",
    "let": "x * r",
}


def _op(tmp_path: Path, name: str, inputs: str, body: str):
    spec = f"name: {name}\ninputs:\n{inputs}{body}"
    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "specs" / f"{name}.yaml").write_text(spec)
    out = tmp_path / f"out_{name}"
    assert main(["generate", str(tmp_path / "specs" / f"{name}.yaml"), "-o", str(out), "--no-cache"]) == 0
    source = (out / "ops" / f"{name}.py").read_text()
    package = f"normpkg_{name}"
    spec_obj = importlib.util.spec_from_file_location(
        package, out / "__init__.py", submodule_search_locations=[str(out)]
    )
    module = importlib.util.module_from_spec(spec_obj)
    sys.modules[package] = module
    spec_obj.loader.exec_module(module)
    return getattr(importlib.import_module(f"{package}.ops.{name}"), name), source


def _backward(source: str) -> str:
    return source.split("def backward", 1)[1].split("def jvp", 1)[0]


def _agree(op, want, inputs: tuple[torch.Tensor, ...]) -> None:
    """Values and gradients as `want`'s, double backward by gradgradcheck, forward mode as want's."""
    y, expected = op(*inputs), want(*inputs)
    torch.testing.assert_close(y, expected)
    g = torch.randn_like(y)
    tensors = tuple(t for t in inputs if t is not None)
    torch.testing.assert_close(torch.autograd.grad(y, tensors, g), torch.autograd.grad(expected, tensors, g))
    assert torch.autograd.gradgradcheck(lambda *a: op(*a), tensors)  # type: ignore[arg-type]
    tangents = tuple(torch.randn_like(t) for t in tensors)
    torch.testing.assert_close(torch.func.jvp(op, tensors, tangents)[1], torch.func.jvp(want, tensors, tangents)[1])


@pytest.mark.parametrize("weight", [True, False])
@pytest.mark.parametrize("how", sorted(RMS))
def test_rms_norm_reads_its_saved_rstd(tmp_path: Path, how: str, weight: bool) -> None:
    lets = "let:\n  r: rsqrt(mean(x**2, dim=-1, keepdim=true) + eps)\n" if how == "let" else ""
    inputs = "  x: Tensor[..., D]\n" + ("  weight: Tensor[D]\n" if weight else "") + "  eps: float = 1e-6\n"
    body = f"{lets}outputs:\n  y: {RMS[how]}{' * weight' if weight else ''}\n"
    op, source = _op(tmp_path, f"rms_{how}_{int(weight)}", inputs, body)
    assert "saved_rstd" in _backward(source) and ".mean(" not in _backward(source).split("grad_x = ")[1]
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    if weight:
        _agree(lambda x, w: op(x, w, 0.25), lambda x, w: F.rms_norm(x, (5,), w, 0.25), (x, w))
    else:
        _agree(lambda x: op(x, 0.25), lambda x: F.rms_norm(x, (5,), None, 0.25), (x,))


def test_rms_norm_with_a_number_eps(tmp_path: Path) -> None:
    body = "outputs:\n  y: x * rsqrt(mean(x**2, dim=-1, keepdim=true) + 0.01)\n"
    op, source = _op(tmp_path, "rms_number", "  x: Tensor[..., D]\n", body)
    assert "saved_rstd" in _backward(source)
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    _agree(op, lambda x: F.rms_norm(x, (6,), None, 0.01), (x,))


def test_root_mean_square_of_a_middle_dim_is_right(tmp_path: Path) -> None:
    """Over dim 1 of three, and with the statistic used twice: general, and right."""
    root = "rsqrt(mean(x**2, dim=1, keepdim=true) + eps)"
    body = f"outputs:\n  y: x * {root} + {root}\n"
    op, _ = _op(tmp_path, "rms_middle", "  x: Tensor[A, B, C]\n  eps: float = 0.5\n", body)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)

    def want(x: torch.Tensor) -> torch.Tensor:
        r = torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 0.5)
        return x * r + r

    _agree(op, want, (x,))


def test_rms_norm_less_its_eps_is_right(tmp_path: Path) -> None:
    """`- eps`: the base may be negative or 0; only its half-integer powers are read from the root (NaN
    or inf where the formula's are), so values and gradients stay the formula's."""
    body = "outputs:\n  y: x * rsqrt(mean(x**2, dim=-1, keepdim=true) - eps) + mean(x**2, dim=-1, keepdim=true) - eps\n"
    op, _ = _op(tmp_path, "rms_less", "  x: Tensor[..., D]\n  eps: float = 1e-6\n", body)
    x = torch.tensor([[1.0, -1.0], [3.0, 2.0], [0.5, 0.5]], dtype=torch.float64, requires_grad=True)

    def want(x: torch.Tensor, eps: float) -> torch.Tensor:
        m = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(m - eps) + m - eps

    for eps in (1.0, 0.25, 10.0):  # the base 0 in a row, positive, negative
        y, expected = op(x, eps), want(x, eps)
        torch.testing.assert_close(y, expected, equal_nan=True)
        g = torch.autograd.grad(y.sum(), x)[0]
        torch.testing.assert_close(g, torch.autograd.grad(expected.sum(), x)[0], equal_nan=True)


NEAR = {
    "x * rsqrt(mean(x**2, dim=-1, keepdim=true))": lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)),
    "x * (mean(x**2, dim=-1, keepdim=true) + 1)**(-1.5)": lambda x: x * (x.pow(2).mean(-1, keepdim=True) + 1) ** -1.5,
    "x * rsqrt(sum(x**2, dim=-1, keepdim=true) + 1)": lambda x: x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1),
}


@pytest.mark.parametrize("body", sorted(NEAR))
def test_rms_norm_near_misses_stay_formulas(tmp_path: Path, body: str) -> None:
    name = f"rms_near{sorted(NEAR).index(body)}"
    op, source = _op(tmp_path, name, "  x: Tensor[..., D]\n", f"outputs:\n  y: {body}\n")
    assert "saved_rstd" not in source
    x = (torch.rand(3, 4, dtype=torch.float64) + 1).requires_grad_()
    y, expected = op(x), NEAR[body](x)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(torch.autograd.grad(y.sum(), x)[0], torch.autograd.grad(expected.sum(), x)[0])


LN_ONE = "  x: Tensor[..., D]\n  weight: Tensor[D]\n  bias: Tensor[D]?\n  eps: float = 1e-5\n"
BODIES = {
    "lets": "let:\n  mu: mean(x, dim=-1, keepdim=true)\n  v: var(x, dim=-1, keepdim=true, correction=0)\n"
    "outputs:\n  y: (x - mu) * rsqrt(v + eps) * weight + bias\n",
    "hand_variance": "outputs:\n  y: (x - mean(x, dim=-1, keepdim=true))"
    " / sqrt(mean((x - mean(x, dim=-1, keepdim=true))**2, dim=-1, keepdim=true) + eps) * weight + bias\n",
}
NEAR_MISS = (
    "outputs:\n  y: (x - mean(x, dim=-1, keepdim=true)) * rsqrt(var(x, dim=-1, keepdim=true) + eps) * weight + bias\n"
)


LN_INPUTS = "  x: Tensor[..., H, D]\n  weight: Tensor[H, D]\n  bias: Tensor[H, D]?\n  eps: float = 1e-5\n"


def test_layer_norm_over_the_last_two_dims(tmp_path: Path) -> None:
    body = (
        "outputs:\n  y: (x - mean(x, dim=(-2, -1), keepdim=true))"
        " * rsqrt(var(x, dim=(-2, -1), keepdim=true, correction=0) + eps) * weight + bias\n"
    )
    op, source = _op(tmp_path, "ln_two", LN_INPUTS, body)
    assert "native_layer_norm_backward" in source
    torch.manual_seed(1)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    w, b = (torch.randn(3, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    _agree(lambda x, w, b: op(x, w, b, 0.2), lambda x, w, b: F.layer_norm(x, (3, 4), w, b, 0.2), (x, w, b))


def test_layer_norm_inside_a_let_then_used(tmp_path: Path) -> None:
    body = (
        "let:\n  ln: (x - mean(x, dim=-1, keepdim=true)) * rsqrt(var(x, dim=-1, keepdim=true, correction=0) + eps)"
        " * weight\noutputs:\n  y: max(ln, 0) + 2 * ln\n"
    )
    op, _ = _op(tmp_path, "ln_let", "  x: Tensor[..., D]\n  weight: Tensor[D]\n  eps: float = 1e-5\n", body)
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)

    def want(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ln = F.layer_norm(x, (5,), w, None, 0.3)
        return torch.relu(ln) + 2 * ln

    _agree(lambda x, w: op(x, w, 0.3), want, (x, w))


class _Calls(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the aten ops a call runs, by name (`mean`, `native_layer_norm`, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _forward_calls(op, *inputs: torch.Tensor) -> dict[str, int]:
    with torch.no_grad(), _Calls() as calls:
        op(*inputs)
    return calls.counts


def test_a_norm_inside_lets_or_outputs_is_computed_once_in_forward(tmp_path: Path) -> None:
    """Forward computes each statistic once: a let holding the rstd is what it saves, and a layer norm
    used inside the outputs (twice, and under a reduction) comes from the call that gives its
    statistics. Values, gradients, double backward and forward mode as the same formula of PyTorch's ops."""
    rms_body = "let:\n  r: rsqrt(mean(x**2, dim=-1, keepdim=true) + 1e-6)\n  n: x * r\noutputs:\n  y: n * g\n"
    rms, _ = _op(tmp_path, "rms_lets", "  x: Tensor[..., D]\n  g: Tensor[D]\n", rms_body)
    ln_body = (
        "let:\n  ln: (x - mean(x, dim=-1, keepdim=true)) * rsqrt(var(x, dim=-1, keepdim=true, correction=0)"
        " + eps) * weight\noutputs:\n  y: max(ln, 0) + 2 * ln\n  s: sum(ln * ln, dim=-1)\n"
    )
    ln, _ = _op(tmp_path, "ln_twice", "  x: Tensor[..., D]\n  weight: Tensor[D]\n  eps: float = 1e-5\n", ln_body)
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert _forward_calls(rms, x, w).get("mean") == 1
    assert _forward_calls(lambda x, w: ln(x, w, 0.3), x, w).get("native_layer_norm") == 1

    def want_ln(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        normed = F.layer_norm(x, (5,), w, None, 0.3)
        return torch.relu(normed) + 2 * normed, (normed * normed).sum(-1)

    _agree(lambda x, w: rms(x, w), lambda x, w: F.rms_norm(x, (5,), w, 1e-6), (x, w))
    got, want = ln(x, w, 0.3), want_ln(x, w)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    _agree(lambda x, w: ln(x, w, 0.3)[0], lambda x, w: want_ln(x, w)[0], (x, w))
    _agree(lambda x, w: ln(x, w, 0.3)[1], lambda x, w: want_ln(x, w)[1], (x, w))


@pytest.mark.parametrize("dim", [0, 1])
def test_normalizing_over_a_leading_or_middle_dim_stays_general(tmp_path: Path, dim: int) -> None:
    norm = f"(x - mean(x, dim={dim}, keepdim=true)) * rsqrt(var(x, dim={dim}, keepdim=true, correction=0) + eps)"
    op, source = _op(
        tmp_path, f"ln_dim{dim}", "  x: Tensor[A, B, C]\n  eps: float = 1e-5\n", f"outputs:\n  y: {norm}\n"
    )
    assert "layer_norm" not in _backward(source)
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)

    def want(x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim, keepdim=True)
        return (x - mean) * torch.rsqrt(x.var(dim, keepdim=True, correction=0) + 1e-5)

    _agree(op, want, (x,))


@pytest.mark.parametrize("how", sorted(BODIES))
def test_layer_norm_lowered_matches_native(tmp_path: Path, how: str) -> None:
    op, source = _op(tmp_path, f"ln_{how}", LN_ONE, BODIES[how])
    assert "native_layer_norm_backward" in source
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    w, b = (torch.randn(5, dtype=torch.float64, requires_grad=True) for _ in range(2))
    for bias in (b, None):
        y = op(x, w, bias, 0.3)
        want = F.layer_norm(x, (5,), w, bias, 0.3)
        torch.testing.assert_close(y, want)
        inputs = (x, w) if bias is None else (x, w, b)
        g = torch.randn_like(y)
        torch.testing.assert_close(torch.autograd.grad(y, inputs, g), torch.autograd.grad(want, inputs, g))
        assert torch.autograd.gradgradcheck(lambda *a: op(a[0], a[1], a[2] if len(a) > 2 else None, 0.3), inputs)


def test_near_miss_stays_on_the_general_path(tmp_path: Path) -> None:
    op, source = _op(tmp_path, "ln_near", LN_ONE, NEAR_MISS)  # correction=1: not a layer norm
    assert "layer_norm" not in source.split("class", 1)[1].split("def jvp", 1)[0]
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    w, b = (torch.randn(6, dtype=torch.float64, requires_grad=True) for _ in range(2))
    want = (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True) + 1e-5) * w + b
    y = op(x, w, b)
    torch.testing.assert_close(y, want)
    g = torch.randn_like(y)
    torch.testing.assert_close(torch.autograd.grad(y, (x, w, b), g), torch.autograd.grad(want, (x, w, b), g))
