"""A statement's part used twice is computed once (Note [shared parts of a statement] in
opgen/plan/blocks.py): forward makes no more full-size tensors than the same formula written
in PyTorch with each repeated part computed once, and its values, gradients and second derivatives
are plain autograd's of the formula, in float64."""

from __future__ import annotations

import ast
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import GENERATED, import_package
from full_size import FullSize

from opgen.cli import main


def _log_cosh_parts(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """opgen's stable form of log(cosh(x - t)), its absolute value computed once."""
    a = torch.abs(x - t)
    small = torch.log1p(2 * torch.sinh(0.5 * (x - t)) ** 2)
    return torch.where(a < 1, small, a + F.softplus(-2 * a) - math.log(2))


def _gate_parts(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    h = x @ w.T
    return h * torch.sigmoid(h) * (x @ v.T)


OPS = {
    # name: (spec text, plain autograd of the formula, the formula with each repeated part once, tensor shapes)
    "log_cosh_diff": (
        "inputs:\n  input: Tensor\n  target: Tensor\noutputs:\n  loss: log(cosh(input - target))\n",
        lambda x, t: torch.log(torch.cosh(x - t)),
        _log_cosh_parts,
        [(6, 5), (6, 5)],
    ),
    "gate": (
        "inputs:\n  x: Tensor[..., D]\n  W: Tensor[H, D]\n  V: Tensor[H, D]\n"
        "outputs:\n  y: silu(x @ W.T) * (x @ V.T)\n",
        lambda x, w, v: F.silu(x @ w.T) * (x @ v.T),
        _gate_parts,
        [(6, 4), (5, 4), (5, 4)],
    ),
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared_parts")
    specs = root / "specs"
    specs.mkdir()
    for name, spec in OPS.items():
        (specs / f"{name}.yaml").write_text(f"name: {name}\n{spec[0]}", encoding="utf-8")
    assert main(["generate", str(specs), "-o", str(root / "shared_ops"), "--no-cache"]) == 0
    return import_package(root, "shared_ops")


def _forward_passes(function, args: list[torch.Tensor]) -> int:
    numel = function(*args).numel()
    with torch.no_grad(), FullSize(numel) as mode:
        function(*args)
    return mode.count


@pytest.mark.parametrize("name", sorted(OPS))
def test_forward_computes_each_repeated_part_once(ops, name):
    op, _, once, shapes = getattr(ops, name), *OPS[name][1:]
    args = [torch.randn(s, dtype=torch.float64) for s in shapes]
    assert _forward_passes(op, args) <= _forward_passes(once, args)


@pytest.mark.parametrize("name", sorted(OPS))
def test_values_and_gradients_are_plain_autograds(ops, name):
    op, plain, _, shapes = getattr(ops, name), *OPS[name][1:]
    torch.manual_seed(0)
    args = [(2 * torch.randn(s, dtype=torch.float64)).requires_grad_() for s in shapes]
    y, want = op(*args), plain(*args)
    torch.testing.assert_close(y, want)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, args, g, create_graph=True)
    expected = torch.autograd.grad(want, args, g, create_graph=True)
    torch.testing.assert_close(got, expected)
    second = torch.autograd.grad(sum((a * a).sum() for a in got), args)
    torch.testing.assert_close(second, torch.autograd.grad(sum((b * b).sum() for b in expected), args))


def _blocks(node: ast.AST):
    """Every statement list of `node`: a body, an `else`, at every depth."""
    for field in ("body", "orelse", "finalbody"):
        block = getattr(node, field, None)
        if isinstance(block, list) and block:
            yield block
    for child in ast.iter_child_nodes(node):
        yield from _blocks(child)


def test_no_generated_statement_recomputes_what_an_earlier_one_of_its_block_assigned():
    """A value a statement assigned (`tmp = grad_y * weight`, `xhat = torch.layer_norm(...)`) is read by name
    after it, never computed again in the same block: the parts of several gradients are shared too."""
    repeated = []
    for path in sorted((GENERATED / "ops").glob("*.py")):
        for block in _blocks(ast.parse(path.read_text(encoding="utf-8"))):
            earlier: list[tuple[str, str]] = []
            for statement in block:
                if not (isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name)):
                    continue
                target = statement.targets[0].id
                parts = {ast.dump(node) for node in ast.walk(statement.value)}
                repeated += [f"{path.name}: {target} recomputes {name}" for name, v in earlier if v in parts]
                if isinstance(statement.value, (ast.BinOp, ast.Call, ast.UnaryOp)):
                    earlier.append((target, ast.dump(statement.value)))
    assert repeated == []
