"""Reductions over every dimension of plain `Tensor`s and of `Tensor[..., D]`: scalar losses such as
`mean((input - target)**2)` (Note [counts of unknown shapes] in opgen.formula.dims). Each op,
generated, equals plain torch autograd of the same formula in value, gradient, second derivative,
forward mode (torch.func.jvp) and per-sample gradients (vmap of grad), with inputs of one shape and
with inputs that broadcast."""

from __future__ import annotations

import importlib
import string
import sys

import pytest
import torch
from spec_ops import build_ops

from opgen.cli import main
from opgen.emit.render import Renderer
from opgen.pipeline import build

# name -> (formula over plain Tensors x and t, the same in plain torch)
PLAIN = {
    "mse": ("mean((x - t)**2)", lambda x, t: ((x - t) ** 2).mean()),
    "l1": ("mean(abs(x - t))", lambda x, t: (x - t).abs().mean()),
    "sum_narrow": ("sum(x * x + t)", lambda x, t: (x * x + t).sum()),
    "shifted": ("t - mean(x * x)", lambda x, t: t - (x * x).mean()),
    "mean_plus": ("mean(x) + t", lambda x, t: x.mean() + t),
    "charbonnier": ("mean(sqrt((x - t)**2 + eps**2))", lambda x, t: ((x - t) ** 2 + 0.25**2).sqrt().mean()),
    "var_all": ("var(x * t)", lambda x, t: (x * t).var()),
    "std_all": ("std(x - t, correction=0)", lambda x, t: (x - t).std(correction=0)),
    "amax_all": ("amax(x + t)", lambda x, t: (x + t).amax()),
    "ratio": ("sum(x * t) / mean(t)", lambda x, t: (x * t).sum() / t.mean()),
    # A whole reduction inside another: its gradient is constant over the outer operand, counted once per entry.
    "centered_sum": ("sum(x - mean(x)) + mean(t)", lambda x, t: (x - x.mean()).sum() + t.mean()),
    "inner_std": (
        "sum(t + std(x)) + mean(x * t - mean(x) ** 2)",
        lambda x, t: (t + x.std()).sum() + (x * t - x.mean() ** 2).mean(),
    ),
    "huber_mean": (
        "mean(where(abs(x - t) < 1, 0.5 * (x - t)**2, abs(x - t) - 0.5))",
        lambda x, t: torch.nn.functional.huber_loss(x, t.expand_as(x)),
    ),
}
# name -> (formula over x: Tensor[..., D] and w: Tensor[D], the same in plain torch)
BATCHED = {
    "scale_mean": ("mean(x * w)", lambda x, w: (x * w).mean()),
    "batch_var": ("var(x, correction=0) + sum(w)", lambda x, w: x.var(correction=0) + w.sum()),
    # A whole reduction inside another over a batch: was refused ("a gradient constant along the batch ...").
    "batch_centered": ("sum(x * w - mean(x))", lambda x, w: (x * w - x.mean()).sum()),
    "batch_kept": (
        "sum(x - amax(x, dim=-1, keepdim=true) - mean(x)) * sum(w)",
        lambda x, w: (x - x.amax(-1, keepdim=True) - x.mean()).sum() * w.sum(),
    ),
}


def _spec(name: str) -> str:
    if name in PLAIN:
        inputs = "  x: Tensor\n  t: Tensor\n  eps: float = 0.25\n"  # a number input is no tensor to count
        return f"name: {name}\ninputs:\n{inputs}outputs:\n  y: {PLAIN[name][0]}\n"
    return f"name: {name}\ninputs:\n  x: Tensor[..., D]\n  w: Tensor[D]\noutputs:\n  y: {BATCHED[name][0]}\n"


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    root = tmp_path_factory.mktemp("whole")
    specs = root / "specs"
    specs.mkdir()
    for name in [*PLAIN, *BATCHED]:
        (specs / f"{name}.yaml").write_text(_spec(name))
    package = "whole_ops_" + "".join(c for c in root.name if c in string.ascii_letters + string.digits)
    assert main(["generate", str(specs), "-o", str(root / package), "-q", "--no-cache"]) == 0
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module(package)
    finally:
        sys.path.remove(str(root))


def _inputs(name: str, shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(sum(map(ord, name)))
    return [torch.randn(s, generator=generator, dtype=torch.float64, requires_grad=True) for s in shapes]


CASES = [(n, s) for n in PLAIN for s in (((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 3, 4), (3, 1)))]
CASES += [(n, s) for n in BATCHED for s in (((3, 4), (4,)), ((2, 3, 4), (4,)))]


@pytest.mark.parametrize(("name", "shapes"), CASES)
def test_op_equals_plain_autograd_in_every_mode(ops, name, shapes):
    op = getattr(ops, name)
    reference = (PLAIN | BATCHED)[name][1]
    inputs = _inputs(name, shapes)
    ours, theirs = op(*inputs), reference(*inputs)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs)
    weights = torch.randn(ours.shape, dtype=torch.float64)
    grads = torch.autograd.grad((ours * weights).sum(), inputs, create_graph=True)
    expected = torch.autograd.grad((theirs * weights).sum(), inputs, create_graph=True)
    for got, want in zip(grads, expected, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)
    # second derivatives: the gradient's gradient along a fixed direction
    directions = [torch.randn_like(g) for g in grads]
    for got, want in zip(_second(grads, directions, inputs), _second(expected, directions, inputs), strict=True):
        torch.testing.assert_close(got, want)
    plain = [i.detach() for i in inputs]
    tangents = [torch.randn_like(i) for i in plain]
    _, jvp = torch.func.jvp(op, tuple(plain), tuple(tangents))
    _, jvp_ref = torch.func.jvp(reference, tuple(plain), tuple(tangents))
    torch.testing.assert_close(jvp, jvp_ref)


def _second(grads, directions, inputs) -> list[torch.Tensor]:
    """The gradient of `sum(grads * directions)`, zeros where it does not depend on an input."""
    total = sum((g * d).sum() for g, d in zip(grads, directions, strict=True) if g.requires_grad)
    if not torch.is_tensor(total) or not total.requires_grad:
        return [torch.zeros_like(i) for i in inputs]
    found = torch.autograd.grad(total, inputs, allow_unused=True)
    return [torch.zeros_like(i) if f is None else f for f, i in zip(found, inputs, strict=True)]


@pytest.mark.parametrize("name", ["mse", "sum_narrow", "var_all"])
def test_per_sample_gradients_under_vmap(ops, name):
    op, reference = getattr(ops, name), PLAIN[name][1]
    x, t = (i.detach() for i in _inputs(name, ((5, 3, 4), (4,))))
    ours = torch.func.vmap(torch.func.grad(op, argnums=(0, 1)), in_dims=(0, None))(x, t)
    theirs = torch.func.vmap(torch.func.grad(reference, argnums=(0, 1)), in_dims=(0, None))(x, t)
    for got, want in zip(ours, theirs, strict=True):
        torch.testing.assert_close(got, want)


# name -> (formula over x: Tensor and p: Tensor?, the same in plain torch with p, without p)
OPTIONAL = {
    "shifted_mean": ("mean(x) + p", lambda x, p: x.mean() + p, lambda x: x.mean()),
    "counted_with_p": (  # without p, its terms are dropped: (x - p)**2 is x**2
        "mean((x - p)**2) + sum(x)",
        lambda x, p: ((x - p) ** 2).mean() + x.sum(),
        lambda x: (x**2).mean() + x.sum(),
    ),
}


@pytest.mark.parametrize("name", OPTIONAL)
def test_whole_reduction_beside_an_absent_optional_input(tmp_path, name):
    """A size counted at call time (`x.numel()`, `p.shape`) is not read from a `Tensor?` that is None."""
    formula, with_p, without_p = OPTIONAL[name]
    (tmp_path / "specs").mkdir()
    spec = f"name: {name}\ninputs:\n  x: Tensor\n  p: Tensor?\noutputs:\n  y: {formula}\n"
    (tmp_path / "specs" / f"{name}.yaml").write_text(spec)
    package = f"optional_{name}"
    assert main(["generate", str(tmp_path / "specs"), "-o", str(tmp_path / package), "-q", "--no-cache"]) == 0
    sys.path.insert(0, str(tmp_path))
    try:
        op = getattr(importlib.import_module(package), name)
    finally:
        sys.path.remove(str(tmp_path))
    x, p = _inputs(name, ((3, 4), (4,)))
    for args, reference in (((x, None), lambda: without_p(x)), ((x, p), lambda: with_p(x, p))):
        ours, theirs = op(*args), reference()
        torch.testing.assert_close(ours, theirs)
        present = [a for a in args if a is not None]
        got = torch.autograd.grad(ours.sum(), present)
        want = torch.autograd.grad(theirs.sum(), present)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)


def test_mse_equals_pytorchs_loss(ops):
    x, t = _inputs("mse", ((6, 5), (6, 5)))
    torch.testing.assert_close(ops.mse(x, t), torch.nn.functional.mse_loss(x, t))


@pytest.mark.parametrize(
    ("inputs", "formula", "message"),
    [
        ("x: Tensor", "mean(x, keepdim=true)", "needs an operand with declared dimensions"),
        ("x: Tensor", "sum(x, dim=-1)", "needs an operand with declared dimensions"),
    ],
)
def test_a_whole_reduction_that_cannot_be_counted_is_located(tmp_path, inputs, formula, message):
    spec = tmp_path / "bad.yaml"
    spec.write_text(f"name: bad\ninputs:\n  {inputs}\noutputs:\n  y: {formula}\n")
    report = build([str(spec)], Renderer()).problems.report()
    assert len(report) == 1 and message in report[0], report
    assert report[0].startswith(str(spec) + ":"), report


def test_a_reduction_of_a_let_that_simplified_to_a_number(tmp_path):
    """`l: atanh(xlogy(sin(x), 1))` is 0: `std(a * l)` printed `(a * l).var()` on Python numbers and
    raised. Mean, max, min and population variance of equal entries need no count; a sum does, and is
    a located error (Note [reductions of a number] in opgen.formula.written)."""
    text = "std(a * l, correction=0) + mean(a * l) + amax(l + 2) + amin(l - a) + t"
    spec = "name: numbers\ninputs:\n  t: Tensor\n  x: Tensor\n  a: float = -1.5\nlet:\n  l: atanh(xlogy(sin(x), 1))\n"
    op = build_ops(tmp_path, "number_ops", {"numbers": spec + f"outputs:\n  y: {text}\n"}).numbers
    t, x = torch.randn(3, dtype=torch.float64, requires_grad=True), torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(op(t, x, -1.5), t + 3.5)
    assert torch.autograd.gradcheck(lambda t: op(t, x, -1.5), (t,))
    (tmp_path / "specs" / "numbers.yaml").write_text(spec + "outputs:\n  y: sum(l + 1) + t\n")
    result = build([str(tmp_path / "specs")], Renderer())
    assert "numbers.yaml:9:6: in `sum(l + 1) + t`: sum() of `l + 1`: the number l + 1 once simplified" in "\n".join(
        result.problems.report()
    )


def test_the_generated_tests_of_a_reduction_over_the_batch_sample_a_batch(tmp_path):
    """`var(norm(x, dim=-1))` of `x: Tensor[..., D]` is a variance over the batch: sampled without
    one, it is the variance of one number, NaN, and the generated tests failed on a correct op."""
    import subprocess

    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "spread.yaml").write_text(
        "name: spread\ninputs:\n  x: Tensor[..., D]\noutputs:\n  y: var(norm(x, dim=-1)) + std(sum(x, dim=-1))\n"
    )
    assert main(["generate", str(specs), "-o", str(tmp_path / "spread_ops"), "-q"]) == 0
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings", "spread_ops/tests"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:]


def test_a_whole_reduction_of_a_tensor_of_no_dimensions(tmp_path):
    """`mean(s)`, `std(s, correction=0)` and `amax(s)` of `s: Tensor[]` take one entry: deriving their gradient
    refused the spec ('mean() over every dimension of []: its operand is not elementwise'). Against plain
    torch autograd, first and second derivatives and forward mode."""
    spec = (
        "name: single\ninputs:\n  s: Tensor[]\n  x: Tensor\n"
        "outputs:\n  y: min(mean(s), x) * s + std(s * x, correction=0) + amax(s) * mean(s * s)\n"
    )
    op = build_ops(tmp_path, "single_ops", {"single": spec}).single

    def plain(s: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.minimum(s.mean(), x) * s + (s * x).std(correction=0) + s.amax() * (s * s).mean()

    s = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    x = torch.tensor([1.3, 0.2, 0.9], dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(op(s, x), plain(s, x))
    got = torch.autograd.grad(op(s, x).sum(), (s, x), create_graph=True)
    want = torch.autograd.grad(plain(s, x).sum(), (s, x), create_graph=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got[0], (s, x)), torch.autograd.grad(want[0], (s, x)))
    tangents = (torch.tensor(0.3, dtype=torch.float64), torch.tensor([-0.5, 0.1, 2.0], dtype=torch.float64))
    torch.testing.assert_close(torch.func.jvp(op, (s, x), tangents), torch.func.jvp(plain, (s, x), tangents))
