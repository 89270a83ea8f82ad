"""Forward mode (torch.func.jvp) where a tangent is smaller than its output, and where an output is an
input broadcast to its shape as written; and the generated tests' plain-torch reference of a chain of
comparisons. Each op against torch.func.jvp of the same formula in plain torch."""

from __future__ import annotations

import importlib
import itertools
import math

import torch
from spec_ops import build_ops

ONE_INPUT = """\
name: narrow
inputs:
  x: Tensor
  b: bool = false
outputs:
  o: 2.5 * x
  p: b * b * x
  q: sum(digamma(10 * (p / (1 + abs(p))) + 50)) - (p / o) ** 2
"""
# `where(c, x1, x1)` is x1 broadcast with x0 and x2 as written: forward returned an expanded view of x1.
ALIASED = """\
name: aliased
inputs:
  x1: Tensor
  x2: Tensor
  x0: Tensor
outputs:
  o0: where(x1 != max(max(x0, abs(x2)), max(x1, x0)) >= round(x1), x1, x1)
  o1: relu6(o0)
  o2: clamp(o1 * x0 + clamp(x2, 0, 1), x0, x0 + abs(x0))
"""


def test_a_tangent_through_a_reduction_is_widened_to_its_output(tmp_path):
    """`q`'s second term is a number once simplified (p / o is b * b / 2.5) but has x's shape as written; its
    tangent, the sum's, is a scalar: torch refused it ('a forward gradient that has a different size')."""
    op = build_ops(tmp_path, "narrow_ops", {"narrow": ONE_INPUT}).narrow
    x, t = torch.rand(4, dtype=torch.float64) + 0.5, torch.rand(4, dtype=torch.float64)

    def plain(x: torch.Tensor, b: bool) -> tuple[torch.Tensor, ...]:
        o, p = 2.5 * x, int(b) * int(b) * x
        return o, p, torch.digamma(10 * (p / (1 + p.abs())) + 50).sum() - (p / o) ** 2

    for b in (False, True):
        got = torch.func.jvp(lambda x, b=b: op(x, b), (x,), (t,))
        want = torch.func.jvp(lambda x, b=b: plain(x, b), (x,), (t,))
        torch.testing.assert_close(got, want)


def test_an_input_broadcast_to_its_output_under_forward_mode(tmp_path):
    """Every tangent, every broadcast of the three inputs: forward mode raised ('more than one element of
    the written-to tensor refers to a single memory location', or a tangent of the input's own shape)."""
    op = build_ops(tmp_path, "aliased_ops", {"aliased": ALIASED}).aliased
    shapes = [(3, 4), (4,), (), (2, 3, 4)]
    generator = torch.Generator().manual_seed(5)
    for chosen in itertools.product(shapes, repeat=3):
        xs = [torch.rand(s, generator=generator, dtype=torch.float64) * 2 - 0.5 for s in chosen]
        for k in range(3):

            def moved(t: torch.Tensor, k: int = k, xs: list[torch.Tensor] = xs) -> tuple[torch.Tensor, ...]:
                return op(*[t if i == k else x for i, x in enumerate(xs)])

            _, tangents = torch.func.jvp(moved, (xs[k],), (torch.ones_like(xs[k]),))
            outputs = moved(xs[k])
            assert [t.shape for t in tangents] == [o.shape for o in outputs], (chosen, k)
    x1, x2, x0 = (torch.rand(s, dtype=torch.float64, requires_grad=True) for s in ((4,), (2, 3, 4), (3, 4)))
    assert torch.autograd.gradcheck(op, (x1, x2, x0))


def test_the_reference_of_a_chain_of_comparisons_compares_elementwise(tmp_path):
    """The generated tests' reference wrote `x1 != m >= round(x1)` as Python's chain, whose `and` raised
    'Boolean value of Tensor with more than one value is ambiguous': the op was right, its tests failed."""
    build_ops(tmp_path, "chain_ops", {"aliased": ALIASED})
    reference = importlib.import_module("chain_ops.tests.test_aliased").reference
    x1, x2, x0 = (torch.rand(3, 4, dtype=torch.float64) for _ in range(3))
    got = reference(x1, x2, x0)
    torch.testing.assert_close(got["o0"], x1)


def test_an_output_that_is_an_input_only_when_an_optional_one_is_none(tmp_path):
    """`o: x + 2 * p` is `x` itself when p is None; its tangent was never widened, and with p broadcasting
    x up forward mode raised ('a forward gradient that has a different size')."""
    spec = "name: maybe\ninputs:\n  x: Tensor\n  p: Tensor?\noutputs:\n  f: erfc(x) + 1 / x\n  o: x + 2 * p\n"
    op = build_ops(tmp_path, "maybe_ops", {"maybe": spec}).maybe
    for sx, sp in [((4,), (3, 4)), ((3, 4), (4,)), ((), (2, 3)), ((3, 4), (3, 4))]:
        x, p = torch.rand(sx, dtype=torch.float64) + 1, torch.rand(sp, dtype=torch.float64)
        outputs = op(x, p)
        _, along_x = torch.func.jvp(lambda t, p=p: op(t, p), (x,), (torch.ones_like(x),))
        _, along_p = torch.func.jvp(lambda t, x=x: op(x, t), (p,), (torch.ones_like(p),))
        for tangents in (along_x, along_p):
            assert [t.shape for t in tangents] == [o.shape for o in outputs], (sx, sp)
        _, tangents = torch.func.jvp(lambda t: op(t, None), (x,), (torch.ones_like(x),))
        torch.testing.assert_close(tangents[1], torch.ones_like(x))


def test_an_output_broadcast_as_written_is_a_fresh_tensor(tmp_path):
    """`where(False, x, exp2(var(x)))` is a number broadcast to x's shape as written. Forward returned it
    as an expanded view: an in-place op on the output, and torch.func.jvp (which writes the tangent into
    the output's layout), raised 'more than one element of the written-to tensor refers to a single
    memory location'. Against plain torch of the formula."""
    spec = "name: spread\ninputs:\n  x: Tensor\noutputs:\n  y: where(False, x, exp2(var(x)))\n"
    op = build_ops(tmp_path, "spread_ops", {"spread": spec}).spread

    def plain(x: torch.Tensor) -> torch.Tensor:
        return torch.where(torch.tensor(False), x, torch.exp2(x.var()))

    x, t = torch.rand(3, 4, dtype=torch.float64), torch.rand(3, 4, dtype=torch.float64)
    torch.testing.assert_close(torch.func.jvp(op, (x,), (t,)), torch.func.jvp(plain, (x,), (t,)))
    torch.testing.assert_close(op(x).add_(1), plain(x) + 1)


def test_a_temporary_that_is_a_number_in_one_variant_and_a_tensor_in_another(tmp_path):
    """jvp's variants (p None or not) number their temporaries alike: `jvp5` was a Python float when p is
    None and a tensor otherwise, and one printer for both printed `torch.abs(jvp5)` on the float
    ('abs(): argument 'input' must be Tensor, not float'). Against torch.func.jvp of plain torch."""
    spec = """\
name: mixed
inputs:
  a: float = 0.5
  p: Tensor[M]?
  x: Tensor[M, K]
outputs:
  o: softmax(sum(x, dim=1), dim=-1)
  q: tanh(log(sigmoid(a)) / (1 + abs(log(sigmoid(a))))) * o + norm(p * o)
"""
    op = build_ops(tmp_path, "variant_ops", {"mixed": spec}).mixed

    def plain(a: float, p: torch.Tensor | None, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        o = torch.softmax(x.sum(1), -1)
        s = torch.log(torch.sigmoid(torch.tensor(a, dtype=torch.float64)))
        q = torch.tanh(s / (1 + s.abs())) * o
        return o, q if p is None else q + torch.linalg.vector_norm(p * o, dim=-1)

    generator = torch.Generator().manual_seed(2)
    x, t = (torch.rand(3, 4, generator=generator, dtype=torch.float64) for _ in range(2))
    for p in (None, torch.rand(3, generator=generator, dtype=torch.float64)):
        got = torch.func.jvp(lambda x, p=p: op(0.5, p, x), (x,), (t,))
        want = torch.func.jvp(lambda x, p=p: plain(0.5, p, x), (x,), (t,))
        torch.testing.assert_close(got, want)


def test_a_number_temporary_of_one_variant_numbered_as_a_tensor_of_another(tmp_path):
    """The printer jvp's variants start from knows every variant's temporaries: `jvp8_` (a number
    of bool arguments when p is None) was taken for the tensor `jvp8` of the other variant, and
    the condition it reads printed `(a <= b) & (b < c)` on Python numbers, so `torch.where` got a
    bool ('where() received an invalid combination of arguments'). Against plain torch."""
    spec = """\
name: op
inputs:
  b1: bool = false
  b0: bool = false
  x0: Tensor
  p0: Tensor?
let:
  l0: "where(atan2(b1, 2) <= b0 < b1 / (0.25 + cosh(sin(b1))), x0, b0)"
outputs:
  o0: "log(exp(x0) + exp(l0)) ** (-1)"
  o2: "log(1 + exp(l0 * atan2(x0, 3.25))) + p0 * o0"
optimize: {rewrite: false}
"""
    op = build_ops(tmp_path, "bool_variants", {"op": spec}).op

    def plain(b1: bool, b0: bool, x0: torch.Tensor, p0: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        inside = math.atan2(b1, 2) <= b0 < b1 / (0.25 + math.cosh(math.sin(b1)))
        l0 = x0 if inside else torch.full_like(x0, float(b0))
        o0 = torch.log(torch.exp(x0) + torch.exp(l0)) ** -1
        o2 = torch.log(1 + torch.exp(l0 * torch.atan2(x0, torch.tensor(3.25, dtype=x0.dtype))))
        return o0, o2 if p0 is None else o2 + p0 * o0

    generator = torch.Generator().manual_seed(3)
    x, t = (torch.rand(5, generator=generator, dtype=torch.float64) for _ in range(2))
    for b1, b0 in ((False, False), (True, False), (True, True)):
        for p in (None, torch.rand(5, generator=generator, dtype=torch.float64)):
            got = torch.func.jvp(lambda x, b1=b1, b0=b0, p=p: op(b1, b0, x, p), (x,), (t,))
            want = torch.func.jvp(lambda x, b1=b1, b0=b0, p=p: plain(b1, b0, x, p), (x,), (t,))
            torch.testing.assert_close(got, want)
