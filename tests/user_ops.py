"""Checks shared by the user-op rounds (tests/test_user_ops_round*.py): each op of a folder of specs
against an independent plain-torch reference of its formula.

A reference takes the op's arguments and returns its outputs as a tuple.
"""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import import_package


def generate(folder: Path, package: str, specs: dict[str, str]):
    """The package `package` generated in `folder` from `specs` (name: the spec after its `name:` line)."""
    from opgen.cli import main

    for name, text in specs.items():
        (folder / f"{name}.yaml").write_text(f"name: {name}\n{text.lstrip(chr(10))}")
    assert main(["generate", str(folder), "-o", str(folder / package), "--no-cache"]) == 0
    return import_package(folder, package)


def case(ops, name: str, batched: bool = False):
    """(the op, its generated test's sample arguments, the positions of the tensors among them)."""
    tests = getattr(__import__(f"{ops.__name__}.tests.test_{name}").tests, f"test_{name}")
    args = tests.sample_inputs(tests.BATCHED_SHAPES) if batched else tests.sample_inputs()
    tensors = [k for k in tests.OP.tensor_inputs if args[k] is not None]
    return getattr(ops, name), args, tensors


def of(fn, args, tensors):
    """`fn` as a function of the tensors at `tensors` (the other arguments as in `args`), returning a tuple."""

    def call(*xs):
        full = list(args)
        for k, x in zip(tensors, xs, strict=True):
            full[k] = x
        out = fn(*full)
        return out if isinstance(out, tuple) else (out,)

    return call


def weighted(fn, weights):
    """The sum of `fn`'s outputs times `weights`, leaving out those without a weight (masks)."""
    return lambda *xs: sum((o * w).sum() for o, w in zip(fn(*xs), weights, strict=True) if w is not None)


def check_float64(mine, theirs, primals, hessian: bool = False, forward_mode: bool = True) -> None:
    """Values, gradients, gradgradcheck and `torch.func.jvp` of `mine` against `theirs` at `primals`,
    and with `hessian`, `torch.func.hessian` of a weighted sum of the outputs; without `forward_mode`
    (an op that refuses it), neither of the last two."""
    want = theirs(*primals)
    torch.testing.assert_close(mine(*primals), want)
    generator = torch.Generator().manual_seed(0)
    weights = [torch.rand(w.shape, generator=generator, dtype=w.dtype) if w.is_floating_point() else None for w in want]
    xs = [p.clone().requires_grad_() for p in primals]
    got = torch.autograd.grad(weighted(mine, weights)(*xs), xs, allow_unused=True)
    expected = torch.autograd.grad(weighted(theirs, weights)(*xs), xs, allow_unused=True)
    for g, e, x in zip(got, expected, xs, strict=True):
        torch.testing.assert_close(
            g if g is not None else torch.zeros_like(x), e if e is not None else torch.zeros_like(x)
        )
    assert torch.autograd.gradgradcheck(weighted(mine, weights), xs)
    if not forward_mode:
        return
    tangents = tuple(torch.rand(p.shape, generator=generator, dtype=p.dtype) for p in primals)
    torch.testing.assert_close(torch.func.jvp(mine, primals, tangents)[1], torch.func.jvp(theirs, primals, tangents)[1])
    if hessian:
        got_hessian = torch.func.hessian(weighted(mine, weights))(*primals)
        torch.testing.assert_close(got_hessian, torch.func.hessian(weighted(theirs, weights))(*primals))


def check_float32(op, reference, args) -> None:
    """The op in float32 at `args` (extreme inputs) against `reference` in float64 where that is finite:
    values, and gradients of the sum of the outputs (where the reference's gradient is finite)."""
    tensors = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor)]
    x32 = [args[k].clone().requires_grad_() for k in tensors]
    x64 = [args[k].double().requires_grad_() for k in tensors]
    got = of(op, args, tensors)(*x32)
    want = of(reference, args, tensors)(*x64)
    for g, w in zip(got, want, strict=True):
        assert torch.isfinite(w).all()
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-4)
    got_grads = torch.autograd.grad(sum(g.sum() for g in got), x32, allow_unused=True)
    want_grads = torch.autograd.grad(sum(w.sum() for w in want), x64, allow_unused=True)
    for g, w in zip(got_grads, want_grads, strict=True):
        if w is None:  # an input no gradient flows to (a mask)
            continue
        assert torch.isfinite(g).all(), g
        finite = torch.isfinite(w)  # plain autograd in float64 overflows too at 1e4 (exp(1e4) * 0)
        torch.testing.assert_close(g.double()[finite], w[finite], rtol=1e-3, atol=1e-4)


def jacobians_both_ways(ops, name: str):
    """(the Jacobian of op `name` in every sampled tensor by forward mode, after checking it equals the one
    by reverse mode: jvp and vjp are transposes), and the tensors it was taken at."""
    op, args, tensors = case(ops, name)
    primals = tuple(args[k] for k in tensors)
    argnums = tuple(range(len(primals)))
    forward = torch.func.jacfwd(of(op, args, tensors), argnums=argnums)(*primals)
    torch.testing.assert_close(forward, torch.func.jacrev(of(op, args, tensors), argnums=argnums)(*primals))
    return forward, primals
