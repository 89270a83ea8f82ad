"""Build ops from spec text in a temporary folder, for opgen's own tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

from conftest import import_package

from opgen.emit.render import Renderer
from opgen.pipeline import build
from opgen.write.files import apply, changes


def build_ops(folder: Path, package: str, specs: dict[str, str]):
    """Write each `name: yaml text` spec under `folder`, generate the package `package`, import it."""
    spec_dir = folder / "specs"
    spec_dir.mkdir(parents=True, exist_ok=True)
    for name, text in specs.items():
        (spec_dir / f"{name}.yaml").write_text(textwrap.dedent(text))
    result = build([str(spec_dir)], Renderer(), namespace=package)
    assert not result.problems, result.problems.report()
    out = folder / package
    apply(out, changes(out, result.files))
    return import_package(folder, package)


def assert_located(folder: Path, inputs: str, formula: str, expected: str) -> None:
    """The spec `bad` of `inputs` (a YAML flow mapping) with the output `out: formula` is refused at the
    formula's line with a message holding `expected`."""
    from opgen.pipeline import plan_all

    spec = folder / "bad.yaml"
    spec.write_text(f"name: bad\ninputs: {inputs}\noutputs:\n  out: {formula}\n")
    _, problems = plan_all([str(spec)])
    assert problems.errors, formula
    message = problems.report()[0]
    assert message.startswith(f"{spec}:4:"), message
    assert expected in message, message


def assert_like_plain_torch(op, plain, args: list) -> None:
    """`op` against `plain` (the same formula in plain torch) at `args`, float64 tensors: values, first and
    second derivatives, gradcheck and gradgradcheck (with forward mode and batched gradients)."""
    import torch

    args = [a.detach().requires_grad_() for a in args]
    got, want = op(*args), plain(*args)
    torch.testing.assert_close(got, want)
    weight = torch.linspace(-1, 1, want.numel(), dtype=want.dtype).view_as(want)
    g = torch.autograd.grad((got * weight).sum(), args, create_graph=True)
    w = torch.autograd.grad((want * weight).sum(), args, create_graph=True)
    torch.testing.assert_close(g, w)
    second = torch.autograd.grad(sum(x.pow(2).sum() for x in g), args)
    torch.testing.assert_close(second, torch.autograd.grad(sum(x.pow(2).sum() for x in w), args))
    assert torch.autograd.gradcheck(op, args, check_forward_ad=True, check_batched_grad=True)
    assert torch.autograd.gradgradcheck(op, args, check_fwd_over_rev=True)


def assert_transforms_like_plain_torch(op, plain, args: list, tangents: list, batch: list) -> None:
    """torch.func.jvp at `args` along `tangents`, vmap of grad over `batch` (the arguments stacked) and
    torch.compile(fullgraph=True) of `op`, each against `plain`."""
    import torch

    torch.testing.assert_close(
        torch.func.jvp(op, tuple(args), tuple(tangents)), torch.func.jvp(plain, tuple(args), tuple(tangents))
    )
    positions = tuple(range(len(args)))
    grads = torch.func.vmap(torch.func.grad(lambda *a: op(*a).sum(), argnums=positions))(*batch)
    want = torch.func.vmap(torch.func.grad(lambda *a: plain(*a).sum(), argnums=positions))(*batch)
    torch.testing.assert_close(grads, want)
    compiled = torch.compile(op, fullgraph=True, backend="aot_eager")
    args = [a.detach().requires_grad_() for a in args]
    torch.testing.assert_close(
        torch.autograd.grad(compiled(*args).sum(), args), torch.autograd.grad(plain(*args).sum(), args)
    )
