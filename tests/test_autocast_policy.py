"""A spec's `autocast:` policy (Note [autocast] in opgen/emit/capture.py): `lower`, `float32` or
`inputs`, as `torch.amp.custom_fwd` runs a forward, against the defaults that follow PyTorch's ops."""

from __future__ import annotations

import pytest
import torch
from spec_ops import build_ops
from test_spec_yaml import assert_round_trip

from opgen.emit.render import Renderer
from opgen.pipeline import build

PAIR = """
name: {name}
inputs:
  x: Tensor[..., K]
  w: Tensor[N, K]
outputs:
  y: x @ w.T
{policy}
"""
ELEMENTWISE = """
name: {name}
inputs:
  x: Tensor
outputs:
  y: x * tanh(x)
{policy}
"""


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    specs = {}
    for policy in ("", "lower", "float32", "inputs"):
        suffix = policy or "default"
        text = f"autocast: {policy}" if policy else ""
        specs[f"pair_{suffix}"] = PAIR.format(name=f"pair_{suffix}", policy=text)
        specs[f"tanhx_{suffix}"] = ELEMENTWISE.format(name=f"tanhx_{suffix}", policy=text)
    return build_ops(tmp_path_factory.mktemp("autocast"), "autocastops", specs)


def _step(fn, *args):
    """Forward under CPU bfloat16 autocast, backward after it: the output and the inputs' gradients."""
    xs = [a.detach().requires_grad_() for a in args]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fn(*xs)
    y.float().sum().backward()
    return y, [x.grad for x in xs]


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("pair_default", torch.bfloat16),  # `@` as torch.matmul
        ("pair_lower", torch.bfloat16),
        ("pair_float32", torch.float32),
        ("pair_inputs", torch.float32),
        ("tanhx_default", torch.float32),  # elementwise: type promotion, as PyTorch's ops
        ("tanhx_lower", torch.bfloat16),
        ("tanhx_float32", torch.float32),
        ("tanhx_inputs", torch.float32),
    ],
)
def test_a_stated_policy_sets_the_dtype_of_float32_inputs(ops, name, dtype):
    torch.manual_seed(0)
    args = (torch.randn(3, 4), torch.randn(2, 4)) if name.startswith("pair") else (torch.randn(5),)
    y, grads = _step(getattr(ops, name), *args)
    assert y.dtype == dtype
    assert all(g.dtype == torch.float32 for g in grads)  # each gradient in its input's dtype
    plain = args[0] @ args[1].T if name.startswith("pair") else args[0] * torch.tanh(args[0])
    torch.testing.assert_close(y.float(), plain, rtol=0.05, atol=0.05)


def test_float32_casts_low_precision_inputs_up_and_inputs_keeps_them(ops):
    """`float32` is custom_fwd(cast_inputs=torch.float32): bf16 inputs compute in float32; `inputs`
    runs in the inputs' own dtype with autocast off (not bf16 matmul on float32 inputs)."""
    x, w = torch.randn(3, 4, dtype=torch.bfloat16), torch.randn(2, 4, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ops.pair_float32(x, w).dtype == torch.float32
        assert ops.pair_inputs(x, w).dtype == torch.bfloat16
        assert ops.pair_inputs(x.double(), w.double()).dtype == torch.float64


def test_bilinear_and_distances_default_to_float32(golden):
    """Without `autocast:`, an op whose formulas multiply tensors beside `@` runs in float32 under
    autocast, as F.bilinear and torch.cdist do (the generated tests compare with them)."""
    sources = {path: text for path, text in golden.files.items() if path.startswith("ops/")}
    assert 'cast="float32"' in sources["ops/bilinear.py"] and 'cast="float32"' in sources["ops/rbf_kernel.py"]
    assert "cast=" not in sources["ops/linear.py"] and "cast=" not in sources["ops/attention_scores.py"]


def test_an_unknown_policy_is_a_located_error(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text(ELEMENTWISE.format(name="bad", policy="autocast: half"))
    result = build([str(spec)], Renderer())
    (message,) = result.problems.report()
    assert message.endswith("bad.yaml:7:11: autocast 'half' is not one of: lower, float32, inputs")


def test_the_policy_round_trips():
    assert_round_trip(ELEMENTWISE.format(name="op", policy="autocast: float32"))
