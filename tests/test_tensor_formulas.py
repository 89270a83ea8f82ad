"""Tensor formulas beyond the spec library: every reduction, keepdim, transposes, batch matmul.

Each spec below is generated into a temporary package; the op must equal the same formula
written by hand in torch (an independent reference), and pass gradcheck and gradgradcheck.
"""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT, import_package

CASES = {
    # name: (inputs, formula, shapes, torch reference)
    "contract_rows": (
        {"x": "Tensor[N, K]", "a": "Tensor[K, M]", "y": "Tensor[N, M]"},
        "sum((x @ a) * y, dim=-1)",
        {"x": (3, 4), "a": (4, 5), "y": (3, 5)},
        lambda x, a, y: ((x @ a) * y).sum(-1),
    ),
    "naive_softmax": (
        {"x": "Tensor[..., N]"},
        "exp(x) / sum(exp(x), dim=-1, keepdim=true)",
        {"x": (2, 3, 4)},
        lambda x: torch.softmax(x, -1),
    ),
    "weighted_mean": (
        {"x": "Tensor[N, K]", "w": "Tensor[K]"},
        "mean(x * w, dim=0)",
        {"x": (3, 4), "w": (4,)},
        lambda x, w: (x * w).mean(0),
    ),
    "centered": (
        {"x": "Tensor[..., N, K]"},
        "x - mean(x, dim=-2, keepdim=true)",
        {"x": (2, 3, 4)},
        lambda x: x - x.mean(-2, keepdim=True),
    ),
    "row_max": (
        {"x": "Tensor[..., N]"},
        "amax(x, dim=-1)",
        {"x": (2, 5)},
        lambda x: x.amax(-1),
    ),
    "shift_by_max": (
        {"x": "Tensor[N, K]"},
        "x - amax(x, dim=-1, keepdim=true)",
        {"x": (3, 4)},
        lambda x: x - x.amax(-1, keepdim=True),
    ),
    "batch_matmul_shared_weight": (
        {"x": "Tensor[..., N, K]", "w": "Tensor[K, M]"},
        "tanh(x @ w)",
        {"x": (2, 3, 4), "w": (4, 5)},
        lambda x, w: torch.tanh(x @ w),
    ),
    "batched_affine": (
        {"x": "Tensor[..., N, K]", "w": "Tensor[M, K]", "b": "Tensor[M]"},
        "x @ w.T + b",
        {"x": (2, 3, 4), "w": (5, 4), "b": (5,)},
        lambda x, w, b: torch.nn.functional.linear(x, w, b),
    ),
    "transposed_product": (
        {"a": "Tensor[N, K]", "b": "Tensor[M, K]"},
        "(a @ b.T).T * 2",
        {"a": (3, 4), "b": (5, 4)},
        lambda a, b: (a @ b.T).T * 2,
    ),
    "swiglu_weights": (
        {"x": "Tensor[..., D]", "w": "Tensor[D, H]", "v": "Tensor[D, H]"},
        "(x @ w) * sigmoid(x @ w) * (x @ v)",
        {"x": (2, 3, 4), "w": (4, 5), "v": (4, 5)},
        lambda x, w, v: torch.nn.functional.silu(x @ w) * (x @ v),
    ),
    "vector_times_matrix": (
        {"x": "Tensor[D]", "w": "Tensor[D, H]"},
        "sum(x @ w, dim=-1, keepdim=true) * (x @ w)",
        {"x": (4,), "w": (4, 5)},
        lambda x, w: (x @ w).sum(-1, keepdim=True) * (x @ w),
    ),
    "vector_matmul_broadcast": (
        {"x": "Tensor[..., D]", "w": "Tensor[D, H]", "s": "Tensor[..., H]"},
        "(x @ w) * s",
        {"x": (3, 4), "w": (4, 5), "s": (2, 3, 5)},
        lambda x, w, s: (x @ w) * s,
    ),
    "column_logsumexp": (
        {"x": "Tensor[N, K]", "c": "Tensor[K]"},
        "logsumexp(x, dim=0) * c + sum(x, dim=-1, keepdim=true)",
        {"x": (3, 4), "c": (4,)},
        lambda x, c: torch.logsumexp(x, 0) * c + x.sum(-1, keepdim=True),
    ),
}


def spec_text(name: str, inputs: dict[str, str], formula: str) -> str:
    lines = [f"name: {name}", "inputs:"]
    lines += [f"  {n}: {t}" for n, t in inputs.items()]
    lines += ["outputs:", f"  out: {formula}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    from opgen.cli import main

    root = tmp_path_factory.mktemp("tensor_ops")
    specs = root / "specs"
    specs.mkdir()
    for name, (inputs, formula, _, _) in CASES.items():
        (specs / f"{name}.yaml").write_text(spec_text(name, inputs, formula), encoding="utf-8")
    assert main(["generate", str(specs), "-o", str(root / "tensor_ops")]) == 0
    return import_package(root, "tensor_ops")


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_gradients_and_second_order(ops, name):
    inputs, _, shapes, reference = CASES[name]
    generator = torch.Generator().manual_seed(0)
    args = [torch.randn(shapes[n], generator=generator, dtype=torch.float64, requires_grad=True) for n in inputs]
    op = getattr(ops, name)
    out = op(*args)
    expected = reference(*args)
    torch.testing.assert_close(out, expected)
    grad = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    got = torch.autograd.grad(out, args, grad)
    want = torch.autograd.grad(expected, args, grad)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradcheck(op, args)
    assert torch.autograd.gradgradcheck(op, args)


def test_amax_shares_the_gradient_among_ties_as_torch(ops):
    x = torch.tensor([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]], dtype=torch.float64, requires_grad=True)
    (got,) = torch.autograd.grad(ops.row_max(x).sum(), [x])
    (want,) = torch.autograd.grad(x.amax(-1).sum(), [x])
    torch.testing.assert_close(got, want)


def test_weight_shared_across_the_batch_gets_the_summed_gradient(ops):
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    w = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    (got,) = torch.autograd.grad(ops.batch_matmul_shared_weight(x, w).sum(), [w])
    (want,) = torch.autograd.grad(torch.tanh(x @ w).sum(), [w])
    assert got.shape == (4, 5)
    torch.testing.assert_close(got, want)


def test_softmax_family_is_safe_for_large_inputs():
    generated = import_package(ROOT, "generated")
    x = torch.tensor([[1000.0, 0.0, -1000.0], [-800.0, -800.0, -799.0]], dtype=torch.float64, requires_grad=True)
    for op, native in (
        (generated.softmax, lambda t: torch.softmax(t, -1)),
        (generated.log_softmax, lambda t: torch.log_softmax(t, -1)),
        (generated.logsumexp, lambda t: torch.logsumexp(t, -1)),
    ):
        out, expected = op(x), native(x)
        torch.testing.assert_close(out, expected)
        grad = torch.ones_like(out)
        (got,) = torch.autograd.grad(out, [x], grad)
        (want,) = torch.autograd.grad(expected, [x], grad)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want)


def test_an_input_without_a_batch_met_by_parts_with_and_without_one(tmp_path):
    """`s: Tensor[]` and `w: Tensor[K]` reach the outputs both through a batched tensor and alone. The
    parts of the gradient were added first and summed over the batch after, so the parts without the
    batch were counted once per batch entry (`d/ds` twice too large with a batch of 2). Against plain
    torch autograd, first and second derivatives."""
    from spec_ops import build_ops

    spec = """
        name: mixed
        inputs:
          s: Tensor[]
          w: Tensor[K]
          x: Tensor[..., N, K]
        outputs:
          o: (s + log_softmax(x * w, dim=-2)) / -7
          p: 2 * s + w
          q: 0.5 + p * s
    """
    op = build_ops(tmp_path, "mixed_ops", {"mixed": spec}).mixed

    def plain(s, w, x):
        p = 2 * s + w
        return (s + torch.log_softmax(x * w, -2)) / -7, p, 0.5 + p * s

    gen = torch.Generator().manual_seed(3)
    args = [torch.rand(shape, generator=gen, dtype=torch.float64).requires_grad_() for shape in ((), (4,), (2, 3, 4))]
    weights = [torch.randn(w.shape, generator=gen, dtype=torch.float64) for w in plain(*args)]

    def loss(f):
        return sum((o * w).sum() for o, w in zip(f(*args), weights, strict=True))

    got = torch.autograd.grad(loss(op), args, create_graph=True)
    want = torch.autograd.grad(loss(plain), args, create_graph=True)
    torch.testing.assert_close(got, want)
    for mine, theirs in zip(got, want, strict=True):
        second = torch.autograd.grad(mine.sum(), args, retain_graph=True, materialize_grads=True)
        torch.testing.assert_close(
            second, torch.autograd.grad(theirs.sum(), args, retain_graph=True, materialize_grads=True)
        )
    assert torch.autograd.gradcheck(op, args)


def test_a_whole_reduction_of_a_batch_used_by_a_later_output_with_the_batch(tmp_path):
    """`m = amax(l)` over a batch is one number; `q` uses it beside `l`, so the gradient of `m` is `grad_m`
    plus `q`'s part summed over the batch. Added first and summed after, `grad_m` counted once per batch
    entry. Against plain torch autograd."""
    from spec_ops import build_ops

    spec = """
        name: peak
        inputs:
          x: Tensor[..., K, M]
        let:
          l: log_softmax(expm1(x.T), dim=-2)
        outputs:
          m: amax(l) + 0.1
          q: sin(m - l) * mean(x)
    """
    op = build_ops(tmp_path, "peak_ops", {"peak": spec}).peak

    def plain(x):
        scores = torch.log_softmax(torch.expm1(x.mT), -2)
        m = scores.amax() + 0.1
        return m, torch.sin(m - scores) * x.mean()

    gen = torch.Generator().manual_seed(4)
    x = (torch.rand(2, 3, 2, generator=gen, dtype=torch.float64) - 0.5).requires_grad_()
    weights = [torch.randn(w.shape, generator=gen, dtype=torch.float64) for w in plain(x)]
    got = torch.autograd.grad(sum((o * w).sum() for o, w in zip(op(x), weights, strict=True)), x)
    want = torch.autograd.grad(sum((o * w).sum() for o, w in zip(plain(x), weights, strict=True)), x)
    torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(op, (x,))


def test_a_matrix_product_with_a_reciprocal(tmp_path):
    """`x @ (1 / w)` printed as `x @ 1 / w`, which Python reads as `(x @ 1) / w`: every call raised
    ('unsupported operand type(s) for @'). Values, gradients and forward mode against plain torch."""
    from spec_ops import build_ops

    spec = "name: inverse\ninputs:\n  x: Tensor[N, K]\n  w: Tensor[K, M]\noutputs:\n  y: x @ (1 / w)\n"
    op = build_ops(tmp_path, "inverse_ops", {"inverse": spec}).inverse
    gen = torch.Generator().manual_seed(6)
    x = torch.rand(2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(3, 4, generator=gen, dtype=torch.float64) + 1).requires_grad_()
    torch.testing.assert_close(op(x, w), x @ (1 / w))
    assert torch.autograd.gradcheck(op, (x, w))
    tangent = torch.ones_like(w)
    got = torch.func.jvp(lambda w: op(x.detach(), w), (w.detach(),), (tangent,))
    want = torch.func.jvp(lambda w: x.detach() @ (1 / w), (w.detach(),), (tangent,))
    torch.testing.assert_close(got, want)
