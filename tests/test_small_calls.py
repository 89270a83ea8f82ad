"""The per-call cost of a generated op: `apply` skips `Function.apply`'s signature binding
outside torch.func transforms (a third of a small call's time on torch 2.13), and behaves as
`Function.apply` everywhere: plain calls, under vmap/grad/jvp, on tensors escaped from a transform."""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import ROOT, SPECS, import_package

SPEC_NAMES = sorted(p.stem for p in SPECS.glob("*.yaml"))


@pytest.fixture(scope="module")
def ops():
    return import_package(ROOT, "generated")


def _function(ops, name):
    module = getattr(ops.ops, name)
    return next(
        v
        for k, v in vars(module).items()
        if k.endswith("Function") and not k.startswith("_") and v.__module__ == module.__name__
    )


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_a_plain_call_binds_no_signature(ops, name, monkeypatch):
    """Outside transforms, `apply` never calls `inspect.signature` (what makes `Function.apply` slow)."""
    tests = __import__(f"generated.tests.test_{name}", fromlist=["OP"])
    args = tests.sample_inputs(seed=0)
    want = tests.OP(*args)
    calls = []
    real = inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda *a, **k: calls.append(a) or real(*a, **k))
    got = tests.OP(*args)
    assert calls == [], f"{name}: Function.apply bound forward's signature"
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_the_fast_apply_is_a_functions_apply(ops):
    silu = _function(ops, "silu")
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    y = silu.apply(x)
    assert type(y.grad_fn).__name__ == "SiluFunctionBackward"
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    torch.testing.assert_close(g, torch.func.grad(lambda t: torch.nn.functional.silu(t).sum())(x.detach()))
    # Under transforms the standard path: vmap, grad and jvp agree with PyTorch's op.
    batch = torch.randn(3, 5, dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(silu.apply)(batch), torch.nn.functional.silu(batch))
    _, tangent = torch.func.jvp(silu.apply, (batch,), (torch.ones_like(batch),))
    _, want = torch.func.jvp(torch.nn.functional.silu, (batch,), (torch.ones_like(batch),))
    torch.testing.assert_close(tangent, want)


def test_a_tensor_escaped_from_a_transform_is_taken_as_function_apply_takes_it(ops):
    """A tensor that leaks out of `grad` (a dead wrapper) gives what `Function.apply` gives."""
    silu = _function(ops, "silu")
    leaked = []
    torch.func.grad(lambda t: (leaked.append(t) or t).sum())(torch.randn(3, 4))
    standard = torch.autograd.Function.apply.__func__(silu, leaked[0])  # the apply it replaces
    torch.testing.assert_close(silu.apply(leaked[0]), standard)


# -- Note [small calls]: an op that is a short chain of PyTorch ops evaluates it for small inputs ---

F = torch.nn.functional
CHAINS = {
    "silu": (F.silu, ()),
    "sigmoid": (torch.sigmoid, ()),
    "softplus": (lambda x, beta: F.softplus(x, beta), (0.5,)),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), ()),
    "relu6": (F.relu6, ()),
    "softsign": (F.softsign, ()),
    "tanhshrink": (F.tanhshrink, ()),
    "selu": (F.selu, ()),
    "mish": (lambda x: x * torch.tanh(F.softplus(x)), ()),  # F.mish's own second derivative is NaN past 100
    "swish": (lambda x, beta: x * torch.sigmoid(beta * x), (1.5,)),
    "mul_constant": (lambda x, c: x * c, (-2.5,)),
}
SMALL = sorted(name for name in SPEC_NAMES if "native_below" in (ROOT / "generated" / "ops" / f"{name}.py").read_text())
EXTREME_POINTS = [-1e4, -100.0, -30.0, -3.0, -1e-6, 0.0, 1e-6, 3.0, 30.0, 100.0, 1e4]


@pytest.mark.parametrize("name", sorted(CHAINS))
@pytest.mark.parametrize("size", [5, 20000])
def test_an_op_that_is_a_chain_of_pytorch_ops_matches_them_below_and_above_the_threshold(ops, name, size):
    """Below `native_below` elements the functional evaluates PyTorch's ops (no Python autograd node),
    above it the Function; both give PyTorch's values, gradients, second derivatives and tangents."""
    function = _function(ops, name)
    native, extra = CHAINS[name]
    op = getattr(ops, name)
    assert function.native_below == 16384
    x = torch.linspace(-8, 8, size, dtype=torch.float64).requires_grad_()
    y = op(x, *extra)
    assert isinstance(y.grad_fn, function._backward_cls) == (size >= function.native_below)
    want = native(x, *extra)
    torch.testing.assert_close(y, want)
    v = torch.cos(torch.arange(size, dtype=torch.float64))
    (g,) = torch.autograd.grad(y, x, v, create_graph=True)
    (w,) = torch.autograd.grad(want, x, v, create_graph=True)
    torch.testing.assert_close(g, w)
    if w.requires_grad:
        torch.testing.assert_close(torch.autograd.grad(g.sum(), x)[0], torch.autograd.grad(w.sum(), x)[0])
    _, tangent = torch.func.jvp(lambda t: op(t, *extra), (x.detach(),), (v,))
    torch.testing.assert_close(tangent, torch.func.jvp(lambda t: native(t, *extra), (x.detach(),), (v,))[1])


def _all_orders(op, function, below, x, extra):
    """Values, first and second derivatives (of the sum) and a forward-mode tangent, with `native_below` at `below`."""
    function.native_below = below
    x = x.detach().requires_grad_()
    y = op(x, *extra)
    (first,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    second = torch.autograd.grad(first.sum(), x)[0] if first.requires_grad else torch.zeros_like(first)
    tangent = torch.func.jvp(lambda t: op(t, *extra), (x.detach(),), (torch.ones_like(x),))[1]
    grad = torch.func.grad(lambda t: op(t, *extra).sum())(x.detach())
    batched = torch.func.vmap(lambda t: op(t, *extra))(x.detach().reshape(-1, 1))
    return {"value": y, "first": first, "second": second, "jvp": tangent, "func.grad": grad, "vmap": batched.flatten()}


def assert_agree(small, full, what):
    assert torch.equal(torch.isfinite(small), torch.isfinite(full)), f"{what}: {small} vs {full}"
    torch.testing.assert_close(small, full, rtol=1e-4, atol=1e-6, equal_nan=True, msg=what)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", SMALL)
def test_the_small_path_is_the_function_at_extreme_inputs_to_second_order(ops, name, dtype, monkeypatch):
    """Every op with a small path: at +-1e4, +-100, +-1e-6, 0, ... its values, gradients, second
    derivatives, torch.func jvp, grad and vmap are the Function's (mish evaluates its formula, not F.mish,
    whose second derivative is NaN from x = 100 where the Function's is 0)."""
    function = _function(ops, name)
    monkeypatch.setattr(function, "native_below", function.native_below)
    op = getattr(ops, name)
    extra = {"softplus": (0.5,), "swish": (1.5,), "mul_constant": (-2.5,)}.get(name, ())
    x = torch.tensor(EXTREME_POINTS, dtype=dtype)
    small = _all_orders(op, function, 2**62, x, extra)
    assert not isinstance(op(x.requires_grad_(), *extra).grad_fn, function._backward_cls)
    full = _all_orders(op, function, 0, x, extra)
    for what in small:
        assert_agree(small[what], full[what], f"{name} {dtype} {what}")


@pytest.mark.parametrize("name", ["silu", "softplus", "relu6", "softsign", "swish"])
def test_small_calls_keep_the_call_time_errors(ops, name):
    op = getattr(ops, name)
    extra = CHAINS[name][1]
    with pytest.raises(TypeError, match=f"{name}\\(\\): argument 'x' must be a real Tensor"):
        op(torch.arange(4.0).to(torch.complex64), *extra)
    with pytest.raises(TypeError, match="must be a real Tensor"):
        op([1.0, 2.0], *extra)


NOT_CHAINS = ["hardsigmoid", "sinc", "safe_sqrt", "sign_ste", "huber", "softmax", "clip_grad"]


@pytest.mark.parametrize("name", NOT_CHAINS)
def test_an_op_that_is_not_a_short_chain_always_calls_its_function(ops, name):
    """Second derivatives PyTorch lacks (hardsigmoid), branches and guards, gradient
    overrides, two tensor inputs, named dimensions: the Function."""
    assert not hasattr(_function(ops, name), "native_below")
    assert "native_below" not in (ROOT / "generated" / "ops" / f"{name}.py").read_text()


# Unusual chains: which qualify (Note [small chains]), and those that do agree with their Function.
RULE_SPECS = {
    "power": "name: power\ninputs:\n  x: Tensor\noutputs:\n  y: x / (1 + x**2)**2\n",
    # Its first derivative is finite at 0, its second (autograd's, through `abs(x)**0.5`) is not.
    "half": "name: half\ninputs:\n  x: Tensor\noutputs:\n  y: x * abs(x)**1.5\n",
    "numbers": "name: numbers\ninputs:\n  x: Tensor\n  beta: float = 0.5\noutputs:\n  y: tanh(x) * exp(beta)\n",
    "logs": "name: logs\ninputs:\n  x: Tensor\noutputs:\n  y: log(1 + x**2)\n",
    "signed": "name: signed\ninputs:\n  x: Tensor\noutputs:\n  y: sign(x) * atan(x) + x\n",
    "root": "name: root\ninputs:\n  x: Tensor\noutputs:\n  y: sqrt(x**2 + 1)\n",
    "gauss": "name: gauss\ninputs:\n  x: Tensor\noutputs:\n  y: x * exp(-x**2)\n",
    "long": "name: long\ninputs:\n  x: Tensor\noutputs:\n  y: tanh(sin(cos(atan(x)))) + x\n",
    "branch": "name: branch\ninputs:\n  x: Tensor\noutputs:\n  y: where(x > 0, x**2, x)\n",
    "extremum": "name: extremum\ninputs:\n  x: Tensor\noutputs:\n  y: max(x, 0) * tanh(x)\n",
    "two": "name: two\ninputs:\n  x: Tensor\n  w: Tensor\noutputs:\n  y: x * tanh(w)\n",
    "overridden": "name: overridden\ninputs:\n  x: Tensor\noutputs:\n  y: tanh(x)\ngradients:\n  x: grad\n",
}
QUALIFY = {"power", "numbers", "logs", "signed"}


@pytest.fixture(scope="module")
def rule_ops(tmp_path_factory):
    from spec_ops import build_ops

    return build_ops(tmp_path_factory.mktemp("small_chains"), "small_chain_ops", RULE_SPECS)


@pytest.mark.parametrize("name", sorted(RULE_SPECS))
def test_which_chains_take_the_small_path(rule_ops, name):
    function = _function(rule_ops, name)
    assert hasattr(function, "native_below") == (name in QUALIFY)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(QUALIFY))
def test_unusual_chains_agree_with_their_function_at_extreme_inputs(rule_ops, name, dtype, monkeypatch):
    function = _function(rule_ops, name)
    monkeypatch.setattr(function, "native_below", function.native_below)
    op = getattr(rule_ops, name)
    x = torch.tensor(EXTREME_POINTS, dtype=dtype)
    small = _all_orders(op, function, 2**62, x, ())
    full = _all_orders(op, function, 0, x, ())
    for what in small:
        assert_agree(small[what], full[what], f"{name} {dtype} {what}")
