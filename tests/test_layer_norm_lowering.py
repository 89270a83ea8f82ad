"""Layer norm written as a formula is lowered to PyTorch's kernels (opgen.optimize.norms), and only
an exact layer norm is: values and gradients against F.layer_norm, a near miss against autograd."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from opgen.cli import main

BODIES = {
    "lets": "let:\n  mu: mean(x, dim=-1, keepdim=true)\n  v: var(x, dim=-1, keepdim=true, correction=0)\n"
    "outputs:\n  y: (x - mu) * rsqrt(v + eps) * weight + bias\n",
    "hand_variance": "outputs:\n  y: (x - mean(x, dim=-1, keepdim=true))"
    " / sqrt(mean((x - mean(x, dim=-1, keepdim=true))**2, dim=-1, keepdim=true) + eps) * weight + bias\n",
}
NEAR_MISS = (
    "outputs:\n  y: (x - mean(x, dim=-1, keepdim=true)) * rsqrt(var(x, dim=-1, keepdim=true) + eps) * weight + bias\n"
)


def _op(tmp_path: Path, name: str, body: str):
    spec = f"name: {name}\ninputs:\n  x: Tensor[..., D]\n  weight: Tensor[D]\n  bias: Tensor[D]?\n  eps: float = 1e-5\n"
    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "specs" / f"{name}.yaml").write_text(spec + body)
    out = tmp_path / f"out_{name}"
    assert main(["generate", str(tmp_path / "specs" / f"{name}.yaml"), "-o", str(out), "--no-cache"]) == 0
    source = (out / "ops" / f"{name}.py").read_text()
    package = f"lnpkg_{name}"
    spec_obj = importlib.util.spec_from_file_location(
        package, out / "__init__.py", submodule_search_locations=[str(out)]
    )
    module = importlib.util.module_from_spec(spec_obj)
    sys.modules[package] = module
    spec_obj.loader.exec_module(module)
    return getattr(importlib.import_module(f"{package}.ops.{name}"), name), source


@pytest.mark.parametrize("how", sorted(BODIES))
def test_layer_norm_lowered_matches_native(tmp_path: Path, how: str) -> None:
    op, source = _op(tmp_path, f"ln_{how}", BODIES[how])
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
    op, source = _op(tmp_path, "ln_near", NEAR_MISS)  # correction=1: not a layer norm
    assert "layer_norm" not in source.split("class", 1)[1].split("def jvp", 1)[0]
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    w, b = (torch.randn(6, dtype=torch.float64, requires_grad=True) for _ in range(2))
    want = (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True) + 1e-5) * w + b
    y = op(x, w, b)
    torch.testing.assert_close(y, want)
    g = torch.randn_like(y)
    torch.testing.assert_close(torch.autograd.grad(y, (x, w, b), g), torch.autograd.grad(want, (x, w, b), g))
