"""Forward mode (`jvp`) of every generated op, against plain forward-mode AD of the reference formula.

Each spec in `specs/` is taken from the committed `generated/` package with its generated test
module (its plain-torch `reference` and `sample_inputs`). Derived inputs are compared with
`torch.func.jvp` of the reference; overridden inputs with the transpose of the op's own
backward (Note [jvp of an override] in opgen.derive.override_jvp): `<v, J t> == <J^T v, t>`.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import yaml
from conftest import import_package
from spec_ops import build_ops

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted(p.stem for p in (ROOT / "specs").glob("*.yaml"))
# Forward mode along these is refused: an override that is not `grad * h`; an output that is its input
# as-is (a view) with an override that scales the gradient (Note [jvp of an override] in opgen.derive.override_jvp).
REFUSED = {"clip_grad": ["x"]}
DTYPE = torch.float64


def _golden():
    """The committed `generated` package (other tests import packages of that name from elsewhere)."""
    module = sys.modules.get("generated")
    if module is None or Path(module.__file__ or "").resolve().parent != ROOT / "generated":
        module = import_package(ROOT, "generated")
    return module


def _case(name: str):
    _golden()
    tests = importlib.import_module(f"generated.tests.test_{name}")
    overrides = yaml.safe_load((ROOT / "specs" / f"{name}.yaml").read_text()).get("gradients") or {}
    return tests, tests.OP, tests.sample_inputs(), set(overrides)


def _tangents(args, positions, seed=3):
    generator = torch.Generator().manual_seed(seed)
    return {k: torch.rand(args[k].shape, generator=generator, dtype=DTYPE) * 2 - 1 for k in positions}


def _call(fn, args, positions, outputs):
    def call(*tensors):
        full = list(args)
        for k, tensor in zip(positions, tensors, strict=True):
            full[k] = tensor
        return tuple(fn(*full)[k] for k in outputs)

    return call


def _reference(tests, op):
    return lambda *a: tuple(tests.reference(*a)[name] for name in op.outputs)


def _derived_positions(name: str) -> list[int]:
    """The Tensor inputs (given in the samples) whose gradient opgen derives, not overridden."""
    _, op, args, overridden = _case(name)
    return [k for k in op.tensor_inputs if op.inputs[k] not in overridden and args[k] is not None]


def _gradchecked(tests, positions: list[int]) -> list[int]:
    """`positions` but the inputs a stop-gradient reads, which finite differences cannot check (the
    generated tests' `GRADCHECKED`, Note [stop-gradient] in opgen/nodes/stop_gradient.py)."""
    return [k for k in positions if k in getattr(tests, "GRADCHECKED", positions)]


def _forward_positions(name: str) -> list[int]:
    """The Tensor inputs (given in the samples) along which forward mode is not refused."""
    _, op, args, _ = _case(name)
    return [k for k in op.tensor_inputs if args[k] is not None and op.inputs[k] not in REFUSED.get(name, [])]


# Specs whose every Tensor input is overridden have no derived tangent to compare with a
# reference; the transpose test covers them.
DERIVED = [name for name in SPECS if _derived_positions(name)]
FORWARD = [name for name in SPECS if _forward_positions(name)]


@pytest.mark.parametrize("name", DERIVED)
def test_jvp_matches_forward_mode_of_the_reference(name: str) -> None:
    tests, op, args, overridden = _case(name)
    derived = _derived_positions(name)
    tangents = _tangents(args, derived)
    primals = tuple(args[k] for k in derived)
    outs = list(op.differentiable)
    _, got = torch.func.jvp(_call(op, args, derived, outs), primals, tuple(tangents[k] for k in derived))
    _, want = torch.func.jvp(_call(_reference(tests, op), args, derived, outs), primals, tuple(tangents.values()))
    for g, w, k in zip(got, want, outs, strict=True):
        torch.testing.assert_close(g, w.expand_as(g), msg=f"{name}: tangent of {op.outputs[k]}")


@pytest.mark.parametrize("name", SPECS)
def test_jvp_is_the_transpose_of_backward(name: str) -> None:
    """`<v, J t> == <J^T v, t>` for every Tensor input, overridden ones included."""
    _, op, args, _ = _case(name)
    positions = _forward_positions(name)
    for k in positions:
        fn = _call(op, args, [k], list(op.differentiable))
        t = _tangents(args, [k])[k]
        outs, tangent_outs = torch.func.jvp(fn, (args[k],), (t,))
        generator = torch.Generator().manual_seed(5)
        vs = tuple(torch.rand(o.shape, generator=generator, dtype=DTYPE) for o in outs)
        _, vjp = torch.func.vjp(fn, args[k])
        (back,) = vjp(vs)
        forward = sum((v * to).sum() for v, to in zip(vs, tangent_outs, strict=True))
        torch.testing.assert_close(forward, (back * t).sum(), msg=f"{name}: along {op.inputs[k]}")


@pytest.mark.parametrize("name", FORWARD)
def test_dual_numbers_match_func_jvp(name: str) -> None:
    _, op, args, _ = _case(name)
    positions = _forward_positions(name)
    tangents = _tangents(args, positions)
    fn = _call(op, args, positions, list(op.differentiable))
    _, want = torch.func.jvp(fn, tuple(args[k] for k in positions), tuple(tangents.values()))
    with fwAD.dual_level():
        duals = [fwAD.make_dual(args[k], tangents[k]) for k in positions]
        got = [fwAD.unpack_dual(o).tangent for o in fn(*duals)]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("name", DERIVED)
def test_gradcheck_forward_ad(name: str) -> None:
    tests, op, args, _ = _case(name)
    positions = _gradchecked(tests, _derived_positions(name))
    if not positions:
        return  # every input is read through a stop-gradient: tests/test_stop_gradient.py
    fixed = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    fn = _call(op, fixed, positions, list(op.differentiable))
    inputs = [fixed[k].clone().requires_grad_() for k in positions]
    assert torch.autograd.gradcheck(fn, inputs, check_forward_ad=True, check_backward_ad=True)


@pytest.mark.parametrize("name", ["mish", "softmax", "linear", "logsumexp", "attention_scores", "gelu_tanh"])
def test_forward_over_reverse_hessian(name: str) -> None:
    """Hessian-vector products by forward over reverse, against reverse over reverse of the reference."""
    tests, op, args, _ = _case(name)
    k = op.tensor_inputs[0]
    x = args[k]
    ref = _call(_reference(tests, op), args, [k], [0])

    def loss(fn):
        return lambda x: (fn(x)[0] * torch.linspace(-1, 1, fn(x)[0].numel(), dtype=DTYPE).view_as(fn(x)[0])).sum()

    v = _tangents(args, [k])[k]
    _, hvp = torch.func.jvp(torch.func.grad(loss(_call(op, args, [k], [0]))), (x,), (v,))
    want = torch.autograd.functional.hvp(loss(ref), x, v)[1]
    torch.testing.assert_close(hvp, want)


@pytest.mark.parametrize("name", ["mish", "softmax", "linear", "huber"])
def test_jacfwd_equals_jacrev_and_hessian(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`torch.func.jacfwd`, `jacrev` and `hessian` (they vmap: the Function gets a generated vmap rule)."""
    tests, op, args, _ = _case(name)
    _golden()
    module = importlib.import_module(f"generated.ops.{name}")
    function = getattr(module, op.functional.__name__.title().replace("_", "") + "Function")
    monkeypatch.setattr(function, "generate_vmap_rule", True, raising=False)
    k = op.tensor_inputs[0]
    fn = _call(op, args, [k], [0])
    jf = torch.func.jacfwd(lambda x: fn(x)[0])(args[k])
    jr = torch.func.jacrev(lambda x: fn(x)[0])(args[k])
    torch.testing.assert_close(jf, jr)
    ref = _call(_reference(tests, op), args, [k], [0])
    torch.testing.assert_close(jf, torch.autograd.functional.jacobian(lambda x: ref(x)[0], args[k]))
    h = torch.func.hessian(lambda x: fn(x)[0].sum())(args[k])
    torch.testing.assert_close(h, torch.autograd.functional.hessian(lambda x: ref(x)[0].sum(), args[k]))


def test_override_jvp_is_h_times_tangent() -> None:
    golden = _golden()
    grad_reverse, sign_ste = golden.grad_reverse, golden.sign_ste

    x = torch.linspace(-2, 2, 9, dtype=DTYPE)
    t = torch.rand(9, dtype=DTYPE)
    _, got = torch.func.jvp(sign_ste, (x,), (t,))
    torch.testing.assert_close(got, t * (x.abs() <= 1))
    # An output that is its input as-is, with an override that scales it: a copy, whose tangent is -alpha * t,
    # under torch.func.jvp and under forward_ad alike; backward keeps the override.
    y, got = torch.func.jvp(lambda x: grad_reverse(x, 0.5), (x,), (t,))
    torch.testing.assert_close((y, got), (x, -0.5 * t))
    with fwAD.dual_level():
        y = grad_reverse(fwAD.make_dual(x, t), 0.5)
        torch.testing.assert_close(fwAD.unpack_dual(y).tangent, -0.5 * t)
    leaf = x.clone().requires_grad_()
    y = grad_reverse(leaf, 0.5)
    assert y.data_ptr() != leaf.data_ptr()
    (grad,) = torch.autograd.grad(y, leaf, t)
    torch.testing.assert_close(grad, -0.5 * t)


def test_nonlinear_override_refuses_forward_mode_naming_spec_and_input() -> None:
    clip_grad = _golden().clip_grad

    x = torch.randn(4, dtype=DTYPE)
    with pytest.raises(NotImplementedError, match=r"clip_grad \(specs/clip_grad.yaml\).*along 'x'"):
        torch.func.jvp(clip_grad, (x,), (torch.ones_like(x),))


def test_optional_input_none_and_tangents_on_some_inputs() -> None:
    linear = _golden().linear
    reference_without_bias = importlib.import_module("generated.tests.test_linear").reference_without_bias

    generator = torch.Generator().manual_seed(0)
    x, w, tw = (torch.rand(s, generator=generator, dtype=DTYPE) for s in ([3, 4], [5, 4], [5, 4]))
    _, got = torch.func.jvp(lambda w: linear(x, w, None), (w,), (tw,))
    _, want = torch.func.jvp(lambda w: reference_without_bias(x, w, None)["out"], (w,), (tw,))
    torch.testing.assert_close(got, want)


def test_compile_fullgraph_has_no_graph_breaks_and_needs_the_jvp_free_class() -> None:
    golden = _golden()
    LinearFunction, linear, mish, sign_ste, softmax = (
        golden.LinearFunction,
        golden.linear,
        golden.mish,
        golden.sign_ste,
        golden.softmax,
    )

    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(5, 4, requires_grad=True)
    for fn, args in ((mish, (x,)), (softmax, (x,)), (sign_ste, (x,)), (linear, (x, w, None))):
        torch._dynamo.reset()
        assert torch._dynamo.explain(fn)(*args).graph_break_count == 0, fn
        compiled = torch.compile(fn, fullgraph=True)(*args)
        torch.testing.assert_close(compiled, fn(*args))
        got = torch.autograd.grad(compiled.sum(), x)
        torch.testing.assert_close(got, torch.autograd.grad(fn(*args).sum(), x))
    # The class with jvp itself breaks the graph: the functional's choice is what avoids it.
    torch._dynamo.reset()
    with pytest.raises(Exception, match="Unsupported custom jvp"):
        torch.compile(lambda x, w: LinearFunction.apply(x, w, None), fullgraph=True)(x, w)


# -- specs built for the cases `specs/` lacks ------------------------------------------------------

EXTRA = {
    "fm_broadcast": """
        name: fm_broadcast
        inputs: {x: Tensor, z: Tensor, b: "Tensor?", scale: float = 2.0}
        outputs:
          y: scale * x * sin(z) + b
          n: {formula: x > 0, differentiable: false}
          c: x
        """,
    "fm_tensor": """
        name: fm_tensor
        inputs: {a: "Tensor[N, K]", w: "Tensor[K, M]", s: "Tensor[M]"}
        outputs:
          m: amax(a @ w + s, dim=-1, keepdim=true)
          l: mean(logsumexp(a @ w, dim=1) * sum(a, dim=1), dim=0)
        """,
}


def _reference_broadcast(x, z, b, scale):
    y = scale * x * torch.sin(z) + (b if b is not None else 0)
    return y, x


def _reference_tensor(a, w, s):
    m = torch.amax(a @ w + s, dim=-1, keepdim=True)
    return m, (torch.logsumexp(a @ w, dim=1) * a.sum(1)).mean(0)


def test_broadcasting_optional_non_tensor_and_aliased_outputs(tmp_path: Path) -> None:
    fm = build_ops(tmp_path, "fm_pkg_broadcast", {"fm_broadcast": EXTRA["fm_broadcast"]}).fm_broadcast
    generator = torch.Generator().manual_seed(2)
    x, z, b = (torch.rand(s, generator=generator, dtype=DTYPE) for s in ([3, 1], [3, 4], [4]))
    tx, tz, tb = (torch.rand(s.shape, generator=generator, dtype=DTYPE) for s in (x, z, b))
    for bias in (b, None):
        for present in ([0], [1], [0, 1], [0, 1, 2]):
            tangents = [tx, tz, tb]
            fn = _call(lambda *a: fm(*a), [x, z, bias, 0.5], present, [0, 2])
            ref = _call(_reference_broadcast, [x, z, bias, 0.5], present, [0, 1])
            primals = tuple([x, z, bias][k] for k in present)
            if any(p is None for p in primals):
                continue
            _, got = torch.func.jvp(fn, primals, tuple(tangents[k] for k in present))
            _, want = torch.func.jvp(ref, primals, tuple(tangents[k] for k in present))
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w.expand_as(g))
    with fwAD.dual_level():
        outs = fm(fwAD.make_dual(x, tx), z, b)
        assert fwAD.unpack_dual(outs[1]).tangent is None  # not differentiable
        torch.testing.assert_close(fwAD.unpack_dual(outs[2]).tangent, tx)


def test_tensor_formulas_amax_logsumexp_keepdim(tmp_path: Path) -> None:
    op = build_ops(tmp_path, "fm_pkg_tensor", {"fm_tensor": EXTRA["fm_tensor"]}).fm_tensor
    generator = torch.Generator().manual_seed(4)
    args = [torch.rand(s, generator=generator, dtype=DTYPE) for s in ([3, 4], [4, 5], [5])]
    tangents = [torch.rand(a.shape, generator=generator, dtype=DTYPE) for a in args]
    _, got = torch.func.jvp(op, tuple(args), tuple(tangents))
    _, want = torch.func.jvp(_reference_tensor, tuple(args), tuple(tangents))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    inputs = [a.clone().requires_grad_() for a in args]
    assert torch.autograd.gradcheck(op, inputs, check_forward_ad=True)


def test_an_elementwise_op_of_one_tensor_takes_its_tangent_from_backward() -> None:
    """Note [a diagonal Jacobian] in opgen.plan.backward: `jvp` calls backward where the Jacobian is its own
    transpose, and only there (two Tensor inputs, a residual, a reduction or halves, a refused input: its own;
    an override that scales an output that is its input as-is, `grad_reverse`, is diagonal too)."""
    ops = ROOT / "generated" / "ops"

    def calls_backward(name: str) -> bool:
        return "Function.backward(ctx, tangent_" in (ops / f"{name}.py").read_text(encoding="utf-8")

    assert all(calls_backward(n) for n in ("swish", "sigmoid", "mish", "round_ste", "sign_ste", "grad_reverse"))
    assert not any(calls_backward(n) for n in ("huber", "tanhshrink", "softmax", "glu", "clip_grad"))
    golden = _golden()
    x = torch.linspace(-4, 4, 9, dtype=DTYPE)
    t = torch.rand(9, generator=torch.Generator().manual_seed(0), dtype=DTYPE)
    _, got = torch.func.jvp(lambda x: golden.swish(x, 1.5), (x,), (t,))
    _, want = torch.func.jvp(lambda x: x * torch.sigmoid(1.5 * x), (x,), (t,))
    torch.testing.assert_close(got, want)
    # second order through the tangent: forward over forward
    got2 = torch.func.jacfwd(torch.func.jacfwd(lambda x: golden.swish(x, 1.5).sum()))(x)
    want2 = torch.func.jacfwd(torch.func.jacfwd(lambda x: (x * torch.sigmoid(1.5 * x)).sum()))(x)
    torch.testing.assert_close(got2, want2)


def test_a_tangent_taken_from_backward_reads_the_tensor_inputs_gradient(tmp_path) -> None:
    """Backward returns a gradient per input: the tangent is the Tensor input's, wherever it stands."""
    spec = "name: op\ninputs:\n  n: int = 2\n  x: Tensor\noutputs:\n  y: n * sin(x)\n"
    ops = build_ops(tmp_path, "jvp_position_ops", {"op": spec})
    x = torch.linspace(-2, 2, 5, dtype=DTYPE)
    t = torch.ones(5, dtype=DTYPE)
    _, got = torch.func.jvp(lambda x: ops.op(3, x), (x,), (t,))
    torch.testing.assert_close(got, 3 * torch.cos(x))
