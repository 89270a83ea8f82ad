"""Parts of a named dimension: `x[..., :D // 2]`, `x[:, D // 3:]`, `chunk(x, k, dim=d)[i]` (opgen.formula.slicing).

Each op is compared, in float64, with plain torch written by hand (PyTorch's own slicing and chunk under
autograd, never opgen's derivation): values, gradients, double backward, forward mode, and the
`torch.func` transforms (vmap of the op and of its gradient, jacfwd, jacrev); the GLU spec also under
`torch.compile`. The cases cover a cut along a dimension that is not the last, parts of parts, thirds,
a gradient that reaches a part narrow (constant along the cut dimension, through a keepdim
reduction), a reduction over a part (its mean divides by the part's size), and parts as outputs.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from spec_ops import build_ops

DTYPE = torch.float64

# name: (inputs, formula, shapes of the inputs, the same formula in plain torch)
CASES = {
    "glu_last": (
        "{x: 'Tensor[..., D]'}",
        "x[..., :D // 2] * sigmoid(x[..., D // 2:])",
        ([2, 3, 6],),
        lambda x: F.glu(x, dim=-1),
    ),
    "chunk_rows": (
        "{x: 'Tensor[N, D]', w: 'Tensor[D]'}",
        "tanh(chunk(x, 2, dim=0)[1]) * chunk(x, 2, dim=-2)[0] + w",
        ([4, 3], [3]),
        lambda x, w: torch.tanh(x.chunk(2, dim=0)[1]) * x.chunk(2, dim=0)[0] + w,
    ),
    "thirds": (
        "{x: 'Tensor[..., D]'}",
        "exp(x[..., D // 3:2 * D // 3]) * x[..., D - D // 3:] - x[..., :D // 3] ** 2",
        ([2, 6],),
        lambda x: torch.exp(x[..., 2:4]) * x[..., 4:] - x[..., :2] ** 2,
    ),
    "part_of_part": (
        "{x: 'Tensor[..., D]'}",
        "let_half[..., D // 4:] * chunk(let_half, 2, dim=-1)[0]",
        ([3, 8],),
        lambda x: x[..., 2:4] * x[..., :2],
    ),
    "narrow_gradient": (
        "{x: 'Tensor[..., N, D]'}",
        "sum(x[..., :D // 2] ** 2, dim=-1, keepdim=true) * mean(x[..., D // 2:], dim=-1, keepdim=true)"
        " + sum(sin(x[..., :N // 2, :]), dim=-2, keepdim=true)",
        ([2, 4, 6],),
        lambda x: (
            (x[..., :3] ** 2).sum(-1, keepdim=True) * x[..., 3:].mean(-1, keepdim=True)
            + torch.sin(x[..., :2, :]).sum(-2, keepdim=True)
        ),
    ),
    "part_output": (
        "{x: 'Tensor[D]', s: float}",
        "s * chunk(x, 4, dim=-1)[-1]",
        ([8], 1.5),
        lambda x, s: s * x[6:],
    ),
}


def _spec(name: str, inputs: str, formula: str) -> str:
    if name == "part_of_part":
        return f"name: {name}\ninputs: {inputs}\nlet:\n  let_half: x[..., :D // 2]\noutputs:\n  y: {formula}\n"
    return f"name: {name}\ninputs: {inputs}\noutputs:\n  y: {formula}\n"


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory):
    texts = {name: _spec(name, inputs, formula) for name, (inputs, formula, _, _) in CASES.items()}
    folder: Path = tmp_path_factory.mktemp("dimension_parts")
    package = build_ops(folder, "dimension_part_ops", texts)
    return {name: importlib.import_module(f"dimension_part_ops.tests.test_{name}") for name in CASES} | {
        "package": package
    }


def _inputs(name: str, seed: int = 0) -> list:
    generator = torch.Generator().manual_seed(seed)
    shapes = CASES[name][2]
    return [torch.rand(s, generator=generator, dtype=DTYPE) * 2 - 1 if isinstance(s, list) else s for s in shapes]


def _tensors(args: list) -> list[torch.Tensor]:
    return [a for a in args if torch.is_tensor(a)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_gradients_and_second_derivatives_equal_plain_torch(ops, name: str) -> None:
    op, native = ops[name].OP.functional, CASES[name][3]
    args = [a.requires_grad_() if torch.is_tensor(a) else a for a in _inputs(name)]
    out, want = op(*args), native(*args)
    assert out.shape == want.shape
    torch.testing.assert_close(out, want)
    v = torch.rand(out.shape, generator=torch.Generator().manual_seed(2), dtype=DTYPE)
    got = torch.autograd.grad(out, _tensors(args), v, create_graph=True)
    expected = torch.autograd.grad(want, _tensors(args), v, create_graph=True)
    torch.testing.assert_close(got, expected)
    # the gradient's own gradient (through `Pad`): double backward equals plain torch's
    mine, theirs = sum((g**2).sum() for g in got), sum((g**2).sum() for g in expected)
    assert isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor)
    assert mine.requires_grad == theirs.requires_grad  # a gradient constant in the inputs has no graph
    if theirs.requires_grad:
        again = dict(allow_unused=True, materialize_grads=True)
        torch.testing.assert_close(
            torch.autograd.grad(mine, _tensors(args), **again), torch.autograd.grad(theirs, _tensors(args), **again)
        )
    assert torch.autograd.gradcheck(op, args, check_forward_ad=True, check_batched_grad=True)
    assert torch.autograd.gradgradcheck(op, args, check_fwd_over_rev=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_func_transforms_equal_plain_torch(ops, name: str) -> None:
    op, native = ops[name].OP.functional, CASES[name][3]
    args, tangents = _inputs(name), _inputs(name, seed=1)
    first = args[0]
    rest = args[1:]
    torch.testing.assert_close(
        torch.func.jvp(lambda x: op(x, *rest), (first,), (tangents[0],)),
        torch.func.jvp(lambda x: native(x, *rest), (first,), (tangents[0],)),
    )
    torch.testing.assert_close(torch.func.jacfwd(op)(*args), torch.func.jacfwd(native)(*args))
    torch.testing.assert_close(torch.func.jacrev(op)(*args), torch.func.jacrev(native)(*args))
    stacked = torch.stack([first, tangents[0]])
    torch.testing.assert_close(
        torch.func.vmap(lambda x: op(x, *rest))(stacked), torch.func.vmap(lambda x: native(x, *rest))(stacked)
    )


def test_generated_glu_matches_F_glu_under_compile_and_vmap() -> None:
    from conftest import ROOT, import_package

    generated = import_package(ROOT, "generated")
    x = torch.randn(4, 3, 10, dtype=DTYPE, requires_grad=True)
    compiled = torch.compile(generated.glu, backend="aot_eager", fullgraph=False)
    out = compiled(x)
    torch.testing.assert_close(out, F.glu(x, dim=-1))
    g = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, x, g)[0], torch.autograd.grad(F.glu(x, dim=-1), x, g)[0])
    per_row = torch.func.vmap(torch.func.grad(lambda r: generated.glu(r).sum()))(x.detach().reshape(12, 10))
    want = torch.func.vmap(torch.func.grad(lambda r: F.glu(r, dim=-1).sum()))(x.detach().reshape(12, 10))
    torch.testing.assert_close(per_row, want)


def test_sample_sizes_of_a_cut_dimension_are_divisible(ops) -> None:
    """The generated tests sample a dimension cut in thirds at a multiple of 3 (the default, 3 here, is kept)
    and one cut in quarters at a multiple of 4, so a user's spec passes its own generated tests."""
    assert ops["thirds"].SHAPES["x"][-1] % 3 == 0
    assert ops["part_output"].SHAPES["x"][-1] % 4 == 0
