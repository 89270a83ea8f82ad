"""torch.func over every spec in `specs/`: `jacfwd`, `jacrev` and `hessian` of the op against plain
autograd of its reference formula (the generated tests' `reference`, plain torch), in float64.

Each spec is called with its generated tests' sample inputs. Derived inputs are compared with the
reference's Jacobian and Hessian (`torch.autograd.functional`); overridden inputs, whose gradient is
meant to differ from the formula's, with each other: `jacfwd` (the op's `jvp`) equals `jacrev` (its
backward), as Note [jvp of an override] promises. `torch.func.jvp` and `vmap` of the op and of its
`grad` are in `tests/test_forward_mode.py` and `tests/test_transforms.py`.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import GENERATED, ROOT, SPECS, import_package

SPEC_NAMES = sorted(p.stem for p in SPECS.glob("*.yaml"))
# Forward mode along these inputs is refused (tests/test_forward_mode.py checks the message).
REFUSED = {"clip_grad": {"x"}}


def _golden():
    module = sys.modules.get("generated")
    if module is None or Path(module.__file__ or "").resolve().parent != GENERATED:
        module = import_package(ROOT, "generated")
    return module


def _case(name: str):
    _golden()
    tests = importlib.import_module(f"generated.tests.test_{name}")
    overridden = set(yaml.safe_load((SPECS / f"{name}.yaml").read_text()).get("gradients") or {})
    args = [a.detach() if isinstance(a, torch.Tensor) else a for a in tests.sample_inputs()]
    present = [k for k in tests.OP.tensor_inputs if args[k] is not None]
    derived = [k for k in present if tests.OP.inputs[k] not in overridden]
    return tests, tests.OP, args, present, derived


def _of(fn, args, positions, outputs):
    """`fn` as a function of the tensors at `positions`, returning the `outputs` (by position)."""

    def call(*tensors):
        full = list(args)
        for k, tensor in zip(positions, tensors, strict=True):
            full[k] = tensor
        outs = fn(*full)
        return tuple(outs[k] for k in outputs)

    return call


def _reference(tests, op):
    return lambda *a: tuple(tests.reference(*a)[name] for name in op.outputs)


def _weights(outs):
    generator = torch.Generator().manual_seed(7)
    return [torch.rand(o.shape, generator=generator, dtype=o.dtype) * 2 - 1 for o in outs]


def _loss(fn, weights):
    return lambda *xs: sum((o * w).sum() for o, w in zip(fn(*xs), weights, strict=True))


def _assert_close_jacobians(got, want, what: str) -> None:
    """Block by block; where the reference is not finite (autograd of a `where` branch not taken, as
    in `safe_sqrt`), the op must be finite (as the generated tests' `check_gradient`)."""
    for j, (row_got, row_want) in enumerate(zip(got, want, strict=True)):
        for k, (a, b) in enumerate(zip(row_got, row_want, strict=True)):
            b = b.expand_as(a)
            naive = ~torch.isfinite(b)
            assert torch.isfinite(a[naive]).all(), f"{what}[{j}][{k}] is not finite"
            torch.testing.assert_close(a[~naive], b[~naive], msg=lambda m, j=j, k=k: f"{what}[{j}][{k}]: {m}")


def _forward(op, present, name):
    return [k for k in present if op.inputs[k] not in REFUSED.get(name, set())]


def _weighted_loss(name: str):
    """`_case(name)`, the inputs forward mode takes, their values, and a random weighted sum of the
    differentiable outputs as a function of them."""
    tests, op, args, present, derived = _case(name)
    outputs = list(op.differentiable)
    forward = _forward(op, present, name)
    primals = tuple(args[k] for k in forward)
    weights = _weights(_of(op, args, forward, outputs)(*primals))
    loss = _loss(_of(op, args, forward, outputs), weights)
    return tests, op, args, present, derived, forward, primals, weights, loss


# Specs with an input along which forward mode is not refused (every spec but clip_grad).
FORWARD = [name for name in SPEC_NAMES if _forward(_case(name)[1], _case(name)[3], name)]


@pytest.mark.parametrize("name", FORWARD)
def test_jacfwd_and_jacrev_equal_the_reference_jacobian(name: str) -> None:
    tests, op, args, present, derived = _case(name)
    outputs = list(op.differentiable)
    forward = _forward(op, present, name)
    argnums = tuple(range(len(forward)))
    fn = _of(op, args, forward, outputs)
    primals = [args[k] for k in forward]
    jf = torch.func.jacfwd(fn, argnums=argnums)(*primals)
    jr = torch.func.jacrev(fn, argnums=argnums)(*primals)
    _assert_close_jacobians(jf, jr, f"{name}: jacfwd against jacrev")  # overridden inputs too
    if not derived:
        return
    ref = _of(_reference(tests, op), args, derived, outputs)
    want = torch.autograd.functional.jacobian(ref, tuple(args[k] for k in derived))
    rows = [k for k, i in enumerate(forward) if i in derived]
    got = [[row[k] for k in rows] for row in jr]
    _assert_close_jacobians(got, want, f"{name}: jacrev against the reference")


@pytest.mark.parametrize("name", FORWARD)
def test_hessian_equals_reverse_over_reverse_and_the_reference(name: str) -> None:
    """`torch.func.hessian` (forward over reverse, vmapped) of a weighted sum of the outputs, against
    reverse over reverse of the op itself (every input forward mode takes, overridden ones too) and,
    in the derived inputs, of the reference."""
    tests, op, args, _, derived, forward, primals, weights, loss = _weighted_loss(name)
    got = torch.func.hessian(loss, argnums=tuple(range(len(forward))))(*primals)
    _assert_close_jacobians(got, torch.autograd.functional.hessian(loss, primals), f"{name}: hessian against the op's")
    if not derived:
        return
    rows = [k for k, i in enumerate(forward) if i in derived]
    got = [[got[j][k] for k in rows] for j in rows]
    ref = _loss(_of(_reference(tests, op), args, derived, list(op.differentiable)), weights)
    want = torch.autograd.functional.hessian(ref, tuple(args[k] for k in derived))
    _assert_close_jacobians(got, want, f"{name}: hessian against the reference")


# Forward mode inside forward mode (Note [forward mode in forward mode] in opgen/runtime/machinery.py).
# Ops whose gradient is not their forward formula's refuse it; ops whose forward calls a PyTorch kernel
# without forward-over-forward support get PyTorch's own refusal (F.glu, F.hardsigmoid, F.huber_loss
# refuse it alike); layer_norm's forward, torch.native_layer_norm, gives what F.layer_norm gives.
NESTED_REFUSED = {"clip_grad", "grad_reverse", "quantize_ste", "round_ste", "safe_sqrt", "sign_ste", "sinc", "spike"}
NESTED_TORCH_REFUSES = {"glu", "hardsigmoid", "huber"}
NESTED_AS_TORCH = {"layer_norm"}


@pytest.mark.parametrize("name", FORWARD)
def test_forward_over_forward_is_right_or_refused(name: str) -> None:
    """`jacfwd(jacfwd(f))` through an autograd.Function is silently 0 in PyTorch; the functional runs
    its forward formula there instead, so the second derivative is the reference's, or it refuses."""
    *_, primals, weights, loss = _weighted_loss(name)
    nested = torch.func.jacfwd(torch.func.jacfwd(loss, argnums=0), argnums=0)
    if name in NESTED_REFUSED:
        with pytest.raises(NotImplementedError, match=rf"{name}: forward mode inside forward mode .* jacfwd\(jacrev"):
            nested(*primals)
        return
    if name in NESTED_TORCH_REFUSES:
        with pytest.raises(NotImplementedError, match="forward AD"):
            nested(*primals)
        return
    got = nested(*primals)
    if name in NESTED_AS_TORCH:
        x, weight, *rest = primals
        bias = rest[0] if rest else None
        native = _loss(lambda x: (torch.nn.functional.layer_norm(x, weight.shape, weight, bias),), weights)
        want = torch.func.jacfwd(torch.func.jacfwd(native))(x)
        torch.testing.assert_close(got, want)
        return
    want = torch.autograd.functional.hessian(loss, primals)[0][0]
    _assert_close_jacobians([[got]], [[want]], f"{name}: jacfwd(jacfwd) against reverse over reverse")
