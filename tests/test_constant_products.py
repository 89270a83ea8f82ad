"""An operand of `@` or `.T` that SymPy simplifies to something narrower than it is as written
(`where(l < l, x, l)` is `l` whatever `l` is, but torch broadcasts it to the shape of `x`) is multiplied
as written, as torch does (Note [products along a constant inner dimension] in opgen/formula/written.py).
It was refused: "`@` needs operands with at least two dimensions; [] has 0"."""

from __future__ import annotations

import pytest
import torch
from spec_ops import build_ops

from opgen.emit.render import Renderer
from opgen.pipeline import build

LETS = {
    "sum": ("sum(x)", lambda x: x.sum()),
    "number": ("2.5", lambda x: torch.tensor(2.5, dtype=x.dtype)),
    "column": ("mean(x, dim=-1, keepdim=true)", lambda x: x.mean(-1, keepdim=True)),
    "row": ("sum(x, dim=-2, keepdim=true)", lambda x: x.sum(-2, keepdim=True)),
}
FORMULAS = {
    "left": ("sum(where(l < l, x, l) @ x.T, dim=0)", lambda x, w: torch.where(w < w, x, w) @ x.T),
    "right": ("x.T @ where(l < l, x, l)", lambda x, w: x.T @ torch.where(w < w, x, w)),
    "both": (
        "where(l < l, x, l) @ where(l > l, x.T, l)",
        lambda x, w: torch.where(w < w, x, w) @ torch.where(w > w, x.T, w),
    ),
    "transposed": ("where(l != l, x, l).T @ x", lambda x, w: torch.where(w != w, x, w).T @ x),
}


UNBROADCASTABLE = {("both", "column"), ("both", "row")}  # torch cannot broadcast these as written
CASES = [(f, let) for f in sorted(FORMULAS) for let in sorted(LETS) if (f, let) not in UNBROADCASTABLE]


@pytest.mark.parametrize(("formula", "let"), CASES)
def test_a_narrowed_operand_is_multiplied_as_written(tmp_path, let, formula):
    let_text, let_torch = LETS[let]
    text, reference = FORMULAS[formula]
    spec = f"name: op\ninputs:\n  x: Tensor[N, D]\nlet:\n  l: {let_text}\noutputs:\n  y: {text}\n"
    ops = build_ops(tmp_path, "constant_products", {"op": spec})
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    want = reference(x, let_torch(x))
    if formula == "left":
        want = want.sum(0)
    got = ops.op(x)
    torch.testing.assert_close(got, want)
    seed = torch.randn_like(want)
    grads = [torch.autograd.grad(y, x, seed, materialize_grads=True)[0] for y in (got, want)]
    torch.testing.assert_close(*grads)


@pytest.mark.parametrize(("formula", "let"), sorted(UNBROADCASTABLE))
def test_operands_torch_cannot_broadcast_are_refused_where_written(tmp_path, formula, let):
    x = torch.randn(3, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError):  # plain torch refuses them too
        FORMULAS[formula][1](x, LETS[let][1](x))
    path = tmp_path / "op.yaml"
    path.write_text(
        f"name: op\ninputs:\n  x: Tensor[N, D]\nlet:\n  l: {LETS[let][0]}\noutputs:\n  y: {FORMULAS[formula][0]}\n"
    )
    result = build([str(path)], Renderer())
    (report,) = result.problems.report()
    assert report.startswith(f"{path}:7:6: ")


def test_a_vector_times_a_narrowed_matrix(tmp_path):
    spec = "name: op\ninputs:\n  v: Tensor[..., D]\n  m: Tensor[D, H]\nlet:\n  l: sum(m)\noutputs:\n"
    spec += "  y: v @ where(l < l, m, l)\n  z: where(l < l, v, l) @ m\n"
    ops = build_ops(tmp_path, "constant_vector_products", {"op": spec})
    v = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    m = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    s = m.sum()
    want = (v @ torch.where(s < s, m, s), torch.where(s < s, v, s) @ m)
    got = ops.op(v, m)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert torch.autograd.gradcheck(ops.op, (v, m))
