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


def _checked(name: str) -> list[int]:
    """The Tensor inputs (given in the samples) whose gradient opgen derives."""
    t = spec_tests(name)
    args = t.sample_inputs()
    checked = getattr(t, "GRADCHECKED", t.OP.checked)  # not through a stop-gradient (Note [stop-gradient])
    return [k for k in checked if args[k] is not None]


# A spec whose every gradient is an override has nothing derived to check in batches.
DERIVED = [name for name in SPEC_NAMES if _checked(name)]


@pytest.mark.parametrize("name", DERIVED)
def test_batched_gradcheck_of_every_spec(ops, name):
    """gradcheck(check_batched_grad=True): backward under `is_grads_batched` (mish and logsigmoid
    have in-place backward kernels: Note [in place under vmap])."""
    t = spec_tests(name)
    args = t.sample_inputs()
    positions = _checked(name)
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


# -- captured graphs: FX, export, TorchScript (Note [captured graphs keep the gradient]) ------------


def _fill(functional, args, tensors, values):
    full = list(args)
    for k, value in zip(tensors, values, strict=True):
        full[k] = value
    return functional(*full)


def _eager_and_captured(functional, args, capture):
    """(first output, gradients of every tensor input) eager, then through `capture(functional, args)`
    (a callable of the tensor arguments, the others fixed)."""
    tensors = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor)]
    results = []
    for f in (lambda *ts: _fill(functional, args, tensors, ts), capture(functional, args)):
        xs = [args[k].detach().clone().requires_grad_() for k in tensors]
        out = f(*xs)
        out = out[0] if isinstance(out, tuple | list) else out
        grads = torch.autograd.grad(out, xs, torch.ones_like(out), allow_unused=True, materialize_grads=True)
        results.append((out.detach(), grads))
    return results


def _assert_same(results) -> None:
    (want, want_grads), (got, got_grads) = results
    torch.testing.assert_close(got, want)
    for k, (g, w) in enumerate(zip(got_grads, want_grads, strict=True)):
        torch.testing.assert_close(g, w, msg=lambda m, k=k: f"gradient of tensor argument {k}: {m}")


def _fx(functional, args):
    import inspect

    params = list(inspect.signature(functional).parameters)
    concrete = {params[k]: a for k, a in enumerate(args) if not isinstance(a, torch.Tensor)}
    graph = torch.fx.symbolic_trace(functional, concrete_args=concrete)
    calls = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert calls[-1] is functional, calls  # one node, after the guards on the concrete arguments
    tensors = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor)]
    return lambda *ts: _fill(graph, args, tensors, ts)


def _input_sets(name: str):
    t = spec_tests(name)
    return [t.sample_inputs(), *([t.point_inputs()] if hasattr(t, "point_inputs") else [])]


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_fx_graph_of_every_spec_is_one_node_and_trains_as_eager(ops, name):
    """symbolic_trace passes the call-time checks, keeps the op as one node, and training the
    graph gives the eager gradients (for sign_ste, grad_reverse, ...: the override)."""
    for args in _input_sets(name):
        _assert_same(_eager_and_captured(spec_tests(name).OP.functional, args, _fx))


def _exported(functional, args, strict=False):
    tensors = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor)]

    class Call(torch.nn.Module):
        def forward(self, *ts):
            return _fill(functional, args, tensors, ts)

    return torch.export.export(Call(), tuple(args[k].detach() for k in tensors), strict=strict).module()


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_export_trains_as_eager(ops, name):
    """A non-strict exported graph (torch's default) trains with the eager gradients, at random inputs and
    at the spec's test points, gradient overrides and guarded branches included (the op becomes a custom
    op while exported); strict export of such an op refuses, naming the op and what works, and exports
    for inference under no_grad."""
    functional = spec_tests(name).OP.functional
    for args in _input_sets(name):
        _assert_same(_eager_and_captured(functional, args, _exported))
    keeps_backward = "exported(" in (ROOT / "generated" / "ops" / f"{name}.py").read_text(encoding="utf-8")
    has_overrides = "\ngradients:" in (SPECS / f"{name}.yaml").read_text(encoding="utf-8")
    assert keeps_backward or not has_overrides, "an op with gradient overrides exports its forward formula"
    if not keeps_backward:
        return
    args = _input_sets(name)[0]
    with pytest.raises(RuntimeError, match=f"{name}\\(\\): strict torch.export .* strict=False"):
        _exported(functional, args, strict=True)
    with torch.no_grad():
        graph = _exported(functional, args, strict=True)
        want = functional(*args)
        got = graph(*(a for a in args if isinstance(a, torch.Tensor)))
    torch.testing.assert_close(got, want)


def test_export_of_a_module_of_generated_ops(ops):
    """Strict and non-strict export of a small network; the graph trains as eager."""
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = ops.Linear(4, 8), ops.Linear(8, 2, bias=False)

        def forward(self, x):
            return ops.softplus(self.second(ops.gelu_tanh(self.first(x))))

    model = Net()
    x = torch.randn(5, 4)
    want = model(x)
    want.sum().backward()
    want_grads = [p.grad.clone() for p in model.parameters()]
    for strict in (False, True):
        graph = torch.export.export(model, (x,), strict=strict).module()
        model.zero_grad()
        got = graph(x)
        torch.testing.assert_close(got, want)
        if strict:  # strict export keeps no autograd graph of a custom Function: training fails loudly
            assert not got.requires_grad
            continue
        grads = torch.autograd.grad(got.sum(), list(graph.parameters()))
        for g, w in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("name", ["sign_ste", "grad_reverse", "safe_sqrt"])
def test_strict_export_refuses_too(ops, name):
    t = spec_tests(name)
    with pytest.raises(Exception, match="would drop"):
        _exported(t.OP.functional, t.sample_inputs(), strict=True)


def test_jit_trace_keeps_the_gradient_but_cannot_be_saved(ops, tmp_path):
    """What the README says of TorchScript: trace works in process (the op is one Python node,
    with its backward); saving and scripting do not."""
    x = torch.linspace(-2, 2, 9, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(ops.sign_ste, (x,))
    (got,) = torch.autograd.grad(traced(x).sum(), x)
    torch.testing.assert_close(got, (x.abs() <= 1).float())  # the override, not sign's zero
    with pytest.raises(RuntimeError, match="Could not export Python function"):
        torch.jit.save(traced, str(tmp_path / "op.pt"))
    with pytest.raises(Exception):  # noqa: B017  (TorchScript's error types vary)
        torch.jit.script(ops.sign_ste)


# -- autocast (Note [autocast] in opgen.emit.capture) ------------------------------------------------


def _autocast_step(f, args, enabled=True):
    """Forward under CPU bf16 autocast, backward after it: the output and each tensor's gradient."""
    xs = [a.detach().float().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
        out = f(*xs)
    if out.requires_grad:
        out.float().sum().backward()
    return out, [x.grad for x in xs if isinstance(x, torch.Tensor)]


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_bf16_autocast_training_step_of_every_spec(ops, name):
    """An op with `@` computes in bf16 as torch.matmul does (nn.Linear's dtypes), one that also
    multiplies tensors in float32 (F.bilinear, cdist); autocast leaves elementwise ops in float32,
    as PyTorch's. Every gradient has its
    input's dtype and, within bf16's precision, the float32 gradient of the plain formula."""
    t = spec_tests(name)
    args = t.sample_inputs()
    got, got_grads = _autocast_step(lambda *a: t.OP(*a)[0], args)
    want, want_grads = _autocast_step(lambda *a: t.reference(*a)[t.OP.outputs[0]], args, enabled=False)
    lowered = name in ("linear", "attention_scores")  # `@` as torch.matmul; bilinear, rbf_kernel in float32
    assert got.dtype == (torch.bfloat16 if lowered else torch.float32), got.dtype
    torch.testing.assert_close(got.float(), want.float().expand_as(got), rtol=0.05, atol=0.05)
    tensors = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor)]
    for k, g, w in zip(tensors, got_grads, want_grads, strict=True):
        if g is not None:
            assert g.dtype == torch.float32
        if k in t.OP.checked and w is not None:  # overrides are checked in float64 elsewhere
            finite = torch.isfinite(w)  # the plain formula's NaN where the op guards a `where`
            torch.testing.assert_close(g[finite], w[finite], rtol=0.05, atol=0.05)


@pytest.mark.parametrize("bias", [True, False])
def test_bf16_training_step_of_linear_and_bilinear_modules_as_torch_nn(ops, bias):
    torch.manual_seed(0)
    pairs = [
        (ops.Linear(4, 3, bias=bias), torch.nn.Linear(4, 3, bias=bias), (torch.randn(5, 4),)),
        (
            ops.Bilinear(4, 2, 3, bias=bias),
            torch.nn.Bilinear(4, 2, 3, bias=bias),
            (torch.randn(5, 4), torch.randn(5, 2)),
        ),
    ]
    for ours, theirs, inputs in pairs:
        ours.load_state_dict(theirs.state_dict())
        got, _ = _autocast_step(ours, inputs)
        want, _ = _autocast_step(theirs, inputs)
        # `@` runs in bf16 (as nn.Linear); nn.Bilinear runs in float32 under CPU autocast, and so does ours.
        assert got.dtype == want.dtype == (torch.bfloat16 if ours.__class__ is ops.Linear else torch.float32)
        torch.testing.assert_close(got.float(), want.float(), rtol=0.02, atol=0.05)
        for (k, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
            assert p.grad.dtype == q.grad.dtype == torch.float32, k
            torch.testing.assert_close(p.grad, q.grad, rtol=0.05, atol=0.05)


# -- dtypes and modes (Note [float inputs] in opgen.emit.capture) -----------------------------------


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_complex_and_non_tensor_inputs_are_type_errors_naming_the_argument(ops, name):
    """An integer tensor is promoted (tests/test_unusual_calls.py); a complex one or a number is refused."""
    t = spec_tests(name)
    base = t.sample_inputs()
    for k in t.OP.checked:
        if base[k] is None:
            continue
        for bad in (base[k].to(torch.complex128), 2.0):
            args = list(base)
            args[k] = bad
            with pytest.raises(TypeError, match=f"argument '{t.OP.inputs[k]}' must be a"):
                t.OP.functional(*args)


@pytest.mark.parametrize("name", SPEC_NAMES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_computes_in_its_dtype(ops, name, dtype):
    """Outputs and gradients have the inputs' dtype and the float64 values within its precision."""
    t = spec_tests(name)
    args = t.sample_inputs()
    low = [a.detach().to(dtype).requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    exact = [a.detach().to(dtype).double().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    got, want = t.OP(*low)[0], t.OP(*exact)[0]
    assert got.dtype == dtype
    scale = want.detach().abs().max().clamp(min=1)
    torch.testing.assert_close(got.double(), want.detach(), rtol=0.05, atol=0.02 * scale.item())
    if got.requires_grad:
        present = [k for k in t.OP.tensor_inputs if low[k] is not None]
        grads = torch.autograd.grad(got.sum(), [low[k] for k in present], allow_unused=True, materialize_grads=True)
        assert all(g.dtype == dtype for g in grads)


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_no_grad_and_inference_mode_record_nothing(ops, name):
    t = spec_tests(name)
    args = t.sample_inputs()
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            outs = t.OP(*args)
        # No graph (a view of an input, as `x.view_as(x)`, keeps PyTorch's requires_grad of views)
        assert all(o.grad_fn is None for o in outs)


def _strided(x: torch.Tensor, how: str) -> torch.Tensor:
    """The same values, not contiguous: transposed storage, a strided slice, or an expanded row."""
    if how == "transposed" and x.dim() >= 2:
        return x.detach().mT.contiguous().mT
    if how == "sliced":
        return torch.stack([x.detach(), torch.zeros_like(x)], dim=-1)[..., 0]
    if how == "expanded" and x.dim() >= 1:
        return x.detach()[:1].expand_as(x)
    return x.detach()


@pytest.mark.parametrize("name", SPEC_NAMES)
@pytest.mark.parametrize("how", ["transposed", "sliced", "expanded"])
def test_non_contiguous_and_expanded_inputs(ops, name, how):
    t = spec_tests(name)
    args = t.sample_inputs()
    strided = [_strided(a, how) if isinstance(a, torch.Tensor) else a for a in args]
    dense = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in strided]
    results = []
    for given in (strided, dense):
        xs = [a.requires_grad_() if isinstance(a, torch.Tensor) else a for a in given]
        out = t.OP(*xs)[0]
        tensors = [a for a in xs if isinstance(a, torch.Tensor)]
        grads = torch.autograd.grad(out.sum(), tensors, allow_unused=True, materialize_grads=True)
        results.append((out.detach(), grads))
    (got, got_grads), (want, want_grads) = results
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)


# -- Modules as drop-ins for torch.nn's ---------------------------------------------------------------


@pytest.mark.parametrize("shape", [[5, 4], [2, 5, 4], [3, 2, 5, 4], [1, 4]])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_takes_leading_batch_dimensions_as_nn_linear(ops, shape, bias):
    torch.manual_seed(0)
    ours, theirs = ops.Linear(4, 3, bias=bias).double(), torch.nn.Linear(4, 3, bias=bias).double()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(shape, dtype=torch.float64)
    for m in (ours, theirs):
        m.zero_grad()
        m(x).square().sum().backward()
    torch.testing.assert_close(ours(x), theirs(x))
    for (k, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("batch", [[5], [2, 5], [3, 2, 5], [1], [2, 1]])
@pytest.mark.parametrize("bias", [True, False])
def test_bilinear_takes_leading_batch_dimensions_as_nn_bilinear(ops, batch, bias):
    """Values, the inputs' and the parameters' gradients, forward mode and vmap, as nn.Bilinear's."""
    torch.manual_seed(0)
    ours, theirs = ops.Bilinear(4, 2, 3, bias=bias).double(), torch.nn.Bilinear(4, 2, 3, bias=bias).double()
    theirs.load_state_dict(ours.state_dict())
    x1, x2 = (torch.randn([*batch, n], dtype=torch.float64, requires_grad=True) for n in (4, 2))
    results = []
    for m in (ours, theirs):
        m.zero_grad()
        y = m(x1, x2)
        y.square().sum().backward()
        tangents = (torch.ones_like(x1), torch.linspace(-1, 1, x2.numel(), dtype=torch.float64).view_as(x2))
        jvp = torch.func.jvp(m, (x1.detach(), x2.detach()), tangents)[1]
        mapped = vmap(m)(x1.detach().unsqueeze(0).expand(2, *x1.shape), x2.detach().unsqueeze(0).expand(2, *x2.shape))
        grads = {"x1": x1.grad, "x2": x2.grad} | {k: p.grad for k, p in m.named_parameters()}
        results.append((y, jvp, mapped, grads))
        x1.grad = x2.grad = None
    for what, got, want in zip(["output", "jvp", "vmap", "gradients"], *results, strict=True):
        torch.testing.assert_close(got, want, msg=lambda m, what=what: f"{what}: {m}")


def _modules(ops):
    torch.manual_seed(0)
    return [
        (ops.Linear(4, 3), (torch.randn(2, 5, 4),)),
        (ops.Linear(4, 3, bias=False), (torch.randn(5, 4),)),
        (ops.Bilinear(4, 2, 3), (torch.randn(5, 4), torch.randn(5, 2))),
        (ops.Affine(4), (torch.randn(5, 4),)),
        (ops.ScaledWeight(4), (torch.randn(5, 4),)),
    ]


def _grads(module, inputs):
    module.zero_grad()
    out = module(*inputs)
    out.square().sum().backward()
    return out.detach(), {k: p.grad.clone() for k, p in module.named_parameters()}


def test_modules_state_dict_deepcopy_pickle_to_dtype_and_checkpoint(ops):
    import copy
    import pickle

    from torch.utils.checkpoint import checkpoint

    for module, inputs in _modules(ops):
        kind = type(module).__name__
        want, want_grads = _grads(module, inputs)
        fresh = copy.deepcopy(module)
        for p in fresh.parameters():
            torch.nn.init.zeros_(p)
        fresh.load_state_dict(module.state_dict())
        for other in (fresh, copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
            got, got_grads = _grads(other, inputs)
            torch.testing.assert_close(got, want, msg=lambda m, c=kind: f"{c}: {m}")
            for k in want_grads:
                torch.testing.assert_close(got_grads[k], want_grads[k])
        double = copy.deepcopy(module).to(torch.float64)
        assert all(p.dtype == torch.float64 for p in double.parameters())
        got, _ = _grads(double, [x.double() for x in inputs])
        torch.testing.assert_close(got, want.double(), rtol=1e-5, atol=1e-5)
        xs = [x.clone().requires_grad_() for x in inputs]
        module.zero_grad()
        checkpoint(module, *xs, use_reentrant=False).square().sum().backward()
        for k, p in module.named_parameters():
            torch.testing.assert_close(p.grad, want_grads[k], msg=lambda m, k=k, c=kind: f"{c}.{k}: {m}")


DDP_SCRIPT = """
import os, socket, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import generated as ops

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(ops.Linear(4, 8), ops.Affine(8), ops.Linear(8, 2))

def run(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=__import__("datetime").timedelta(seconds=60))
    net = torch.nn.parallel.DistributedDataParallel(model())
    x = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(1))
    ops.mish(net(x[3 * rank : 3 * rank + 3])).square().mean().backward()
    if rank == 0:
        torch.save({k: p.grad for k, p in net.module.named_parameters()}, out)
    dist.barrier()
    dist.destroy_process_group()
    # every step above is done; the interpreter's own shutdown with gloo loaded can abort
    # ("terminate called without an active exception", about one run in ten on a busy machine)
    os._exit(0)

if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(port, sys.argv[1]), nprocs=2)
"""


def test_ddp_with_gloo_on_two_processes_gives_one_process_gradients(ops, tmp_path):
    import os
    import subprocess
    import sys

    script, out = tmp_path / "ddp.py", tmp_path / "grads.pt"
    script.write_text(DDP_SCRIPT, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=180, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    got = torch.load(out)
    torch.manual_seed(0)
    net = torch.nn.Sequential(ops.Linear(4, 8), ops.Affine(8), ops.Linear(8, 2))
    x = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(1))
    # DDP averages the two halves' gradients: the mean over each half, averaged = the mean over all
    ops.mish(net(x)).square().mean().backward()
    for k, p in net.named_parameters():
        torch.testing.assert_close(got[k], p.grad, msg=lambda m, k=k: f"{k}: {m}")
