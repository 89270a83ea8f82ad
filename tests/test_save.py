"""Save-versus-recompute policies (opgen/optimize/save.py, Note [save policies])."""

from __future__ import annotations

import sympy
import torch
from conftest import generate_op, import_package

from opgen.optimize.save import cost

TANHSHRINK = "name: op\ninputs:\n  x: Tensor\noutputs:\n  y: x - tanh(x)\n"
# The same through a `let`: forward computes tanh(x) before the outputs, so it cannot be hidden.
TANHSHRINK_LET = "name: op\ninputs:\n  x: Tensor\nlet:\n  t: tanh(x)\noutputs:\n  y: x - t\n"
SIGMOID = "name: op\ninputs:\n  x: Tensor\noutputs:\n  y: 1 / (1 + exp(-x))\n"


def _policy(policy: str) -> str:
    return f"optimize:\n  policy: {policy}\n"


def test_every_policy_saves_tanh_as_a_hidden_output(tmp_path):
    for text in (TANHSHRINK, TANHSHRINK + _policy("speed"), TANHSHRINK + _policy("memory")):
        source = generate_op(tmp_path, text)
        assert "saved_tanh = torch.tanh(x)\n        y = x - saved_tanh\n        return y, saved_tanh" in source
        assert "ctx.save_for_backward(saved_tanh)" in source and "tmp0 = saved_tanh**2" in source
        assert "return function.apply(x)[0]" in source


def test_balanced_and_speed_read_the_output_instead_of_recomputing_tanh(tmp_path):
    for text in (TANHSHRINK_LET, TANHSHRINK_LET + _policy("speed")):
        source = generate_op(tmp_path, text)
        assert "ctx.save_for_backward(x, y)" in source and "grad_y * (x - y) ** 2" in source


def test_memory_policy_saves_only_the_input(tmp_path):
    source = generate_op(tmp_path, TANHSHRINK_LET + _policy("memory"))
    assert "ctx.save_for_backward(x)" in source and "torch.tanh(x) ** 2" in source


def test_output_instead_of_input_when_it_costs_no_memory(tmp_path):
    for policy in ("memory", "balanced", "speed"):
        source = generate_op(tmp_path, SIGMOID + _policy(policy))
        assert "ctx.save_for_backward(y)" in source, policy


def test_every_way_gives_the_same_gradients_of_every_order(tmp_path, run_cli):
    spec = tmp_path / "specs" / "tanhshrink.yaml"
    spec.parent.mkdir()
    x = torch.linspace(-4, 4, 9, dtype=torch.float64, requires_grad=True)
    results = []
    for policy, text in (("memory", TANHSHRINK_LET), ("speed", TANHSHRINK_LET), ("balanced", TANHSHRINK)):
        spec.write_text(text.replace("name: op", "name: tanhshrink"))
        out = tmp_path / f"{policy}_{len(results)}" / "ops_pkg"
        assert run_cli("generate", str(spec.parent), "-o", str(out), "--policy", policy)[0] == 0
        op = import_package(out.parent, "ops_pkg").tanhshrink
        (first,) = torch.autograd.grad(op(x).sum(), x, create_graph=True)
        (second,) = torch.autograd.grad(first.sum(), x)
        assert torch.autograd.gradgradcheck(op, (x,))
        results.append((first.detach(), second))
    torch.testing.assert_close(results[0], results[1])
    torch.testing.assert_close(results[0], results[2])
    torch.testing.assert_close(results[0][0], torch.tanh(x.detach()) ** 2)


def test_bad_policy_is_a_located_error(tmp_path, run_cli):
    (tmp_path / "op.yaml").write_text(TANHSHRINK + _policy("fast"))
    status, _, err = run_cli("generate", str(tmp_path / "op.yaml"), "-o", str(tmp_path / "out"))
    assert status == 2
    assert "op.yaml:7:11: optimize.policy 'fast' is not one of: balanced, memory, speed" in err


def test_cost_counts_shared_subexpressions_once_and_tanh_dearly():
    x, y = sympy.symbols("x y", real=True)
    assert cost([sympy.tanh(x) ** 2]) > 5 * cost([(x - y) ** 2])
    assert cost([sympy.exp(x) + 1, sympy.exp(x) * 2]) < 2 * cost([sympy.exp(x) + 1])


def test_an_output_stands_in_for_a_call_only_where_it_holds_the_call_linearly(tmp_path, run_cli):
    # `floor(tanh(x))` uses tanh(x), but not linearly: y - floor(0) is not tanh(x) where x < 0.
    spec = tmp_path / "op.yaml"
    spec.write_text("name: op\ninputs:\n  x: Tensor\n  b: Tensor?\noutputs:\n  y: tanh(x) + floor(tanh(x)) + b\n")
    assert run_cli("generate", str(spec), "-o", str(tmp_path / "floor_pkg"), "--policy", "balanced")[0] == 0
    op = import_package(tmp_path, "floor_pkg").op
    x = torch.linspace(-3, 3, 13, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(13, dtype=torch.float64)
    (got,) = torch.autograd.grad(op(x, b).sum(), x)
    plain = x.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad((torch.tanh(plain) + torch.floor(torch.tanh(plain))).sum(), plain)
    torch.testing.assert_close(got, want)


def test_amax_tie_mask_never_compares_with_a_rounded_stand_in(tmp_path, run_cli):
    # `amax(a) == o2 - sum(p) / 2` holds in the reals, not in floats: no entry would tie, and the gradient
    # of amax (its mask over the count of ties) would be 0 / 0.
    spec = tmp_path / "op.yaml"
    spec.write_text(
        "name: op\ninputs:\n  x: Tensor[N, K]\n  p: Tensor[M]?\n  t: Tensor[K]\noutputs:\n  o0: tanh(t)\n"
        "  o2: amax(atan2(x, 1.5), dim=1, keepdim=true) + 0.5 * sum(p, dim=-1)\n"
    )
    assert run_cli("generate", str(spec), "-o", str(tmp_path / "amax_pkg"), "--policy", "balanced")[0] == 0
    op = import_package(tmp_path, "amax_pkg").op
    generator = torch.Generator().manual_seed(3)
    for _ in range(10):
        x = torch.randn(3, 4, generator=generator, dtype=torch.float64, requires_grad=True)
        p, t = 10 * torch.randn(2, generator=generator, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
        (got,) = torch.autograd.grad(op(x, p, t)[1].sum(), x)
        plain = x.detach().clone().requires_grad_()
        (want,) = torch.autograd.grad(torch.atan2(plain, torch.tensor(1.5)).amax(1, keepdim=True).sum(), plain)
        torch.testing.assert_close(got, want)
