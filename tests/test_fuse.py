"""Fused mode (opgen/emit/fuse.py): compiled forward and first-order backward, same results."""

from __future__ import annotations

import re

import torch
from conftest import generate_op, import_package

SWISH = "name: swish\ninputs:\n  x: Tensor\n  beta: float = 1.0\noutputs:\n  y: x / (1 + exp(-beta * x))\n"


def test_fuse_key_compiles_forward_and_gradients(tmp_path):
    source = generate_op(tmp_path, SWISH.replace("name: swish", "name: op") + "optimize:\n  fuse: true\n")
    assert "@torch.compile\ndef _op_forward(x: torch.Tensor, beta: float) -> torch.Tensor:" in source
    assert (
        "@torch.compile\ndef _op_gradients(x: torch.Tensor, beta: float, grad_y: torch.Tensor) -> tuple[torch.Tensor]:"
        in source
    )
    assert "if first_order_only(grad_y):" in source  # not in double backward, not vmapped (Note [fused backward])
    assert "first_order_only" in source.split("\n\n\n")[0]  # imported from the package's runtime
    assert "@torch.compile" not in generate_op(tmp_path, SWISH.replace("name: swish", "name: op"))


def test_fused_op_matches_the_plain_one_at_every_order(tmp_path, run_cli):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "swish.yaml").write_text(SWISH)
    for flag, package in (([], "plain_ops"), (["--fuse"], "fused_ops")):
        assert run_cli("generate", str(specs), "-o", str(tmp_path / package), *flag)[0] == 0
    plain = import_package(tmp_path, "plain_ops").swish
    fused = import_package(tmp_path, "fused_ops").swish
    x = torch.linspace(-6, 6, 25, dtype=torch.float64, requires_grad=True)
    for op in (plain, fused):
        (first,) = torch.autograd.grad(op(x, 1.5).sum(), x)  # fused: the compiled gradients
        (again,) = torch.autograd.grad(op(x, 1.5).sum(), x, create_graph=True)  # the differentiable ones
        (second,) = torch.autograd.grad(again.sum(), x)
        torch.testing.assert_close(first, again.detach())
        if op is plain:
            expected = (op(x, 1.5).detach(), first, second)
        else:
            torch.testing.assert_close((op(x, 1.5).detach(), first, second), expected)


def test_the_optimizer_page_warns_that_the_first_fused_call_compiles():
    """A fused op's first call compiles for tens of seconds (24 s for mish on the 2-core machine);
    the page that documents --fuse says so, with the figure and what to do about it."""
    from conftest import ROOT

    page = (ROOT / "docs" / "optimizer.md").read_text(encoding="utf-8")
    section = page.split("## Fused mode", 1)[1].split("\n## ", 1)[0]
    assert "**The first call compiles.**" in section
    assert re.search(r"about \d+ s for `mish`", section) and "warm it up" in section


def test_fused_gradients_keep_a_shared_negated_pair(tmp_path):
    """`grad_x = t` and `grad_mu = -t` share `t`, which already holds the incoming gradient: the
    compiled gradients once dropped it and returned 0 (then failed on `0 .sum_to_size`)."""
    spec = "name: op\ninputs: {x: Tensor, mu: Tensor, k: Tensor}\noutputs: {y: k * (1 - cos(x - mu))}\n"
    source = generate_op(tmp_path, spec + "optimize:\n  fuse: true\n")
    helper = source.split("def _op_gradients")[1].split("\n\n\n")[0]
    assert "grad_x = 0" not in helper and "grad_mu = 0" not in helper, helper


def test_fused_code_is_formatted_and_typed(tmp_path, run_cli):
    """The compiled helpers are laid out as the rest of the module (mish's gradient was one
    ~430-character line), import only what the module uses, and pass `mypy --strict`."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from conftest import ROOT

    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "swish.yaml").write_text(SWISH)
    (specs / "mish.yaml").write_text("name: mish\ninputs:\n  x: Tensor\noutputs:\n  y: x * tanh(log(1 + exp(x)))\n")
    assert run_cli("generate", str(specs), "-o", str(tmp_path / "fused_ops"), "--fuse")[0] == 0
    source = (tmp_path / "fused_ops" / "ops" / "mish.py").read_text()
    assert "def _mish_gradients(x: torch.Tensor, grad_y: torch.Tensor) -> tuple[torch.Tensor]:" in source
    config = ("--config", str(ROOT / "pyproject.toml"))
    for ruff in (("check", "--no-cache"), ("format", "--check")):
        ran = subprocess.run(
            [sys.executable, "-m", "ruff", *ruff, *config, "fused_ops"], cwd=tmp_path, capture_output=True, text=True
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr
    mypy = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--cache-dir",
        str(Path(tempfile.gettempdir()) / "opgen-mypy-cache"),
        "fused_ops",
    ]
    ran = subprocess.run(mypy, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout
