"""Reductions over several dims and every dim, `var`/`std` (with `correction=`), `norm`, `xlogy`, `Tensor[]`.

Each spec is generated into a temporary package; the op must equal plain torch (an independent
reference) in value, gradient and forward-mode derivative, and pass gradcheck and gradgradcheck.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import import_package
from spec_ops import build_ops

CASES = {
    # name: (inputs, formula, shapes, torch reference)
    "instance_norm": (
        {"x": "Tensor[N, C, H, W]"},
        "(x - mean(x, dim=(2, 3), keepdim=true)) / sqrt(var(x, dim=(2, 3), keepdim=true, correction=0) + 1e-5)",
        {"x": (2, 3, 4, 5)},
        lambda x: torch.nn.functional.instance_norm(x, eps=1e-5),
    ),
    "sum_every_dim": ({"x": "Tensor[N, K]"}, "sum(x * x)", {"x": (3, 4)}, lambda x: (x * x).sum()),
    "sum_every_dim_batch": ({"x": "Tensor[..., K]"}, "sum(exp(x))", {"x": (2, 3, 4)}, lambda x: x.exp().sum()),
    "mean_every_dim": (
        {"x": "Tensor[N, K]", "w": "Tensor[K]"},
        "mean(x * w)",
        {"x": (3, 4), "w": (4,)},
        lambda x, w: (x * w).mean(),
    ),
    "mean_every_dim_keepdim": (
        {"x": "Tensor[N, K]"},
        "x - mean(x, keepdim=true)",
        {"x": (3, 4)},
        lambda x: x - x.mean(),
    ),
    "sum_every_dim_beside_a_batch": (
        {"f": "Tensor[M]", "x": "Tensor[..., N, K]"},
        "x @ x.T + sum(f, dim=-1) + amax(x)",
        {"f": (4,), "x": (2, 3, 5)},
        lambda f, x: x @ x.mT + f.sum(-1) + x.amax(),
    ),
    "sum_every_dim_of_a_smaller_batch": (
        {"a": "Tensor[..., K]", "b": "Tensor[..., K]"},
        "sum(a) * b",
        {"a": (3, 4), "b": (2, 3, 4)},
        lambda a, b: a.sum() * b,
    ),
    "amax_every_dim_batch": ({"x": "Tensor[..., K]"}, "amax(x)", {"x": (2, 5)}, lambda x: x.amax()),
    "mean_two_dims": (
        {"x": "Tensor[..., N, K]"},
        "mean(x, dim=(-1, -2))",
        {"x": (2, 3, 4)},
        lambda x: x.mean((-2, -1)),
    ),
    "logsumexp_two_dims": (
        {"x": "Tensor[..., N, K]"},
        "logsumexp(x, dim=(-2, -1), keepdim=true) * x",
        {"x": (2, 3, 4)},
        lambda x: torch.logsumexp(x, (-2, -1), keepdim=True) * x,
    ),
    "amax_two_dims": (
        {"x": "Tensor[N, K, M]"},
        "amax(x, dim=(0, 2))",
        {"x": (3, 4, 5)},
        lambda x: x.amax((0, 2)),
    ),
    "var_default_correction": (
        {"x": "Tensor[N, K]"},
        "var(x, dim=0) * 2",
        {"x": (3, 4)},
        lambda x: x.var(0) * 2,
    ),
    "std_two_dims": (
        {"x": "Tensor[..., N, K]"},
        "std(x, dim=(-2, -1), correction=0)",
        {"x": (2, 3, 4)},
        lambda x: x.std((-2, -1), correction=0),
    ),
    "var_every_dim": ({"x": "Tensor[N, K]"}, "var(x, correction=2)", {"x": (3, 4)}, lambda x: x.var(correction=2)),
    "norm_last": (
        {"x": "Tensor[..., K]"},
        "x / norm(x, dim=-1, keepdim=true)",
        {"x": (2, 3, 4)},
        lambda x: x / torch.linalg.vector_norm(x, dim=-1, keepdim=True),
    ),
    "norm_every_dim": (
        {"x": "Tensor[N, K]"},
        "norm(x) * x",
        {"x": (3, 4)},
        lambda x: torch.linalg.vector_norm(x) * x,
    ),
    "scale_norm": (
        {"x": "Tensor[..., D]", "g": "Tensor[]"},
        "g * x / norm(x, dim=-1, keepdim=true)",
        {"x": (2, 3, 4), "g": ()},
        lambda x, g: g * x / torch.linalg.vector_norm(x, dim=-1, keepdim=True),
    ),
    "xlogy_pair": (
        {"p": "Tensor", "q": "Tensor"},
        "xlogy(p, q) + xlogy(2, q)",
        {"p": (3, 4), "q": (3, 4)},
        lambda p, q: torch.xlogy(p, q) + torch.xlogy(2, q),
    ),
    "xlogy_only": ({"p": "Tensor", "q": "Tensor"}, "xlogy(p, q)", {"p": (3,), "q": (3,)}, torch.xlogy),
    "var_factor_out": (  # a kept-dim var taken out of a sum keeps its correction
        {"x": "Tensor[..., D]"},
        "sum(x * std(x, dim=-1, keepdim=true, correction=0) * var(x, dim=-1, keepdim=true), dim=-1)",
        {"x": (2, 5)},
        lambda x: (x * x.std(-1, keepdim=True, correction=0) * x.var(-1, keepdim=True)).sum(-1),
    ),
}

POSITIVE = {"xlogy_pair", "xlogy_only"}  # log needs positive arguments


def spec_text(name: str, inputs: dict[str, str], formula: str) -> str:
    lines = [f"name: {name}", "inputs:"]
    lines += [f"  {n}: {t}" for n, t in inputs.items()]
    lines += ["outputs:", f"  out: {formula}"]
    if name in POSITIVE:
        lines += ["tests:", "  domain: {" + ", ".join(f"{n}: [0.1, 3]" for n in inputs) + "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    from opgen.cli import main

    root = tmp_path_factory.mktemp("reduction_ops")
    specs = root / "specs"
    specs.mkdir()
    for name, (inputs, formula, _, _) in CASES.items():
        (specs / f"{name}.yaml").write_text(spec_text(name, inputs, formula), encoding="utf-8")
    assert main(["generate", str(specs), "-o", str(root / "reduction_ops")]) == 0
    return import_package(root, "reduction_ops")


def _inputs(name: str, generator: torch.Generator) -> list[torch.Tensor]:
    inputs, _, shapes, _ = CASES[name]
    args = [torch.randn(shapes[n], generator=generator, dtype=torch.float64) for n in inputs]
    if name in POSITIVE:
        args = [a.abs() + 0.1 for a in args]
    return [a.requires_grad_() for a in args]


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_gradients_and_tangents(ops, name):
    reference = CASES[name][3]
    generator = torch.Generator().manual_seed(0)
    args = _inputs(name, generator)
    op = getattr(ops, name)
    out, expected = op(*args), reference(*args)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected)
    grad = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(out, args, grad), torch.autograd.grad(expected, args, grad), strict=True):
        torch.testing.assert_close(a, b)
    tangents = tuple(torch.randn(a.shape, generator=generator, dtype=torch.float64) for a in args)
    plain = [a.detach() for a in args]
    _, got = torch.func.jvp(op, tuple(plain), tangents)
    _, want = torch.func.jvp(reference, tuple(plain), tangents)
    torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(op, args, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(op, args)


def test_norm_gradient_is_zero_at_zero_as_torch(ops):
    x = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)
    (got,) = torch.autograd.grad(ops.norm_every_dim(x).sum(), [x])
    w = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)
    (want,) = torch.autograd.grad((torch.linalg.vector_norm(w) * w).sum(), [w])
    torch.testing.assert_close(got, want)


def test_xlogy_is_zero_where_its_first_argument_is_zero(ops):
    p = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64, requires_grad=True)
    q = torch.tensor([0.0, 2.0, 2.0], dtype=torch.float64, requires_grad=True)
    out = ops.xlogy_only(p, q)
    torch.testing.assert_close(out, torch.xlogy(p, q))
    assert out[0] == 0
    (got,) = torch.autograd.grad(out.sum(), [p])
    (want,) = torch.autograd.grad(torch.xlogy(p, q).sum(), [p])
    torch.testing.assert_close(got, want)  # 0 at p = q = 0, log(q) at p = 0 < q: torch's choices


def test_scalar_input_is_checked_at_call_time(ops):
    with pytest.raises(ValueError, match="argument 'g' must have shape \\[\\], got \\[1\\]"):
        ops.scale_norm(torch.randn(2, 4), torch.ones(1))


def _generate(folder, specs: dict[str, str]):
    from opgen.cli import main

    (folder / "specs").mkdir()
    for name, text in specs.items():
        (folder / "specs" / f"{name}.yaml").write_text(text, encoding="utf-8")
    assert main(["generate", str(folder / "specs"), "-o", str(folder / "forms"), "--no-cache"]) == 0
    return import_package(folder, "forms")


def test_p_log_p_is_zero_at_zero_and_its_sum_the_negative_entropy(tmp_path):
    """`p * log(p)` -> `xlogy(p, p)`: 0 at p = 0 (the limit), where plain autograd gives NaN;
    over a sum, torch.special.entr summed and negated, with log(p) + 1 as gradient wherever p > 0."""
    tests = "tests:\n  domain: {p: [0, 1]}\n"
    package = _generate(
        tmp_path,
        {
            "plogp": f"name: plogp\ninputs: {{p: Tensor}}\noutputs:\n  y: p * log(p)\n{tests}",
            "negent": f'name: negent\ninputs: {{p: "Tensor[..., N]"}}\noutputs:\n  y: sum(p * log(p), dim=-1)\n{tests}',
        },
    )
    p = torch.tensor([[0.0, 0.25, 0.75], [0.0, 0.0, 1.0]], dtype=torch.float64, requires_grad=True)
    assert torch.isnan((p * torch.log(p)).sum(-1)).any(), "the formula as written: 0 * log(0) is NaN"
    y = package.negent(p)
    assert torch.allclose(y, -torch.special.entr(p.detach()).sum(-1), rtol=1e-15, atol=0)
    (grad,) = torch.autograd.grad(y.sum(), p)
    positive = p > 0
    assert torch.allclose(grad[positive], torch.log(p.detach()[positive]) + 1) and torch.isfinite(grad).all()
    assert torch.allclose(package.plogp(p.detach()), -torch.special.entr(p.detach()), rtol=1e-15, atol=0)
    inside = (p.detach() * 0.5 + 0.1).requires_grad_()
    assert torch.autograd.gradcheck(package.negent, (inside,)) and torch.autograd.gradgradcheck(
        package.negent, (inside,)
    )


def test_binary_entropy_is_zero_at_both_ends_and_accurate_near_them(tmp_path):
    """`(1 - p) * log(1 - p)` -> `xlog1py(1 - p, -p)` (log(1 - p) is log1p(-p) first): 0 at p = 1,
    where the formula as written is NaN, and log1p's digits where p is tiny. Reference: mpmath at
    50 digits (value) and torch.special.xlogy's conventions (gradient 0 where a term is 0 log 0)."""
    import mpmath

    text = "name: bent\ninputs: {p: Tensor}\noutputs:\n  y: -(p * log(p) + (1 - p) * log(1 - p))\n"
    package = _generate(tmp_path, {"bent": text + "tests:\n  domain: {p: [0, 1]}\n"})
    values = [0.0, 1e-30, 1e-7, 0.25, 0.5, 1 - 2**-24, 1.0]
    p = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    assert torch.isnan(-(p * torch.log(p) + (1 - p) * torch.log(1 - p))).any(), "as written: 0 * log(0)"
    y = package.bent(p)
    mpmath.mp.dps = 50
    for got, value in zip(y.tolist(), values, strict=True):
        terms = [mpmath.mpf(q) * mpmath.log(mpmath.mpf(q)) for q in (value, 1 - mpmath.mpf(value)) if q != 0]
        exact = -mpmath.fsum(terms)
        assert abs(got - float(exact)) <= 1e-15 * max(abs(float(exact)), 1e-300), (value, got, exact)
    (grad,) = torch.autograd.grad(y.sum(), p)
    inside = p.detach()[1:-1]
    assert torch.isfinite(grad).all() and grad[0] == 0 and grad[-1] == 0
    assert torch.allclose(grad[1:-1], torch.log1p(-inside) - torch.log(inside), rtol=1e-12)
    for dtype in (torch.float32, torch.float64):
        assert torch.isfinite(package.bent(torch.tensor([0.0, 1.0], dtype=dtype))).all()
    middle = torch.rand(5, dtype=torch.float64).mul(0.8).add(0.1).requires_grad_()
    assert torch.autograd.gradcheck(package.bent, (middle,)) and torch.autograd.gradgradcheck(package.bent, (middle,))


def test_entropy_of_a_softmax_is_finite_at_large_logits(tmp_path):
    """-sum(softmax(u) * log(softmax(u))) goes through log_softmax: finite at logits of ±1e4, where
    the formula as written is NaN, and equal to PyTorch's Categorical entropy, value and gradient."""
    q = "exp(u - logsumexp(u, dim=-1, keepdim=true))"
    text = f'name: ent\ninputs: {{u: "Tensor[..., N]"}}\noutputs:\n  y: -sum({q} * log({q}), dim=-1)\n'
    package = _generate(tmp_path, {"ent": text})
    logits = [[1e4, -1e4, 0.0], [0.5, -1.0, 2.0], [-1e4, -1e4, -1e4], [30.0, -30.0, 1e4]]
    for dtype in (torch.float32, torch.float64):
        u = torch.tensor(logits, dtype=dtype, requires_grad=True)
        plain = -(torch.softmax(u, -1) * torch.log(torch.softmax(u, -1))).sum(-1)
        assert torch.isnan(plain).any(), "the formula as written at ±1e4"
        exact = u.detach().double().requires_grad_()
        reference = torch.distributions.Categorical(logits=exact).entropy()
        (expected,) = torch.autograd.grad(reference.sum(), exact)
        y = package.ent(u)
        (grad,) = torch.autograd.grad(y.sum(), u)
        assert torch.allclose(y.double(), reference.detach(), atol=1e-5)
        assert torch.isfinite(grad).all() and torch.allclose(grad.double(), expected, atol=1e-5)


def test_xlogy_of_numbers_stands_as_one_term(tmp_path):
    """`n / xlogy(K, n)` of numbers printed `n / K * math.log(n)`: the number form of xlogy (and of xlog1py, the
    rewrite of `K * log1p(a)`) is a product, in parentheses where the call was."""
    formula = "n / xlogy(K, n) + exp(a / xlogy(a, n)) + n / (K * log1p(a)) + sum(x)"
    spec = f"name: numbers\ninputs:\n  x: Tensor[..., K]\n  n: int = 3\n  a: float = 0.5\noutputs:\n  y: {formula}\n"
    op = build_ops(tmp_path, "xlogy_numbers", {"numbers": spec}).numbers
    x = torch.rand(2, 4, dtype=torch.float64)
    want = 3 / (4 * math.log(3)) + math.exp(0.5 / (0.5 * math.log(3))) + 3 / (4 * math.log1p(0.5)) + x.sum()
    torch.testing.assert_close(op(x, 3, 0.5), want)
