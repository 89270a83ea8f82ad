"""A reduction whose operand is a number once the lets are read in (`where(l != l, x @ x.T, 100)` with
`l = std(x) - std(x)`) reduces the number over the shape the operand has as written, as torch does
(Note [reductions of constant dimensions] in opgen/formula/written.py); it was refused with an
internal error (SymPy's str() of opgen's MatMul), then as "a number over entries counted at call time"."""

from __future__ import annotations

import sympy
import torch
from spec_ops import build_ops

from opgen.formula.tensor import MatMul

SPEC = """
    name: op
    inputs:
      x: Tensor[N, K]
    let:
      s: std(x)
      l: s - s
    outputs:
      o: sum(where(l != l <= 100, x @ x.T, 100), dim=-2, keepdim=true)
      y: x * 2
"""


def test_a_reduction_of_a_number_over_declared_dimensions(tmp_path):
    ops = build_ops(tmp_path, "constant_reduction", {"op": SPEC})
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    o, y = ops.op(x)
    l = x.std() - x.std()  # noqa: E741
    want = torch.where((l != l) & (l <= 100), x @ x.T, 100.0).sum(-2, keepdim=True)
    assert o.shape == want.shape == (1, 3)
    torch.testing.assert_close(o, want)
    (g,) = torch.autograd.grad((o * torch.arange(3.0, dtype=torch.float64)).sum() + y.sum(), x)
    torch.testing.assert_close(g, torch.full_like(x, 2.0))


def test_str_of_a_formula_with_a_matrix_product():
    a, b = sympy.symbols("a b", real=True)
    assert str(sympy.sin(MatMul(a + b, b))) == "sin((a + b) @ b)"
