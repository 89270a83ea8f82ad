"""Every generated op called the way PyTorch code calls ops: other dtypes, mixed dtypes, strided,
expanded, empty and 0-dim inputs, and autograd contexts, on both sides of the small-call threshold
(Note [small calls]). Each result is compared with plain torch autograd of the spec's formula
(the generated tests' `reference`), evaluated in float64 on the same values."""

from __future__ import annotations

import copy
import importlib
import inspect
import io
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from conftest import ROOT, SPECS, import_package

NAMES = sorted(p.stem for p in SPECS.glob("*.yaml"))
F64 = torch.float64
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 8e-2, F64: 1e-7}
# The ops whose forward is a PyTorch op that refuses mixed dtypes: `@` (torch.matmul) and the native
# layer norm; the others compute in the promoted dtype (Note [mixed dtypes]).
REFUSE_MIXED = {
    "attention_scores": "same dtype|scalar type",
    "bilinear": "same dtype|scalar type",
    "linear": "same dtype|scalar type",
    "rbf_kernel": "same dtype|scalar type",
    "layer_norm": "mixed dtype",
    "barlow_twins": "same dtype|scalar type",  # `@`, as torch.matmul
}


@pytest.fixture(scope="module")
def ops():
    return import_package(ROOT, "generated")


def _tests(name: str) -> Any:
    return importlib.import_module(f"generated.tests.test_{name}")


@pytest.fixture(params=["function", "small call"])
def side(request, ops, monkeypatch):
    """Both sides of the small-call threshold, for the ops that have one."""
    for name in NAMES:
        module = getattr(ops.ops, name)
        function = next(
            v
            for k, v in vars(module).items()
            if k.endswith("Function") and not k.startswith("_") and v.__module__ == module.__name__
        )
        if hasattr(function, "native_below"):
            monkeypatch.setattr(function, "native_below", 0 if request.param == "function" else 2**62)
    return request.param


def _as(args: list[Any], make: Callable[[torch.Tensor], torch.Tensor], which: set[int] | None = None) -> list[Any]:
    """`args` with each tensor (at `which`, default all) remade by `make` as a leaf requiring grad."""
    return [
        make(a.detach()).requires_grad_() if torch.is_tensor(a) and (which is None or k in which) else a
        for k, a in enumerate(args)
    ]


def _compare(tests: Any, args: list[Any], op: Any = None) -> None:
    """Values in the promoted dtype and gradients in each input's, equal to the float64 reference's
    (`op`: the op as called, by default the generated functional)."""
    op = op or tests.OP
    outs = op(*args)
    tensors = [a for a in args if torch.is_tensor(a)]
    dtype = tensors[0].dtype
    for tensor in tensors[1:]:
        dtype = torch.promote_types(dtype, tensor.dtype)
    tol = TOLERANCE[dtype]
    wide = [a.detach().to(F64).requires_grad_() if torch.is_tensor(a) else a for a in args]
    values = tests.reference(*wide)
    for k, name in enumerate(op.outputs):
        out = outs[k]
        if k in op.differentiable:
            assert out.dtype == dtype, f"{name}: {out.dtype}, expected {dtype}"
        want = values[name].detach().to(F64).expand_as(out)
        torch.testing.assert_close(out.detach().to(F64), want, rtol=tol, atol=tol, equal_nan=True)
    present = [k for k in op.present(args) if args[k].requires_grad]
    if not present or not any(outs[k].requires_grad for k in op.differentiable):
        return
    generator = torch.Generator().manual_seed(1)
    grads_out = [torch.randn(outs[k].shape, generator=generator, dtype=F64) for k in op.differentiable]
    got = torch.autograd.grad(
        [outs[k] for k in op.differentiable],
        [args[k] for k in present],
        [g.to(outs[k].dtype) for g, k in zip(grads_out, op.differentiable, strict=True)],
        allow_unused=True,
        materialize_grads=True,
    )
    expected = tests.harness.expected_gradients(tests.OP, wide, tests.reference, grads_out)
    for k, grad in zip(present, got, strict=True):
        assert grad.dtype == args[k].dtype and grad.shape == args[k].shape, op.inputs[k]
        finite = torch.isfinite(expected[k])
        assert torch.isfinite(grad.to(F64)[finite]).all(), f"gradient of {op.inputs[k]} is not finite"
        torch.testing.assert_close(grad.to(F64)[finite], expected[k][finite], rtol=10 * tol, atol=10 * tol)


def _strided(a: torch.Tensor) -> torch.Tensor:
    base = torch.zeros(*a.shape, 2, dtype=a.dtype)
    base[..., 0] = a
    return base[..., 0]  # a leaf view once it requires grad


def _transposed(a: torch.Tensor) -> torch.Tensor:
    return a.mT.contiguous().mT if a.dim() >= 2 else _strided(a)


def _expanded(a: torch.Tensor) -> torch.Tensor:
    return a[..., :1].clone().expand(a.shape) if a.dim() else a.clone()


def _calls(tests: Any) -> Iterator[tuple[str, list[Any]]]:
    args = tests.sample_inputs()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        yield f"{dtype}", _as(args, lambda a, dtype=dtype: a.to(dtype))
    for label, make in (("strided", _strided), ("transposed", _transposed), ("expanded", _expanded)):
        yield label, _as(args, make)
    shapes: dict[str, list[int]] = getattr(tests, "BATCHED_SHAPES", tests.SHAPES)
    batched = [k for k, v in shapes.items() if len(v) > len(tests.SHAPES[k])]
    if len(shapes) == 1:  # elementwise or over the last dimension: any leading dimensions
        ((key, shape),) = shapes.items()
        batched = [key]
        yield "0-dim", tests.sample_inputs({key: []}) if len(shape) < 2 else args
        four = tests.sample_inputs({key: [2, 3, 5, 4]})
        yield "channels_last", _as(four, lambda a: a.to(memory_format=torch.channels_last))
    for size in (0, 20000):  # empty, and a large batch of small rows
        yield (
            f"batch {size}",
            tests.sample_inputs({k: [size, *v[1:]] if k in batched else v for k, v in shapes.items()}),
        )


@pytest.mark.parametrize("name", NAMES)
def test_dtypes_and_layouts_match_the_formula(ops, side, name):
    tests = _tests(name)
    for label, args in _calls(tests):
        try:
            _compare(tests, args)
        except AssertionError as error:
            raise AssertionError(f"{name}, {label}, {side}: {error}") from None


def _floating(name: str) -> list[int]:
    """The positions of the floating inputs a gradient flows to, in the op's sample call."""
    tests = _tests(name)
    return [k for k in tests.OP.present(tests.sample_inputs()) if k in tests.OP.checked]


MIXED = [name for name in NAMES if len(_floating(name)) >= 2]  # the ops that take two floating tensors


@pytest.mark.parametrize("name", MIXED)
def test_mixed_dtypes_promote_as_pytorch(ops, side, name):
    """float32 beside float64: the promoted dtype and the formula's values, each gradient in its input's
    dtype; or, where PyTorch's own op refuses the mix, its error."""
    tests = _tests(name)
    args = tests.sample_inputs()
    floats = _floating(name)
    for which in ({floats[0]}, set(floats[1:])):
        mixed = _as(args, lambda a: a.float(), which)
        if name in REFUSE_MIXED:
            with pytest.raises(RuntimeError, match=REFUSE_MIXED[name]):
                tests.OP(*mixed)
            if hasattr(tests, "native"):
                with pytest.raises(RuntimeError, match=REFUSE_MIXED[name]):
                    tests.native(*mixed)
        else:
            _compare(tests, mixed)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_integer_and_bool_inputs_are_promoted_as_pytorch_promotes_them(ops, side, dtype):
    """An integer or bool tensor a gradient could flow to computes as the floating dtype the other
    inputs promote to (the default dtype when none is floating), as `torch.tanh(torch.arange(3))` does;
    the values equal the float64 reference's at the same (integer) points."""
    for name in NAMES:
        tests = _tests(name)
        args = [a.detach() if torch.is_tensor(a) else a for a in tests.sample_inputs()]
        k = tests.OP.checked[0] if tests.OP.checked else tests.OP.tensor_inputs[0]
        args[k] = (args[k] * 3).round().to(dtype)
        floats = [a.dtype for a in args if torch.is_tensor(a) and a.is_floating_point()]
        expected_dtype = floats[0] if floats else torch.get_default_dtype()
        for other in floats[1:]:
            expected_dtype = torch.promote_types(expected_dtype, other)
        outs = tests.OP(*args)
        values = tests.reference(*[a.to(F64) if torch.is_tensor(a) and i == k else a for i, a in enumerate(args)])
        for j in tests.OP.differentiable:
            out = outs[j]
            assert out.dtype == expected_dtype, f"{name}: {out.dtype}, expected {expected_dtype}"
            want = values[tests.OP.outputs[j]].detach().to(F64).expand_as(out)
            tol = TOLERANCE[expected_dtype]
            torch.testing.assert_close(out.to(F64), want, rtol=tol, atol=tol, equal_nan=True, msg=name)


def _grads(out: torch.Tensor, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(out, inputs, retain_graph=True, allow_unused=True, materialize_grads=True)


def _contexts(tests: Any) -> Iterator[tuple[str, Callable[[], None]]]:
    op, reference = tests.OP, tests.reference

    def fresh(requires_grad: bool = True) -> list[Any]:
        return [a.detach().clone().requires_grad_(requires_grad) if torch.is_tensor(a) else a for a in base]

    def value(args: list[Any]) -> torch.Tensor:
        return reference(*[a.detach() if torch.is_tensor(a) else a for a in args])[op.outputs[0]]

    base = tests.sample_inputs()
    present = op.present(base)

    def no_grad() -> None:
        args = fresh()
        with torch.no_grad():
            out = op(*args)[0]
        assert out.grad_fn is None
        torch.testing.assert_close(out, value(args).expand_as(out))

    def inference_mode() -> None:
        with torch.inference_mode():
            args = fresh(False)
            out = op(*args)[0]
        assert out.is_inference()
        torch.testing.assert_close(out, value(args).expand_as(out))

    def some_inputs_require_grad() -> None:
        for k in present:
            args = fresh(False)
            args[k].requires_grad_()
            _compare(tests, args)

    def twice_with_retain_graph() -> None:
        args = fresh()
        out = op(*args)[0]
        if not out.requires_grad:
            return
        inputs = [args[k] for k in present]
        first = torch.autograd.grad(out.sum(), inputs, retain_graph=True, allow_unused=True, materialize_grads=True)
        unused = torch.zeros(2, dtype=F64, requires_grad=True)
        assert torch.autograd.grad(out.sum(), [inputs[0], unused], allow_unused=True, retain_graph=True)[1] is None
        out.sum().backward(retain_graph=True)
        out.sum().backward()
        for k, grad in zip(present, first, strict=True):
            if args[k].grad is not None:
                torch.testing.assert_close(args[k].grad, 2 * grad)

    def double_backward() -> None:
        args, wide = fresh(), fresh()
        outs, values = op(*args), reference(*wide)
        checked = [k for k in present if k in op.checked]
        for k in checked:
            # An input read only through a stop-gradient (Note [stop-gradient]) is unused: its gradient is zero.
            unused = dict(allow_unused=True, materialize_grads=True)
            got = torch.autograd.grad(outs[0].sum(), args[k], create_graph=True, retain_graph=True, **unused)[0]
            want = torch.autograd.grad(
                values[op.outputs[0]].sum(), wide[k], create_graph=True, retain_graph=True, **unused
            )[0]
            if not (got.requires_grad and want.requires_grad):
                continue
            second = _grads(got.square().sum(), [args[j] for j in checked])
            expected = _grads(want.square().sum(), [wide[j] for j in checked])
            for a, b in zip(second, expected, strict=True):
                finite = torch.isfinite(b)
                torch.testing.assert_close(a[finite], b[finite])

    def autocast() -> None:
        args = _as(base, lambda a: a.float())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = op(*args)[0]
        assert out.dtype in (torch.float32, torch.bfloat16)
        if out.requires_grad:
            grads = torch.autograd.grad(
                out.float().sum(), [args[k] for k in present], allow_unused=True, materialize_grads=True
            )
            assert all(g.dtype == torch.float32 for g in grads)

    yield from {
        "no_grad": no_grad,
        "inference_mode": inference_mode,
        "some inputs require grad": some_inputs_require_grad,
        "backward twice": twice_with_retain_graph,
        "double backward": double_backward,
        "autocast": autocast,
    }.items()


@pytest.mark.parametrize("name", NAMES)
def test_autograd_contexts(ops, side, name):
    for label, check in _contexts(_tests(name)):
        try:
            check()
        except AssertionError as error:
            raise AssertionError(f"{name}, {label}, {side}: {error}") from None


@pytest.mark.parametrize("name", ["swish", "cross_entropy", "layer_norm"])
def test_compiled_with_dynamic_shapes(ops, name):
    tests = _tests(name)
    torch._dynamo.reset()
    compiled = torch.compile(tests.OP.functional, fullgraph=True, dynamic=True)
    shapes = getattr(tests, "BATCHED_SHAPES", tests.SHAPES)
    first = shapes[tests.OP.inputs[0]]
    op = tests.OP
    op = type(op)(
        compiled, op.inputs, op.outputs, op.tensor_inputs, op.checked, op.differentiable, op.scope, op.overrides
    )
    for rows in (3, 5):  # the first input's leading dimension, and every input's that shares it
        resized = {k: [rows, *v[1:]] if len(v) == len(first) and v[0] == first[0] else v for k, v in shapes.items()}
        _compare(tests, tests.sample_inputs(resized), op)


def _module(ops: Any, name: str) -> torch.nn.Module:
    cls = getattr(ops, name)
    required = [
        p.name
        for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
        if p.default is inspect.Parameter.empty
    ]
    return cls(**{p: 4 for p in required})


@pytest.mark.parametrize("name", ["Affine", "Bilinear", "LayerNorm", "Linear", "RMSNorm", "ScaledWeight", "Snake"])
def test_modules_as_pytorch_modules_are_used(ops, name):
    module = _module(ops, name)
    inputs = (torch.randn(3, 4),) * (2 if name == "Bilinear" else 1)
    out = module(*inputs)
    params = {k: v.detach().clone().requires_grad_() for k, v in module.named_parameters()}
    called = torch.func.functional_call(module, params, inputs)
    torch.testing.assert_close(called, out)
    assert all(g is not None for g in torch.autograd.grad(called.sum(), list(params.values())))
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        cast = copy.deepcopy(module).to(dtype)
        got = cast(*(x.to(dtype) for x in inputs))
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), out, atol=TOLERANCE[dtype] * 10, rtol=TOLERANCE[dtype] * 10)
        got.float().sum().backward()
        assert all(p.grad is not None and p.grad.dtype == dtype for p in cast.parameters())
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    loaded = _module(ops, name)
    loaded.load_state_dict(torch.load(buffer))
    for other in (loaded, copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        torch.testing.assert_close(other(*inputs), out)
