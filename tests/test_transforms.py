"""Generated ops under the transforms users put them in: vmap, per-sample gradients, FX and
export, autocast, other dtypes and grad modes, and their Modules as drop-ins for torch.nn's.

References are independent: a Python loop over the batch, PyTorch's native op, the eager op
(for a captured graph), float64.
"""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch
from conftest import ROOT, SPECS, import_package
from torch.func import functional_call, grad, jacrev, vmap

SPEC_NAMES = sorted(p.stem for p in SPECS.glob("*.yaml"))
B = 3  # the batch vmap maps over


@pytest.fixture(scope="module")
def ops():
    return import_package(ROOT, "generated")


def spec_tests(name: str):
    """The generated tests module of a spec: its `OP` and `sample_inputs`."""
    return importlib.import_module(f"generated.tests.test_{name}")


def _batched_calls(name: str):
    """(`f`, batched arguments, per-sample arguments) for each choice of batched tensor inputs:
    every present tensor input alone, and all of them together."""
    t = spec_tests(name)
    samples = [t.sample_inputs(seed=s) for s in range(B)]
    base = samples[0]
    present = [k for k in t.OP.tensor_inputs if base[k] is not None]
    for which in [[k] for k in present] + ([present] if len(present) > 1 else []):

        def f(*tensors, which=which):
            args = list(base)
            for k, tensor in zip(which, tensors, strict=True):
                args[k] = tensor
            return t.OP(*args)[0]  # the first output

        yield which, f, samples


def _assert_close_rows(got: torch.Tensor, rows: list[torch.Tensor], what: str) -> None:
    torch.testing.assert_close(got, torch.stack(rows), msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_vmap_of_every_spec_equals_a_python_loop(ops, name):
    """vmap of the functional (batch dimension first, and last) and of its `grad`, each tensor
    input batched alone and all together, against a loop over the samples."""
    for which, f, samples in _batched_calls(name):
        stacked = [torch.stack([s[k] for s in samples]) for k in which]
        expected = [f(*(s[k] for k in which)) for s in samples]
        _assert_close_rows(vmap(f)(*stacked), expected, f"vmap over {which}")
        last = [x.movedim(0, -1) for x in stacked]
        _assert_close_rows(vmap(f, in_dims=-1)(*last), expected, f"vmap over {which}, in_dims=-1")

        def total(*tensors, f=f):
            return f(*tensors).sum()

        argnums = tuple(range(len(which)))
        got = vmap(grad(total, argnums=argnums))(*stacked)
        for b, sample in enumerate(samples):
            xs = [sample[k].clone().requires_grad_() for k in which]
            want = torch.autograd.grad(total(*xs), xs, allow_unused=True, materialize_grads=True)
            for j in argnums:
                torch.testing.assert_close(got[j][b], want[j], msg=lambda m, n=which[j]: f"vmap(grad) in {n}: {m}")


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_batched_gradcheck_of_every_spec(ops, name):
    """gradcheck(check_batched_grad=True): backward under `is_grads_batched` (mish and logsigmoid
    have in-place backward kernels: Note [in place under vmap])."""
    t = spec_tests(name)
    args = t.sample_inputs()
    positions = [k for k in t.OP.checked if args[k] is not None]
    if not positions:
        pytest.skip("no input has a derived gradient")
    fixed = [a.detach() if isinstance(a, torch.Tensor) and k not in positions else a for k, a in enumerate(args)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no batching rule for aten::...": a slower fallback
        assert torch.autograd.gradcheck(*t.harness.only(t.OP, fixed, positions), check_batched_grad=True)


@pytest.mark.parametrize(("name", "native"), [("mish", "mish"), ("logsigmoid", "logsigmoid")])
def test_jacrev_of_in_place_backward_kernels_equals_native(ops, name, native):
    """jacrev maps backward over batched cotangents with the input unbatched."""
    x = torch.linspace(-4, 4, 7, dtype=torch.float64)
    got = jacrev(getattr(ops, name))(x)
    torch.testing.assert_close(got, jacrev(getattr(torch.nn.functional, native))(x))


@pytest.mark.parametrize(("name", "native"), [("mish", "mish"), ("logsigmoid", "logsigmoid")])
def test_vmap_over_autograd_grad_with_batched_cotangents(ops, name, native):
    """Backward runs under torch.func.vmap with the saved input unbatched and grad mode off."""
    x = torch.linspace(-4, 4, 7, dtype=torch.float64, requires_grad=True)
    cotangents = torch.randn(B, 7, dtype=torch.float64)

    def vjps(f):
        y = f(x)
        return vmap(lambda v: torch.autograd.grad(y, x, v, retain_graph=True)[0])(cotangents)

    torch.testing.assert_close(vjps(getattr(ops, name)), vjps(getattr(torch.nn.functional, native)))


def _per_sample_grads(module: torch.nn.Module, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    params = {k: v.detach() for k, v in module.named_parameters()}

    def loss(p, *sample):
        batch = tuple(s.unsqueeze(0) for s in sample)
        return functional_call(module, p, batch).square().sum()

    return vmap(grad(loss), in_dims=(None, *(0 for _ in inputs)))(params, *inputs)


def _looped_grads(module: torch.nn.Module, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    rows = []
    for b in range(inputs[0].shape[0]):
        module.zero_grad()
        module(*(x[b : b + 1] for x in inputs)).square().sum().backward()
        rows.append({k: v.grad.clone() for k, v in module.named_parameters()})
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


def test_per_sample_gradients_of_modules_through_functional_call(ops):
    torch.manual_seed(0)
    d = torch.float64
    cases = [
        (ops.Linear(4, 3).to(d), (torch.randn(5, 4, dtype=d),)),
        (ops.Linear(4, 3, bias=False).to(d), (torch.randn(5, 4, dtype=d),)),
        (ops.Affine(4).to(d), (torch.randn(5, 4, dtype=d),)),
        (ops.Bilinear(4, 2, 3).to(d), (torch.randn(5, 4, dtype=d), torch.randn(5, 2, dtype=d))),
    ]
    for module, inputs in cases:
        kind = type(module).__name__
        got = _per_sample_grads(module, *inputs)
        want = _looped_grads(module, *inputs)
        assert got.keys() == want.keys()
        for k in got:
            torch.testing.assert_close(got[k], want[k], msg=lambda m, k=k, c=kind: f"{c}.{k}: {m}")
