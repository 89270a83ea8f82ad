"""PyTorch's and numpy's names for functions (`relu`, `softmax(x, dim=-1)`, `square`, `clip`, ...)
are read as the formula they stand for (Note [aliases] in opgen.formula.aliases): every alias, put
in a spec and generated, computes what PyTorch's function of that name computes, with its
gradient; a call an alias cannot take is a located error."""

from __future__ import annotations

import importlib
import string
import sys

import pytest
import torch
import torch.nn.functional as F

from opgen.emit.render import Renderer
from opgen.formula.aliases import ALIASES
from opgen.formula.words import arity
from opgen.pipeline import build
from tests.spec_ops import build_ops
from tests.test_error_hints import TORCH

# Reductions and normalisations: the spec's input is a batch of rows, the call names `dim=`.
ALONG = {
    "softmax": ("softmax(x, dim=-1)", lambda x: torch.softmax(x, dim=-1)),
    "log_softmax": ("log_softmax(x, dim=0)", lambda x: torch.log_softmax(x, dim=0)),
    "softmin": ("softmin(x, dim=-1)", lambda x: torch.nn.functional.softmin(x, dim=-1)),
    "amin": ("amin(x, dim=-1, keepdim=true)", lambda x: torch.amin(x, dim=-1, keepdim=True)),
    "average": ("average(x)", torch.mean),
}
DOMAIN = {"arccosh": (1.1, 3.0), "arcsin": (0.05, 0.95), "arccos": (0.05, 0.95), "arctanh": (0.05, 0.95)}
DOMAIN["logit"] = DOMAIN["arcsin"]
SIGNED = ("mish", "elu", "celu", "selu", "hardtanh", "hardsigmoid", "hardswish", "leaky_relu", "tanhshrink")
DOMAIN.update({name: (-4.0, 4.0) for name in SIGNED})


def _spec(name: str) -> str:
    if name in ALONG:
        return f"name: alias_{name}\ninputs:\n  x: Tensor[N, K]\noutputs:\n  y: {ALONG[name][0]}\n"
    args = list("xab"[: arity(name)])
    low, high = DOMAIN.get(name, (0.05, 3.0))
    inputs = "".join(f"  {a}: Tensor\n" for a in args)
    domain = ", ".join(f"{a}: [{low}, {high}]" for a in args)
    output = f"  y: {name}({', '.join(args)})\n"
    return f"name: alias_{name}\ninputs:\n{inputs}outputs:\n{output}tests:\n  domain: {{{domain}}}\n"


def test_every_alias_has_a_reference():
    assert ALIASES <= set(TORCH)
    assert "norm" not in ALIASES  # a reduction of the language itself


@pytest.mark.parametrize("name", sorted(ALIASES))
def test_alias_computes_torchs_function_and_its_gradient(name, generated_aliases):
    op = getattr(generated_aliases, f"alias_{name}")
    generator = torch.Generator().manual_seed(sum(map(ord, name)))
    if name in ALONG:
        x = torch.randn(4, 5, generator=generator, dtype=torch.float64, requires_grad=True)
        inputs, reference = [x], ALONG[name][1]
    else:
        low, high = DOMAIN.get(name, (0.05, 3.0))
        inputs = [
            (low + (high - low) * torch.rand(4, 5, generator=generator, dtype=torch.float64)).requires_grad_()
            for _ in range(arity(name))
        ]
        if name in ("pow", "power", "float_power"):
            inputs[1] = torch.full((4, 5), 2.5, dtype=torch.float64, requires_grad=True)
        reference = TORCH[name]
    ours, theirs = op(*inputs), reference(*inputs)
    torch.testing.assert_close(ours, theirs.to(ours.dtype))
    weights = torch.randn(ours.shape, generator=generator, dtype=torch.float64)
    grads, expected = (_gradients((out * weights).sum(), inputs) for out in (ours, theirs))
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want.to(got.dtype))


def _gradients(total: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each input's gradient; zeros where none reaches it (`detach(x)` stops it)."""
    if not total.requires_grad:
        return [torch.zeros_like(x) for x in inputs]
    return list(torch.autograd.grad(total, inputs, allow_unused=True, materialize_grads=True))


@pytest.fixture(scope="module")
def generated_aliases(tmp_path_factory):
    from opgen.cli import main

    root = tmp_path_factory.mktemp("aliases")
    specs = root / "specs"
    specs.mkdir()
    for name in sorted(ALIASES):
        (specs / f"alias_{name}.yaml").write_text(_spec(name))
    package = "alias_ops_" + "".join(c for c in root.name if c in string.ascii_letters + string.digits)
    assert main(["generate", str(specs), "-o", str(root / package), "-q", "--no-cache"]) == 0
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module(package)
    finally:
        sys.path.remove(str(root))


@pytest.mark.parametrize(
    ("formula", "message"),
    [
        ("softmax(x)", "softmax() needs `dim=`, as torch.softmax does"),
        ("relu(x, x)", "relu() takes 1 argument, got 2"),
        ("relu(x, dim=-1)", "relu() takes no keyword arguments, not `dim=`"),
        ("softmax(x, dim=-1, keepdim=true)", "softmax() takes `dim=`, not `keepdim=`"),
        ("clip(x)", "clip() takes 3 arguments, got 1"),
        ("clamp(x, 0, min=1)", "clamp() got `min` twice, by position and as `min=`"),
        ("clip(x, 0, 1, max=2)", "clip() got `max` twice"),
        ("softmax(x, -1, dim=0)", "softmax() got `dim` twice, by position and as `dim=`"),
        ("sum(x, 0, keepdim=true, dim=1)", "sum() got `dim` twice"),
        ("sum(x, 0, true, 1)", "sum() takes one tensor argument and `dim=` and `keepdim=`, got 4 arguments"),
        ("var(x, 0, true)", "var() takes one tensor argument and `dim=` and `keepdim=` and `correction=`, got 3"),
        ("softmax(" * 9 + "x" + ", dim=-1)" * 9, "'formula size' limit"),  # each level doubles its argument
        ("elu(x, 1, 2)", "elu() takes (x, alpha), got 3 arguments"),
        ("elu(x, 0.5, alpha=1)", "elu() got `alpha` twice, by position and as `alpha=`"),
        ("softplus(x, inplace=true)", "softplus() takes `beta=` and `threshold=`, not `inplace=`"),
        ("leaky_relu(x, dim=-1)", "leaky_relu() takes `negative_slope=`, not `dim=`"),
        ("gelu(x, approximate='tan')", "gelu() takes `approximate='none'` or `approximate='tanh'`, as torch does"),
    ],
)
def test_a_call_an_alias_cannot_take_is_located(tmp_path, formula, message):
    spec = tmp_path / "bad.yaml"
    spec.write_text(f"name: bad\ninputs:\n  x: Tensor[N, K]\noutputs:\n  y: {formula}\n")
    report = build([str(spec)], Renderer()).problems.report()
    assert len(report) == 1
    assert report[0].startswith(f"{spec}:5:"), report
    assert message in report[0], report


# As PyTorch's functions take them: the dimension (and keepdim) by position after the tensor, and
# either bound of clamp alone, by position or keyword.
BY_POSITION = {
    "softmax(x, -1)": lambda x: torch.softmax(x, -1),
    "log_softmax(x, 0)": lambda x: torch.log_softmax(x, 0),
    "sum(x, 0, true)": lambda x: torch.sum(x, 0, True),
    "mean(x, -1)": lambda x: torch.mean(x, -1),
    "mean(x, (0, 1))": lambda x: torch.mean(x, (0, 1)),
    "amax(x, 1, keepdim=true)": lambda x: torch.amax(x, 1, keepdim=True),
    "logsumexp(x, -1, true)": lambda x: torch.logsumexp(x, -1, True),
    "var(x, -1, correction=0)": lambda x: torch.var(x, -1, correction=0),
    "std(x, 0)": lambda x: torch.std(x, 0),
    "amin(x, -1, true)": lambda x: torch.amin(x, -1, True),
    "softmin(x, 0)": lambda x: torch.nn.functional.softmin(x, 0),
    "clamp(x, min=-0.5)": lambda x: torch.clamp(x, min=-0.5),
    "clamp(x, max=0.5)": lambda x: torch.clamp(x, max=0.5),
    "clamp(x, -0.5)": lambda x: torch.clamp(x, -0.5),
    "clip(x, -1, max=0.5)": lambda x: torch.clip(x, -1, max=0.5),
}


def test_dim_and_keepdim_by_position_read_as_torch_does(tmp_path):
    specs = {
        f"pos{k}": f"name: pos{k}\ninputs:\n  x: Tensor[N, K]\noutputs:\n  y: {formula}\n"
        for k, formula in enumerate(BY_POSITION)
    }
    ops = build_ops(tmp_path, "positional_ops", specs)
    generator = torch.Generator().manual_seed(3)
    for k, reference in enumerate(BY_POSITION.values()):
        x = torch.randn(4, 5, generator=generator, dtype=torch.float64)
        x[0, :3] = torch.tensor([-0.5, 0.5, -1.0], dtype=torch.float64)  # the clamps' bounds
        x.requires_grad_()
        ours, theirs = getattr(ops, f"pos{k}")(x), reference(x)
        torch.testing.assert_close(ours, theirs)
        weights = torch.randn(theirs.shape, generator=generator, dtype=torch.float64)
        (got,) = torch.autograd.grad((ours * weights).sum(), x)
        (want,) = torch.autograd.grad((theirs * weights).sum(), x)
        torch.testing.assert_close(got, want)


# PyTorch's parameters of activations, by position or keyword, numbers or a `float` input `a` (0.3).
PARAMETERS = {
    "elu(x, alpha=0.5)": lambda x, a: F.elu(x, alpha=0.5),
    "elu(x, a)": F.elu,
    "celu(x, alpha=2.0)": lambda x, a: F.celu(x, 2.0),
    "leaky_relu(x)": lambda x, a: F.leaky_relu(x),
    "leaky_relu(x, 0.2)": lambda x, a: F.leaky_relu(x, 0.2),
    "leaky_relu(x, negative_slope=a)": F.leaky_relu,
    "hardtanh(x, -2, 2)": lambda x, a: F.hardtanh(x, -2.0, 2.0),
    "hardtanh(x, min_val=-0.5, max_val=a)": lambda x, a: F.hardtanh(x, -0.5, a),
    "softplus(x, beta=2)": lambda x, a: F.softplus(x, beta=2),
    "softplus(x, 2, 3)": lambda x, a: F.softplus(x, 2, 3),
    "softplus(x, beta=a, threshold=1)": lambda x, a: F.softplus(x, a, 1),
    "logit(x / 20 + 0.5, eps=0.1)": lambda x, a: torch.logit(x / 20 + 0.5, eps=0.1),
    "logit(x / 20 + 0.5, a)": lambda x, a: torch.logit(x / 20 + 0.5, a),
    "gelu(x, approximate='tanh')": lambda x, a: F.gelu(x, approximate="tanh"),
    'gelu(x, approximate="none")': lambda x, a: F.gelu(x),
}


def test_activation_parameters_read_as_torch_takes_them(tmp_path):
    """Values and gradients against torch.nn.functional, at the kinks too (0, the bounds, the threshold)."""
    specs = {
        f"par{k}": f"name: par{k}\ninputs:\n  x: Tensor\n  a: float = 0.3\noutputs:\n  y: {formula}\n"
        for k, formula in enumerate(PARAMETERS)
    }
    ops = build_ops(tmp_path, "parameter_ops", specs)
    points = [0.0, -0.5, 0.3, 1.5, 1 / 0.3, 2.0, -2.0, 0.5, 3.0, -4.0, 20.0, 1e-3]
    x = torch.cat([torch.tensor(points, dtype=torch.float64), 4 * torch.randn(20, dtype=torch.float64)])
    x.requires_grad_()
    for k, reference in enumerate(PARAMETERS.values()):
        ours, theirs = getattr(ops, f"par{k}")(x), reference(x, 0.3)
        torch.testing.assert_close(ours, theirs)
        (got,) = torch.autograd.grad(ours.sum(), x)
        (want,) = torch.autograd.grad(theirs.sum(), x)
        torch.testing.assert_close(got, want)


# Over several dims softmax is not torch.softmax (one dim) but the formula as written: exp(x - logsumexp(x, dims)).
SEVERAL_DIMS = {
    "softmax_all": ("softmax(x, dim=(0, 1))", lambda x: torch.exp(x - torch.logsumexp(x, dim=(0, 1), keepdim=True))),
    "log_softmax_all": ("log_softmax(x, dim=(-1, 0))", lambda x: x - torch.logsumexp(x, dim=(0, 1), keepdim=True)),
}


def test_softmax_over_several_dims_is_the_formula(tmp_path):
    from opgen.cli import main

    specs = tmp_path / "specs"
    specs.mkdir()
    for name, (formula, _) in SEVERAL_DIMS.items():
        (specs / f"{name}.yaml").write_text(f"name: {name}\ninputs:\n  x: Tensor[N, K]\noutputs:\n  y: {formula}\n")
    assert main(["generate", str(specs), "-o", str(tmp_path / "several_dims_ops"), "-q", "--no-cache"]) == 0
    sys.path.insert(0, str(tmp_path))
    try:
        ops = importlib.import_module("several_dims_ops")
    finally:
        sys.path.remove(str(tmp_path))
    for name, (_, reference) in SEVERAL_DIMS.items():
        x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
        ours, theirs = getattr(ops, name)(x), reference(x)
        torch.testing.assert_close(ours, theirs)
        weights = torch.randn(3, 4, dtype=torch.float64)
        got, want = (torch.autograd.grad((y * weights).sum(), x)[0] for y in (ours, theirs))
        torch.testing.assert_close(got, want)
