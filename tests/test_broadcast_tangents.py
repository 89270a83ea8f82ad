"""Forward mode through `@`, `.T`, `sum`, `mean` and `unsqueeze` when an input is broadcast into a tensor
formula (Note [broadcast tangents] in opgen.derive.jvp), and the formula language's `unsqueeze`.

Every op is checked against `torch.func.jvp` and autograd of its generated tests' plain-torch
`reference` (written from the formula text, never from opgen's derivation), and gradchecked with
forward AD, in float64, along each input alone and all together.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from spec_ops import build_ops

DTYPE = torch.float64

SPECS = {
    # a [K] bias broadcast against [N, K], then contracted by `@`
    "bias_matmul": ("{x: 'Tensor[N, K]', b: 'Tensor[K]', w: 'Tensor[K, M]'}", "(x + b) @ w"),
    # a [M] shift broadcast along the contracted dimension of the right operand
    "shift_right": ("{x: 'Tensor[N, K]', w: 'Tensor[K, M]', c: 'Tensor[M]'}", "x @ (w + c)"),
    # a tangent of shape [N, 1] (keepdim) contracted by `@`
    "keepdim_matmul": (
        "{x: 'Tensor[N, K]', z: 'Tensor[N, J]', w: 'Tensor[K, M]'}",
        "(x + amax(z, dim=-1, keepdim=true)) @ w",
    ),
    # sum and mean over the dimension a [K] input is broadcast along, and along the other one
    "sum_broadcast": (
        "{x: 'Tensor[N, K]', s: 'Tensor[K]'}",
        "sum(x * s + s, dim=0) + mean(exp(x) + s, dim=0) + sum(s + x, dim=-1, keepdim=true).T @ x",
    ),
    # batch dimensions: a [K] input against [..., N, K] through sum, `.T` and `@`
    "batched": (
        "{x: 'Tensor[..., N, K]', s: 'Tensor[K]', w: 'Tensor[K, K]'}",
        "sum(x + s, dim=-2, keepdim=true) * ((x + s) @ w.T) + (x + s) @ ((x + s).T @ x)",
    ),
    # unsqueeze: a batch of vectors meets a batch of matrices (as in specs/bilinear.yaml)
    "unsqueezed": (
        "{x: 'Tensor[..., N, K]', w: 'Tensor[O, K, K]', v: 'Tensor[K]'}",
        "sum(unsqueeze(x + v, dim=-3) @ w, dim=-1).T + sum(sum(unsqueeze(v, dim=-1) * w, dim=-2), dim=-1)",
    ),
    # unsqueeze as the whole output (a view of the input), and twice in one product
    "unsqueeze_output": ("{x: 'Tensor[N, K]'}", "unsqueeze(x, dim=-1)"),
    "unsqueeze_outer": (
        "{x: 'Tensor[N, K]'}",
        "sum(unsqueeze(x, dim=1) * unsqueeze(x, dim=-1), dim=0) + unsqueeze(sum(x, dim=0), dim=0)",
    ),
}
SHAPES = {
    "bias_matmul": ([3, 4], [4], [4, 2]),
    "shift_right": ([3, 4], [4, 2], [2]),
    "keepdim_matmul": ([3, 4], [3, 5], [4, 2]),
    "sum_broadcast": ([3, 4], [4]),
    "batched": ([2, 3, 4], [4], [4, 4]),
    "unsqueezed": ([2, 3, 4], [5, 4, 4], [4]),
    "unsqueeze_output": ([3, 4],),
    "unsqueeze_outer": ([3, 4],),
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory):
    texts = {
        name: f"name: {name}\ninputs: {inputs}\noutputs:\n  y: {formula}\n" for name, (inputs, formula) in SPECS.items()
    }
    folder: Path = tmp_path_factory.mktemp("broadcast_tangents")
    package = build_ops(folder, "broadcast_tangent_ops", texts)
    return {name: importlib.import_module(f"broadcast_tangent_ops.tests.test_{name}") for name in SPECS} | {
        "package": package
    }


def _inputs(name: str, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(s, generator=generator, dtype=DTYPE) * 2 - 1 for s in SHAPES[name]]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_jvp_of_broadcast_inputs_equals_forward_mode_of_the_reference(ops, name: str) -> None:
    tests = ops[name]
    args, tangents = _inputs(name), _inputs(name, seed=1)
    reference = lambda *a: tests.reference(*a)["y"]  # noqa: E731
    for which in [[k] for k in range(len(args))] + [list(range(len(args)))]:

        def along(fn, which=which):
            def call(*tensors):
                full = list(args)
                for k, t in zip(which, tensors, strict=True):
                    full[k] = t
                return fn(*full)

            return call

        primals, ts = tuple(args[k] for k in which), tuple(tangents[k] for k in which)
        got = torch.func.jvp(along(tests.OP.functional), primals, ts)
        want = torch.func.jvp(along(reference), primals, ts)
        torch.testing.assert_close(got, want, msg=lambda m, which=which: f"{name} along {which}: {m}")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_gradcheck_with_forward_ad_and_backward_against_the_reference(ops, name: str) -> None:
    tests = ops[name]
    args = [a.requires_grad_() for a in _inputs(name)]
    out = tests.OP.functional(*args)
    want = tests.reference(*args)["y"]
    torch.testing.assert_close(out, want)
    v = torch.rand(out.shape, generator=torch.Generator().manual_seed(2), dtype=DTYPE)
    torch.testing.assert_close(torch.autograd.grad(out, args, v), torch.autograd.grad(want, args, v))
    assert torch.autograd.gradcheck(tests.OP.functional, args, check_forward_ad=True, check_batched_grad=True)
