"""The `custom_op` form (`--form custom_op`, `form: custom_op`): every spec in `specs/` as a
torch.library custom op, against the default `Function` form (the golden `generated/`) and
torch.library's own checks (Note [custom_op form] in opgen/emit/custom_op.py)."""

from __future__ import annotations

import importlib
import shutil

import pytest
import torch
from conftest import ROOT, SPECS, SWISH, import_package

SPEC_NAMES = sorted(p.stem for p in SPECS.glob("*.yaml"))
PACKAGE = "cops"  # the package, and so the namespace, of the custom_op form


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """`specs/` generated once in the custom_op form, as `PACKAGE`."""
    from opgen.cli import main

    root = tmp_path_factory.mktemp("custom_op")
    assert main(["generate", str(SPECS), "-o", str(root / PACKAGE), "--form", "custom_op"]) == 0
    return root


@pytest.fixture(scope="module")
def cops(folder):
    return import_package(folder, PACKAGE)


@pytest.fixture(scope="module")
def golden():
    return import_package(ROOT, "generated")


def _tests(package, name: str):
    """The generated tests module of a spec in `package`: its `OP`, `sample_inputs` and tests."""
    return importlib.import_module(f"{package.__name__}.tests.test_{name}")


def _input_sets(t):
    sets = [t.sample_inputs()]
    if hasattr(t, "BROADCAST_SHAPES"):
        sets.append(t.sample_inputs(t.BROADCAST_SHAPES, seed=2))
    if hasattr(t, "point_inputs"):
        sets.append(t.point_inputs())
    return sets


def _outputs_and_grads(functional, args, op):
    """The outputs, and the gradients of every tensor input for fixed random cotangents."""
    xs = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    outs = functional(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    generator = torch.Generator().manual_seed(1)
    total = sum(
        (outs[k] * torch.randn(outs[k].shape, generator=generator, dtype=outs[k].dtype)).sum()
        for k in op.differentiable
    )
    tensors = [x for x in xs if isinstance(x, torch.Tensor)]
    grads = torch.autograd.grad(total, tensors, allow_unused=True, materialize_grads=True)
    return [o.detach() for o in outs], grads


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_opcheck_of_every_spec(cops, name):
    """The generated `test_opcheck` (sample, broadcast, batched and `None` inputs) passes, and the
    functional's outputs come from the custom op's autograd node."""
    t = _tests(cops, name)
    t.test_opcheck()
    args = t.sample_inputs()
    out = t.OP(*args)[t.OP.differentiable[0]] if t.OP.differentiable else None
    if out is not None and out.grad_fn is not None:
        node = type(out.grad_fn).__name__
        assert f"GeneratedBackwardFor_{PACKAGE}_{name}_default" in node or (
            hasattr(torch.ops.cops, f"{name}_for_backward") and f"{PACKAGE}_{name}_for_backward_default" in node
        )


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_the_schema_lists_the_spec_outputs_and_the_raw_op_trains(cops, golden, name):
    """`cops::name` returns the spec's outputs alone (residuals come from `cops::name_for_backward`, which
    the functional calls where a gradient will be needed, and only then); called directly with inputs
    that require grad it computes them again, with the Function form's gradients of every order."""
    t = _tests(cops, name)
    op = getattr(torch.ops.cops, name)
    returns = op.default._schema.returns
    assert len(returns) == len(t.OP.outputs), f"{name}: {op.default._schema}"
    args = [a.detach() if isinstance(a, torch.Tensor) else a for a in t.sample_inputs()]
    with torch.no_grad():
        graph = torch.export.export(_Call(t.OP.functional, args), _tensors(args)).graph
    called = {str(n.target) for n in graph.nodes if n.op == "call_function"}
    assert not any("_for_backward" in c for c in called), called
    positions = [k for k in getattr(t, "GRADCHECKED", t.OP.checked) if args[k] is not None]
    if not positions or not t.OP.differentiable:
        return
    call, inputs = t.harness.only(_Raw(op, t.OP), args, positions)
    assert torch.autograd.gradcheck(call, [x.requires_grad_() for x in inputs])
    if hasattr(_tests(golden, name), "test_gradgradcheck"):
        assert torch.autograd.gradgradcheck(call, inputs)


class _Raw:
    """The raw op called as the functional is, for `harness.only`: its outputs a tuple."""

    def __init__(self, op, tested):
        self.op, self.tested = op, tested

    def __getattr__(self, name):  # what the harness reads of the op under test: differentiable, ...
        return getattr(self.tested, name)

    def __call__(self, *args):
        out = self.op(*args)
        return out if isinstance(out, tuple) else (out,)


class _Call(torch.nn.Module):
    def __init__(self, functional, args):
        super().__init__()
        self.functional, self.args = functional, args

    def forward(self, *tensors):
        it = iter(tensors)
        return self.functional(*(next(it) if isinstance(a, torch.Tensor) else a for a in self.args))


def _tensors(args):
    return tuple(a for a in args if isinstance(a, torch.Tensor))


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_values_and_gradients_equal_the_function_form(cops, golden, name):
    t, want = _tests(cops, name), _tests(golden, name)
    for args in _input_sets(t):
        got_outs, got_grads = _outputs_and_grads(t.OP.functional, args, t.OP)
        want_outs, want_grads = _outputs_and_grads(want.OP.functional, args, want.OP)
        for a, b in zip(got_outs, want_outs, strict=True):
            torch.testing.assert_close(a, b, equal_nan=True)
        for a, b in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(a, b, equal_nan=True)


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_gradcheck_and_gradgradcheck_of_the_custom_op(cops, golden, name):
    """The custom op's registered backward, and its double backward where the Function form's
    tests check it."""
    import inspect

    t = _tests(cops, name)
    args = t.sample_inputs()
    checked = getattr(t, "GRADCHECKED", t.OP.checked)  # not through a stop-gradient (Note [stop-gradient])
    positions = [k for k in checked if args[k] is not None]
    if not positions:
        return
    call, inputs = t.harness.only(t.OP, [a.detach() if isinstance(a, torch.Tensor) else a for a in args], positions)
    assert torch.autograd.gradcheck(call, [x.requires_grad_() for x in inputs])
    if hasattr(_tests(golden, name), "test_gradgradcheck"):
        assert "second_order=True" in inspect.getsource(t.test_gradgradcheck)
        assert torch.autograd.gradgradcheck(call, inputs)


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_vmap_equals_a_loop(cops, name):
    _tests(cops, name).test_vmap_equals_a_loop()


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_compile_fullgraph_equals_eager(cops, name):
    t = _tests(cops, name)
    args = t.sample_inputs()
    torch._dynamo.reset()
    compiled = torch.compile(t.OP.functional, fullgraph=True, backend="aot_eager")
    got = _outputs_and_grads(compiled, args, t.OP)
    want = _outputs_and_grads(t.OP.functional, args, t.OP)
    for a, b in zip([*got[0], *got[1]], [*want[0], *want[1]], strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)


def test_compile_with_inductor(cops):
    x = torch.randn(5, 6, requires_grad=True)
    torch._dynamo.reset()
    got = torch.compile(cops.mish, fullgraph=True)(x)
    (got_grad,) = torch.autograd.grad(got.sum(), x)
    want = torch.nn.functional.mish(x)
    (want_grad,) = torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


@pytest.mark.parametrize("strict", [False, True])
def test_export_keeps_each_override_op_as_one_node_and_trains_as_eager(cops, strict):
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = torch.nn.Linear(4, 6), torch.nn.Linear(6, 3)

        def forward(self, x):
            h = cops.quantize_ste(cops.sign_ste(self.first(x)) * 1.5, 0.25)[0]
            return cops.grad_reverse(self.second(h), 0.5)

    model = Net()
    x = torch.randn(8, 4)
    want = model(x)
    want_grads = torch.autograd.grad((want * want).sum(), list(model.parameters()))
    exported = torch.export.export(model, (x,), strict=strict)
    targets = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    for name in ("sign_ste", "quantize_ste", "grad_reverse"):
        assert targets.count(getattr(torch.ops.cops, name).default) == 1, targets
    graph = exported.module()
    got = graph(x)
    torch.testing.assert_close(got, want)
    got_grads = torch.autograd.grad((got * got).sum(), list(graph.parameters()))
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)
    assert any(g.abs().sum() > 0 for g in got_grads[:2])  # the straight-through gradient reached `first`


@pytest.mark.parametrize("name", ["sign_ste", "quantize_ste", "huber", "swish", "linear", "softmax"])
def test_forward_mode_through_the_functional_equals_the_function_form(cops, golden, name):
    """jvp and forward-over-reverse (the Hessian) run the Function's derived jvp."""
    t, want = _tests(cops, name), _tests(golden, name)
    args = [a.detach() if isinstance(a, torch.Tensor) else a for a in t.sample_inputs()]
    k = t.OP.tensor_inputs[0]

    def first(f):
        return lambda x: t.harness.as_tuple(f(*args[:k], x, *args[k + 1 :]))[0]

    tangent = torch.randn_like(args[k])
    got = torch.func.jvp(first(t.OP.functional), (args[k],), (tangent,))
    expected = torch.func.jvp(first(want.OP.functional), (args[k],), (tangent,))
    torch.testing.assert_close(got, expected)
    x = args[k][..., :2].contiguous() if name in ("swish", "softmax") else None
    if x is not None:
        f = lambda f_: lambda x: first(f_)(x).sum()  # noqa: E731
        torch.testing.assert_close(
            torch.func.hessian(f(t.OP.functional))(args[k]), torch.func.hessian(f(want.OP.functional))(args[k])
        )


def test_the_raw_custom_op_under_torch_func(cops):
    """What the README says of torch.ops.NS.NAME called directly on torch 2.13: no forward-mode
    rule (a zero tangent), torch.func.grad refused loudly; the functional does both right."""
    x, v = torch.randn(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    _, raw = torch.func.jvp(lambda x: torch.ops.cops.swish(x, 1.0), (x,), (v,))
    _, functional = torch.func.jvp(lambda x: cops.swish(x, 1.0), (x,), (v,))
    assert torch.equal(raw, torch.zeros_like(raw))
    torch.testing.assert_close(functional, torch.func.grad(lambda x: cops.swish(x, 1.0).sum())(x))
    with pytest.raises(RuntimeError, match="must override the setup_context"):
        torch.func.grad(lambda x: torch.ops.cops.swish(x, 1.0).sum())(x)


def test_per_sample_override_gradients_under_vmap(cops):
    """vmap(grad(...)) of the functional: sign_ste's straight-through gradient per sample."""
    x = torch.linspace(-2, 2, 12, dtype=torch.float64).reshape(3, 4)
    got = torch.func.vmap(torch.func.grad(lambda r: cops.sign_ste(r).sum()))(x)
    torch.testing.assert_close(got, (x.abs() <= 1).to(x.dtype))
    w, b = torch.randn(2, 4, dtype=torch.float64), torch.randn(2, dtype=torch.float64)
    per_sample_grad = torch.func.grad(lambda w_, r: cops.linear(r[None], w_, b).sum())
    per_sample = torch.func.vmap(per_sample_grad, in_dims=(None, 0))(w, x)
    torch.testing.assert_close(per_sample, torch.ones(3, 2, 1, dtype=torch.float64) * x[:, None, :])


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_vmap_rule_of_the_raw_op_equals_a_loop(cops, name):
    """The registered vmap rule (broadcast or loop), each present tensor input batched alone and
    all together, at dimension 1 where the input has one; the op's outputs and residuals."""
    t = _tests(cops, name)
    op = getattr(torch.ops.cops, name)
    samples = [[a.detach() if isinstance(a, torch.Tensor) else a for a in t.sample_inputs(seed=s)] for s in range(3)]
    present = [k for k in t.OP.tensor_inputs if samples[0][k] is not None]
    for which in [[k] for k in present] + ([present] if len(present) > 1 else []):
        dims = [1 if samples[0][k].dim() > 0 else 0 for k in which]

        def f(*tensors, which=which):
            args = list(samples[0])
            for k, tensor in zip(which, tensors, strict=True):
                args[k] = tensor
            return op(*args)

        batched = [torch.stack([s[k] for s in samples], dim=d) for k, d in zip(which, dims, strict=True)]
        got = t.harness.as_tuple(torch.func.vmap(f, in_dims=tuple(dims))(*batched))
        rows = [t.harness.as_tuple(f(*(s[k] for k in which))) for s in samples]
        for j, out in enumerate(got):
            torch.testing.assert_close(out, torch.stack([row[j] for row in rows]), equal_nan=True)


def test_broadcast_vmap_rule_with_inputs_of_other_ranks(cops, golden):
    """A batched input of lower rank than an unbatched one, and the other way round."""
    huber = torch.ops.cops.huber
    x = torch.randn(3, 4, dtype=torch.float64)  # batch of 3, each [4]
    target = torch.randn(5, 4, dtype=torch.float64)  # unbatched [5, 4]
    got = torch.func.vmap(lambda r: huber(r, target, 0.5))(x)
    torch.testing.assert_close(got, torch.stack([golden.huber(r, target, 0.5) for r in x]))
    wide = torch.randn(2, 4, dtype=torch.float64)  # unbatched [2, 4]; batched target rows [4], at dim 1
    got = torch.func.vmap(lambda t_: huber(wide, t_, 0.5), in_dims=1)(target.T.contiguous())
    torch.testing.assert_close(got, torch.stack([golden.huber(wide, r, 0.5) for r in target]))


def test_importing_twice_works_and_another_package_of_the_namespace_is_refused(cops, folder, tmp_path):
    from opgen.cli import main

    shutil.copytree(folder / PACKAGE, tmp_path / "again")
    again = import_package(tmp_path, "again")  # the same text under another name: redefines
    x = torch.randn(3)
    torch.testing.assert_close(again.mish(x), cops.mish(x))
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "mish.yaml").write_text(SWISH.replace("swish", "mish"))
    assert (
        main(
            [
                "generate",
                str(tmp_path / "specs"),
                "-o",
                str(tmp_path / "other"),
                "--form",
                "custom_op",
                "--namespace",
                PACKAGE,
            ]
        )
        == 0
    )
    with pytest.raises(RuntimeError, match="'cops::mish' is already defined by another opgen package.*--namespace"):
        import_package(tmp_path, "other")
    torch.testing.assert_close(cops.mish(x), torch.nn.functional.mish(x))


def test_the_spec_form_wins_over_the_command_line(tmp_path, run_cli):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "a.yaml").write_text(SWISH.replace("swish", "a") + "form: function\n")
    (specs / "b.yaml").write_text(SWISH.replace("swish", "b") + "form: custom_op\n")
    (specs / "c.yaml").write_text(SWISH.replace("swish", "c"))
    status, _, err = run_cli("generate", str(specs), "-o", str(tmp_path / "forms"), "--namespace", "forms_ns")
    assert status == 0, err
    text = {n: (tmp_path / "forms" / "ops" / f"{n}.py").read_text() for n in "abc"}
    assert ["forms_ns::" in text[n] for n in "abc"] == [False, True, False]
    status, _, err = run_cli("generate", str(specs), "-o", str(tmp_path / "forms"), "--form", "custom_op")
    assert status == 0, err
    text = {n: (tmp_path / "forms" / "ops" / f"{n}.py").read_text() for n in "abc"}
    assert ["forms::" in text[n] for n in "abc"] == [False, True, True]
    forms = import_package(tmp_path, "forms")
    x = torch.randn(4)
    for f in (forms.a, forms.b, forms.c):
        torch.testing.assert_close(f(x), torch.nn.functional.silu(x))


def test_bad_form_and_namespace_are_located_errors(tmp_path, run_cli):
    (tmp_path / "op.yaml").write_text(SWISH + "form: custom\n")
    status, _, err = run_cli("generate", str(tmp_path / "op.yaml"), "-o", str(tmp_path / "out"))
    assert status == 2 and f"{tmp_path / 'op.yaml'}:7:7: form 'custom' is not one of: function, custom_op" in err
    (tmp_path / "op.yaml").write_text(SWISH)
    for bad in ("1ops", "my-ops", "prim", "aten", "class", "α"):
        status, _, err = run_cli(
            "generate",
            str(tmp_path / "op.yaml"),
            "-o",
            str(tmp_path / "out"),
            "--form",
            "custom_op",
            "--namespace",
            bad,
        )
        assert status == 2 and f"--namespace {bad}: " in err, err
    status, _, err = run_cli("generate", str(tmp_path / "op.yaml"), "-o", str(tmp_path / "αops"), "--form", "custom_op")
    assert status == 2 and "op.yaml:1:1: form custom_op: the namespace 'αops'" in err and "--namespace NAME" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "αops").exists()
    status, _, err = run_cli("generate", str(tmp_path / "op.yaml"), "-o", str(tmp_path / "αops"))
    assert status == 0, err  # the Function form needs no namespace


def test_custom_op_with_fuse_is_refused(tmp_path, run_cli):
    """torch.compile'd kernels inside a custom op crash torch 2.13 (a segmentation fault in the
    generated tests): the combination is a located error, nothing written."""
    (tmp_path / "op.yaml").write_text(SWISH + "form: custom_op\n")
    status, _, err = run_cli("generate", str(tmp_path / "op.yaml"), "-o", str(tmp_path / "out"), "--fuse")
    assert status == 2 and "op.yaml:1:1: form custom_op cannot be fused" in err, err
    assert not (tmp_path / "out").exists()
