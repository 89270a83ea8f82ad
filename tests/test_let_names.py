"""A temporary of backward or jvp that holds exactly a `let:` of the spec is named after it: the user's
names survive in the generated code, also where they equal a name the module uses for something else."""

from __future__ import annotations

import re

import torch
from conftest import GENERATED
from spec_ops import build_ops


def _method(source: str, name: str) -> str:
    return source.split(f"    def {name}(")[1].split("    @staticmethod")[0]


def test_the_specs_let_names_survive_in_backward_and_jvp():
    huber = (GENERATED / "ops" / "huber.py").read_text(encoding="utf-8")
    assert "diff = input - target" in _method(huber, "jvp")
    focal = (GENERATED / "ops" / "focal_loss.py").read_text(encoding="utf-8")
    for method in ("backward", "jvp"):
        body = _method(focal, method)
        assert re.search(r"^\s+p = torch\.sigmoid\(logits\)$", body, re.M), body
        assert re.search(r"^\s+ce = ", body, re.M), body


# Lets named like what the module names itself: the ctx, a temporary, jvp's step, the gradient of an input.
CLASHING = """
name: clash
inputs:
  x: Tensor
  w: Tensor
let:
  ctx: sigmoid(x * w)
  tmp0: x - w
  step: exp(-(x - w)**2)
  grad_x: tanh(x)
outputs:
  y: ctx * tmp0 + step * grad_x
"""


def test_lets_named_like_the_modules_own_names_keep_values_and_gradients(tmp_path):
    ops = build_ops(tmp_path, "clash_lets", {"clash": CLASHING})
    source = (tmp_path / "clash_lets" / "ops" / "clash.py").read_text(encoding="utf-8")
    assert "ctx = torch.sigmoid(" in _method(source, "backward")  # the let's name, beside the `ctx_` argument
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)

    def plain(x, w):
        return torch.sigmoid(x * w) * (x - w) + torch.exp(-((x - w) ** 2)) * torch.tanh(x)

    torch.testing.assert_close(ops.clash(x, w), plain(x, w))
    got = torch.autograd.grad(ops.clash(x, w).sum(), (x, w), create_graph=True)
    want = torch.autograd.grad(plain(x, w).sum(), (x, w), create_graph=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(
        torch.autograd.grad(sum(g.sum() for g in got), (x, w)), torch.autograd.grad(sum(g.sum() for g in want), (x, w))
    )
    tangents = (torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64))
    primals = (x.detach(), w.detach())
    torch.testing.assert_close(torch.func.jvp(ops.clash, primals, tangents), torch.func.jvp(plain, primals, tangents))
