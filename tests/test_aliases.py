"""Outputs equal to an input, to a `let` or to another output (fuzz finding N3).

Each output of a generated op is its own tensor (Note [outputs that alias] in opgen.plan.backward):
an output that is another one's value gets its own gradient path, `differentiable: false`
holds for it alone. Every case is compared with plain autograd of the same formula in
float64: values, `requires_grad` of each output, first and second derivatives.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from spec_ops import build_ops

DTYPE = torch.float64

# name -> (spec without its `name:` line, plain torch of the same formula, number of Tensor inputs)
CASES: dict[str, tuple[str, Callable[..., tuple[torch.Tensor, ...]], int]] = {
    "input_not_differentiable": (
        """
        inputs: {x0: Tensor}
        outputs:
          o0: sin(x0)
          o2: {formula: x0, differentiable: false}
        """,
        lambda x0: (torch.sin(x0), x0.detach()),
        1,
    ),
    "view_not_differentiable": (  # a view of an input: autograd rebases it unless it is detached
        """
        inputs: {x0: "Tensor[N, K]", x1: "Tensor[N, K]"}
        outputs:
          o0: x1 * x0
          o1: {formula: x0.T, differentiable: false}
        """,
        lambda x0, x1: (x1 * x0, x0.T.detach()),
        2,
    ),
    "output_of_non_differentiable": (
        """
        inputs: {x: Tensor}
        outputs:
          a: {formula: x ** 2, differentiable: false}
          b: a
        """,
        lambda x: ((x**2).detach(), x**2),
        1,
    ),
    "let_chain_saved": (
        """
        inputs: {x0: Tensor}
        let:
          l0: x0
          l1: l0
        outputs:
          o0: l0 - sin(l0)
          o2: l1
        """,
        lambda x0: (x0 - torch.sin(x0), x0),
        1,
    ),
    "one_let_twice": (
        """
        inputs: {x: Tensor}
        let:
          l0: sin(x) * x
        outputs:
          a: l0
          b: l0
        """,
        lambda x: (torch.sin(x) * x, torch.sin(x) * x),
        1,
    ),
    "output_chain": (
        """
        inputs: {x: Tensor}
        outputs:
          o1: 2 * x
          o2: o1
          o3: {formula: 1 * o2, differentiable: false}
          o4: o2 * x
        """,
        lambda x: (2 * x, 2 * x, (2 * x).detach(), 2 * x * x),
        1,
    ),
    "input_twice": (
        """
        inputs: {x: Tensor, y: Tensor}
        outputs:
          a: x
          b: x
          c: x * y
        """,
        lambda x, y: (x, x, x * y),
        2,
    ),
    "input_and_saved_output": (
        """
        inputs: {x: Tensor}
        outputs:
          a: exp(x)
          b: a
          c: {formula: a, differentiable: false}
        """,
        lambda x: (torch.exp(x), torch.exp(x), torch.exp(x).detach()),
        1,
    ),
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory):
    specs = {name: f"name: {name}\n" + text.strip("\n") for name, (text, _, _) in CASES.items()}
    specs = {name: "\n".join(line.removeprefix("        ") for line in t.splitlines()) for name, t in specs.items()}
    return build_ops(tmp_path_factory.mktemp("aliases"), "alias_ops", specs)


def _inputs(count: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(count)
    return [(torch.rand(3, 4, generator=gen, dtype=DTYPE) * 2 - 1).requires_grad_() for _ in range(count)]


def _grads(outs: tuple[torch.Tensor, ...], picked: list[int], inputs: list[torch.Tensor], weights) -> list:
    """d(sum of weights[k] * outs[k] for k in picked)/d inputs, then a second-order product."""
    total = sum((outs[k] * weights[k]).sum() for k in picked)
    first = torch.autograd.grad(total, inputs, create_graph=True, allow_unused=True)
    first = [torch.zeros_like(x) if g is None else g for g, x in zip(first, inputs, strict=True)]
    scalar = sum((g * g.detach().cos()).sum() for g in first if g.requires_grad)
    if not torch.is_tensor(scalar):
        return first + [torch.zeros_like(x) for x in inputs]
    second = torch.autograd.grad(scalar, inputs, retain_graph=True, allow_unused=True)
    return first + [torch.zeros_like(x) if g is None else g for g, x in zip(second, inputs, strict=True)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_aliasing_outputs_match_plain_autograd(ops, name: str) -> None:
    _, reference, count = CASES[name]
    inputs = _inputs(count)
    outs = getattr(ops, name)(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    expected = reference(*inputs)
    assert len(outs) == len(expected)
    for k, (out, ref) in enumerate(zip(outs, expected, strict=True)):
        torch.testing.assert_close(out, ref)
        assert out.requires_grad == ref.requires_grad, f"output {k}: requires_grad {out.requires_grad}"
        assert all(out is not x for x in inputs), f"output {k} is an input tensor"
        assert all(out is not other for other in outs[:k]), f"output {k} is the same tensor as an earlier one"
    weights = [torch.rand_like(r) + 0.5 for r in expected]
    differentiable = [k for k, r in enumerate(expected) if r.requires_grad]
    for picked in [[k] for k in differentiable] + [differentiable]:
        got = _grads(outs, picked, inputs, weights)
        want = _grads(expected, picked, inputs, weights)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, msg=lambda m, p=picked: f"outputs {p}: {m}")


def test_generated_tests_of_aliasing_ops_pass(ops, tmp_path: Path) -> None:
    """The package's own generated tests agree (they call every output's backward)."""
    import subprocess
    import sys

    root = Path(ops.__file__).parent
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "tests")],
        cwd=root.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
