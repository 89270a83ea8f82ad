"""Outputs have the shape torch gives the formula as written, and keepdim reductions of tensor operations derive.

Every op below is generated into a temporary package and compared with plain torch autograd of
the same formula as written (an independent reference): values, shapes, first-order gradients,
gradcheck and gradgradcheck in float64. Note [shapes as written] (opgen.written): SymPy's
simplified formula (`where(c, x, x)` -> `x`) may lose a tensor the formula broadcasts with.
Note [narrow gradients] (opgen.vjp): a keepdim reduction of `a @ b` sends a gradient of size 1
along a dimension `@` contracts.
"""

from __future__ import annotations

import pytest
import torch
from conftest import SPECS, import_package

# name: (inputs, outputs, shapes of the arguments, torch reference of the formulas as written)
CASES = {
    # -- simplification drops a tensor (N9) --
    "where_same_branches": (
        {"x0": "Tensor", "x2": "Tensor"},
        {"o1": "where(0.5 >= x2, x0, x0)"},
        {"x0": (3, 4), "x2": (2, 3, 4)},
        lambda x0, x2: (torch.where(0.5 >= x2, x0, x0),),
    ),
    "times_zero": (
        {"x0": "Tensor", "z": "Tensor"},
        {"o": "x0 + 0 * z"},
        {"x0": (4,), "z": (3, 4)},
        lambda x0, z: (x0 + 0 * z,),
    ),
    "cancelled": (
        {"x0": "Tensor", "z": "Tensor"},
        {"o": "exp(x0) + z - z"},
        {"x0": (3, 1), "z": (3, 4)},
        lambda x0, z: (torch.exp(x0) + z - z,),
    ),
    "max_of_same": (
        {"x0": "Tensor", "z": "Tensor"},
        {"o": "max(x0, x0) * 1 + 0 * z"},
        {"x0": (4,), "z": (2, 4)},
        lambda x0, z: (torch.maximum(x0, x0) * 1 + 0 * z,),
    ),
    "condition_only": (
        {"x": "Tensor", "c": "Tensor"},
        {"o": "x * where(c > 0, 2, 2)"},
        {"x": (4,), "c": (3, 4)},
        lambda x, c: (x * torch.where(c > 0, 2.0, 2.0),),
    ),
    "through_a_let": (
        {"x0": "Tensor", "z": "Tensor"},
        {"l": "z - z", "o": "sin(x0) + l"},
        {"x0": (4,), "z": (2, 1, 4)},
        lambda x0, z: (torch.sin(x0) + (z - z),),
    ),
    "two_outputs": (
        {"x": "Tensor", "z": "Tensor"},
        {"y": "2 * x", "u": "x + z - z"},
        {"x": (4,), "z": (3, 4)},
        lambda x, z: (2 * x, x + z - z),
    ),
    "declared_dims": (
        {"x0": "Tensor[K]", "z": "Tensor[N, K]"},
        {"o": "x0 * 3 + z - z"},
        {"x0": (4,), "z": (3, 4)},
        lambda x0, z: (x0 * 3 + z - z,),
    ),
    "declared_batch": (
        {"x0": "Tensor[K]", "z": "Tensor[..., K]"},
        {"o": "tanh(x0) + 0 * z"},
        {"x0": (4,), "z": (2, 3, 4)},
        lambda x0, z: (torch.tanh(x0) + 0 * z,),
    ),
    "dropped_reduction": (
        {"x0": "Tensor[K]", "z": "Tensor[N, K]"},
        {"o": "x0 + 0 * sum(z, dim=-1, keepdim=true)"},
        {"x0": (4,), "z": (3, 4)},
        lambda x0, z: (x0 + 0 * z.sum(-1, keepdim=True),),
    ),
    "dropped_batched_reduction": (
        {"x0": "Tensor[K]", "z": "Tensor[..., N, K]"},
        {"o": "x0 + 0 * mean(z, dim=-1, keepdim=true)"},
        {"x0": (4,), "z": (2, 3, 4)},
        lambda x0, z: (x0 + 0 * z.mean(-1, keepdim=True),),
    ),
    "matmul_plus_dropped": (
        {"x": "Tensor[N, K]", "w": "Tensor[K, M]", "z": "Tensor[..., N, M]"},
        {"o": "x @ w + z - z"},
        {"x": (3, 4), "w": (4, 5), "z": (2, 3, 5)},
        lambda x, w, z: (x @ w + z - z,),
    ),
    # -- a reduction along a dim its simplified operand is constant along (Note [reductions of constant dimensions]) --
    "sum_of_ones_times_mean": (
        {"x": "Tensor[N, D]"},
        {"y": "sum(where(x > 9, 1, 1) * mean(x, dim=-1, keepdim=true), dim=-1)"},
        {"x": (3, 4)},
        lambda x: ((torch.where(x > 9, 1.0, 1.0) * x.mean(-1, keepdim=True)).sum(-1),),
    ),
    "sum_of_zero_times_x_plus_mean": (
        {"x": "Tensor[N, D]"},
        {"y": "sum(x * 0 + mean(x, dim=-1, keepdim=true), dim=-1)"},
        {"x": (3, 4)},
        lambda x: ((x * 0 + x.mean(-1, keepdim=True)).sum(-1),),
    ),
    "mean_of_constant_dim": (
        {"x": "Tensor[N, D]"},
        {"y": "mean(where(x > 9, 1, 1) * mean(x, dim=-1, keepdim=true), dim=(0, 1))"},
        {"x": (3, 4)},
        lambda x: ((torch.where(x > 9, 1.0, 1.0) * x.mean(-1, keepdim=True)).mean((0, 1)),),
    ),
    "sum_over_a_lacking_dim": (
        {"x": "Tensor[N, D]", "w": "Tensor[D]"},
        {"y": "sum(where(x > 0, 2, 2) * w, dim=0)", "u": "sum(w * (x - x + 1), dim=0, keepdim=true)"},
        {"x": (3, 4), "w": (4,)},
        lambda x, w: ((torch.where(x > 0, 2.0, 2.0) * w).sum(0), (w * (x - x + 1)).sum(0, keepdim=True)),
    ),
    "other_reductions_of_constant_dims": (
        {"x": "Tensor[N, D]"},
        {
            "a": "logsumexp(x * 0 + sum(x, dim=-1, keepdim=true), dim=-1)",
            "b": "norm(x - x + mean(x, dim=-1, keepdim=true), dim=(0, 1))",
            "c": "var(x - x + mean(x, dim=0, keepdim=true), dim=(0, 1))",
            "d": "std(x - x + mean(x, dim=0, keepdim=true), dim=(0, 1), correction=0)",
            "e": "amax(x - x + mean(x, dim=0, keepdim=true), dim=0, keepdim=true)",
        },
        {"x": (3, 4)},
        lambda x: (
            torch.logsumexp(x * 0 + x.sum(-1, keepdim=True), -1),
            torch.linalg.vector_norm(x - x + x.mean(-1, keepdim=True), dim=(0, 1)),
            torch.var(x - x + x.mean(0, keepdim=True), dim=(0, 1)),
            torch.std(x - x + x.mean(0, keepdim=True), dim=(0, 1), correction=0),
            torch.amax(x - x + x.mean(0, keepdim=True), dim=0, keepdim=True),
        ),
    ),
    "where_same_number_times_vector": (
        {"x": "Tensor[N, D]", "w": "Tensor[D]"},
        {"y": "where(x > 0, 2, 2) * w"},
        {"x": (3, 4), "w": (4,)},
        lambda x, w: (torch.where(x > 0, 2.0, 2.0) * w,),
    ),
    # -- keepdim reductions of tensor operations (N6) --
    "mean_matmul_keepdim": (
        {"a": "Tensor[N, K]", "b": "Tensor[K, M]"},
        {"o": "mean(a @ b, dim=1, keepdim=true)"},
        {"a": (3, 4), "b": (4, 5)},
        lambda a, b: ((a @ b).mean(1, keepdim=True),),
    ),
    "sum_matmul_rows_keepdim": (
        {"a": "Tensor[N, K]", "b": "Tensor[K, M]"},
        {"o": "sum(a @ b, dim=0, keepdim=true)"},
        {"a": (3, 4), "b": (4, 5)},
        lambda a, b: ((a @ b).sum(0, keepdim=True),),
    ),
    "sum_matmul_rows": (
        {"a": "Tensor[N, K]", "b": "Tensor[K, M]"},
        {"o": "sum(a @ b, dim=0)"},
        {"a": (3, 4), "b": (4, 5)},
        lambda a, b: ((a @ b).sum(0),),
    ),
    "sum_to_one_by_one": (
        {"a": "Tensor[N, K]", "b": "Tensor[K, M]"},
        {"o": "sum(sum(a @ b, dim=0, keepdim=true), dim=1, keepdim=true)"},
        {"a": (3, 4), "b": (4, 5)},
        lambda a, b: ((a @ b).sum(0, keepdim=True).sum(1, keepdim=True),),
    ),
    "amax_matmul_keepdim": (
        {"a": "Tensor[N, K]", "b": "Tensor[K, M]"},
        {"o": "amax(a @ b, dim=-1, keepdim=true)"},
        {"a": (3, 4), "b": (4, 5)},
        lambda a, b: ((a @ b).amax(-1, keepdim=True),),
    ),
    "logsumexp_matmul_keepdim": (
        {"a": "Tensor[N, K]", "b": "Tensor[K, M]"},
        {"o": "logsumexp(a @ b, dim=0, keepdim=true)"},
        {"a": (3, 4), "b": (4, 5)},
        lambda a, b: (torch.logsumexp(a @ b, 0, keepdim=True),),
    ),
    "mean_transposed_keepdim": (
        {"a": "Tensor[N, K]", "b": "Tensor[K, M]"},
        {"o": "mean(tanh(a @ b).T, dim=0, keepdim=true)"},
        {"a": (3, 4), "b": (4, 5)},
        lambda a, b: (torch.tanh(a @ b).T.mean(0, keepdim=True),),
    ),
    "matmul_of_transposed_product": (
        {"a": "Tensor[N, K]", "b": "Tensor[P, N]", "c": "Tensor[K, M]"},
        {"o": "sum((b @ a).T.T @ c, dim=0, keepdim=true)"},
        {"a": (3, 4), "b": (2, 3), "c": (4, 5)},
        lambda a, b, c: (((b @ a) @ c).sum(0, keepdim=True),),
    ),
    "chain_keepdim": (
        {"a": "Tensor[N, K]", "b": "Tensor[K, M]", "c": "Tensor[M, L]"},
        {"o": "sum(a @ b @ c, dim=-1, keepdim=true)"},
        {"a": (3, 4), "b": (4, 5), "c": (5, 2)},
        lambda a, b, c: ((a @ b @ c).sum(-1, keepdim=True),),
    ),
    "batched_mean_keepdim": (
        {"a": "Tensor[..., N, K]", "b": "Tensor[K, M]"},
        {"o": "mean(a @ b, dim=-2, keepdim=true)"},
        {"a": (2, 3, 4), "b": (4, 5)},
        lambda a, b: ((a @ b).mean(-2, keepdim=True),),
    ),
    # -- an output that SymPy reads as a number (Note [constant outputs] in opgen/emit/forward.py) --
    "constant_output": (
        {"x": "Tensor"},
        {"o": "x - x + 1"},
        {"x": (3, 4)},
        lambda x: (x - x + 1,),
    ),
    "constant_broadcast": (
        {"x": "Tensor", "z": "Tensor"},
        {"o": "0 * x + where(z > 0, 2.5, 2.5)", "p": "x * z"},
        {"x": (4,), "z": (3, 4)},
        lambda x, z: (0 * x + torch.where(z > 0, 2.5, 2.5), x * z),
    ),
    # log_softmax of a number spread over K as written: `.unsqueeze` of a Python float (an AttributeError)
    "log_softmax_of_a_number": (
        {"x": "Tensor[K, M]"},
        {"o": "log_softmax(where(K < K, amax(x.T, dim=-2), M), dim=-1)"},
        {"x": (3, 4)},
        lambda x: (torch.log_softmax(torch.where(torch.tensor(False), x.T.amax(-2), 4.0), -1),),
    ),
    "softmax_summed_keepdim": (
        {"a": "Tensor[N, K]"},
        {"o": "sum(exp(a - logsumexp(a, dim=-1, keepdim=true)), dim=0, keepdim=true)"},
        {"a": (3, 4)},
        lambda a: (torch.softmax(a, -1).sum(0, keepdim=True),),
    ),
}


def spec_text(name: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    lets = {n: f for n, f in outputs.items() if n == "l"}
    lines = [f"name: {name}", "inputs:"]
    lines += [f"  {n}: {t}" for n, t in inputs.items()]
    if lets:
        lines += ["let:", *(f"  {n}: {f}" for n, f in lets.items())]
    lines += ["outputs:", *(f"  {n}: {f}" for n, f in outputs.items() if n not in lets)]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    from opgen.cli import main

    root = tmp_path_factory.mktemp("written_shapes")
    specs = root / "specs"
    specs.mkdir()
    for name, (inputs, outputs, _, _) in CASES.items():
        (specs / f"{name}.yaml").write_text(spec_text(name, inputs, outputs), encoding="utf-8")
    assert main(["generate", str(specs), "-o", str(root / "written_shapes")]) == 0
    return import_package(root, "written_shapes")


def _call(op, args):
    out = op(*args)
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("name", sorted(CASES))
def test_shape_values_and_gradients_as_written(ops, name):
    inputs, _, shapes, reference = CASES[name]
    generator = torch.Generator().manual_seed(0)
    args = [torch.randn(shapes[n], generator=generator, dtype=torch.float64, requires_grad=True) for n in inputs]
    op = getattr(ops, name)
    got, want = _call(op, args), reference(*args)
    assert [o.shape for o in got] == [w.shape for w in want]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    grads = [torch.randn(w.shape, generator=generator, dtype=torch.float64) for w in want]
    mine = torch.autograd.grad(got, args, grads, allow_unused=True, create_graph=True)
    theirs = torch.autograd.grad(want, args, grads, allow_unused=True, create_graph=True)
    for a, m, t in zip(args, mine, theirs, strict=True):
        m = torch.zeros_like(a) if m is None else m
        t = torch.zeros_like(a) if t is None else t
        assert m.shape == a.shape
        torch.testing.assert_close(m, t)
    assert torch.autograd.gradcheck(lambda *xs: _call(op, xs), args)
    assert torch.autograd.gradgradcheck(lambda *xs: _call(op, xs), args)


def test_outputs_that_lose_nothing_are_not_expanded():
    from opgen.emit.render import Renderer
    from opgen.pipeline import build

    result = build(sorted(str(p) for p in SPECS.glob("*.yaml")), Renderer())
    assert not result.problems
    ops = [path for path in result.files if path.startswith("ops/") and not path.endswith("__init__.py")]
    assert len(ops) == len(list(SPECS.glob("*.yaml")))
    assert not [path for path in ops if ".expand(torch.broadcast_shapes(" in result.files[path]]


def test_a_constant_output_of_a_tensor_operation_alone(tmp_path):
    """`(n > n) * o` of a let `n = N` and an output `o = a.T` is a tensor of zeros of `o`'s shape: the
    reader keeps the condition unevaluated, in terms of the inputs it is 0, and no Tensor input is used
    elementwise to take the dtype from (Note [constant outputs] in opgen/emit/forward.py)."""
    from spec_ops import build_ops

    spec = """
        name: op
        inputs:
          a: Tensor[N, K]
        let:
          n: N
        outputs:
          o: a.T
          p: {formula: "(n > n) * o", differentiable: false}
    """
    ops = build_ops(tmp_path, "constant_transpose", {"op": spec})
    a = torch.randn(3, 4, dtype=torch.float32, requires_grad=True)
    o, p = ops.op(a)
    torch.testing.assert_close(o, a.T)
    torch.testing.assert_close(p, torch.zeros(4, 3))
    assert not p.requires_grad


def test_a_constant_output_of_a_tensor_of_no_dimensions_is_a_tensor(tmp_path):
    """`false * x3` of a `Tensor[]` x3 is a tensor of shape (), as in torch: SymPy reads it as 0, whose
    shape () covers x3's, and forward returned the number 0 (mark_non_differentiable failed on it)."""
    from spec_ops import build_ops

    spec = """
        name: op
        inputs:
          x: Tensor
          s: Tensor[]
        outputs:
          y: sin(x)
          z: {formula: "false * s", differentiable: false}
          w: 0 * s
    """
    ops = build_ops(tmp_path, "constant_scalar", {"op": spec})
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    s = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    y, z, w = ops.op(x, s)
    torch.testing.assert_close((y, z, w), (torch.sin(x), False * s, 0 * s))
    assert not z.requires_grad
    (g,) = torch.autograd.grad(w, s, allow_unused=True)
    assert g is None or float(g) == 0.0


def test_a_step_of_a_formula_of_known_sign_is_a_tensor(tmp_path):
    """`heaviside(log(1 + exp(o)))` is 1 wherever `o` is, as a tensor of o's shape: the printer asked
    SymPy for `softplus(o) >= 0`, got True, and forward returned the number 1."""
    from spec_ops import build_ops

    spec = """
        name: op
        inputs:
          x: Tensor
        outputs:
          o: 2 * x
          h: {formula: "heaviside(log(1 + exp(o)))", differentiable: false}
          k: heaviside(-softplus(x)) + x
    """
    ops = build_ops(tmp_path, "known_sign", {"op": spec})
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    o, h, k = ops.op(x)
    torch.testing.assert_close((o, h, k), (2 * x, torch.ones(3, 4, dtype=torch.float64), x))
    assert not h.requires_grad
    (g,) = torch.autograd.grad(k.sum(), x)
    torch.testing.assert_close(g, torch.ones_like(x))
