"""Literal dimension sizes, integer indexing and multiples of a dimension (Note [literal sizes] and Note
[multiples of a dimension] in opgen/formula/dims.py, Note [integer indexing] in opgen/nodes/index.py)
against torch indexing in float64: values, gradients, second derivatives, gradcheck and gradgradcheck,
forward mode, vmap, torch.compile and the custom_op form; the IoU losses of boxes and of intervals
(`specs/interval_iou_loss.yaml`) in plain torch; the call-time checks of a literal size and of a
multiple; located errors, and no misleading "needs a Tensor input" beside a refused Tensor type."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT, import_package
from spec_ops import assert_like_plain_torch, assert_located, assert_transforms_like_plain_torch, build_ops

DTYPE = torch.float64

SPECS = {
    "picks": """
        name: picks
        inputs: {m: "Tensor[N, 3, K]", s: "Tensor[3]"}
        outputs: {y: "exp(m[:, 1, :]) * s[2] + sum(m[:, -1]) * sin(m[..., 0, :]) + s[0] * sum(s)"}
    """,
    "boxes": """
        name: boxes
        inputs: {b: "Tensor[..., 4]", w: "Tensor[4]"}
        outputs: {y: "(b[..., 2] - b[..., 0]) * exp(b[..., 3] * w[1]) + sum(b * w, dim=-1)"}
        form: custom_op
    """,
}


def _picks(m, s):
    return torch.exp(m[:, 1, :]) * s[2] + m[:, -1].sum() * torch.sin(m[..., 0, :]) + s[0] * s.sum()


def _boxes(b, w):
    return (b[..., 2] - b[..., 0]) * torch.exp(b[..., 3] * w[1]) + (b * w).sum(-1)


PLAIN = {"picks": _picks, "boxes": _boxes}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return build_ops(tmp_path_factory.mktemp("index"), "index_ops", SPECS)


def _args(name, seed=0):
    g = torch.Generator().manual_seed(seed)
    if name == "picks":
        return [torch.randn(2, 3, 4, generator=g, dtype=DTYPE), torch.randn(3, generator=g, dtype=DTYPE)]
    return [torch.randn(5, 4, generator=g, dtype=DTYPE), torch.randn(4, generator=g, dtype=DTYPE)]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_values_and_derivatives_of_two_orders_match_torch_indexing(ops, name):
    assert_like_plain_torch(getattr(ops, name), PLAIN[name], _args(name))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_forward_mode_vmap_and_compile(ops, name):
    batch = [torch.stack([_args(name, seed)[k] for seed in range(3)]) for k in range(2)]
    assert_transforms_like_plain_torch(getattr(ops, name), PLAIN[name], _args(name, 1), _args(name, 2), batch)


def test_the_custom_op_form_and_the_literal_size_at_call_time(ops):
    torch.library.opcheck(torch.ops.index_ops.boxes, _args("boxes", 3))
    with pytest.raises(ValueError, match=r"boxes\(\): argument 'b' must have shape \[\.\.\., 4\], got \[5, 3\]"):
        ops.boxes(torch.zeros(5, 3, dtype=DTYPE), torch.zeros(4, dtype=DTYPE))


BOX_IOU = """
name: box_iou_loss
inputs: {b: "Tensor[..., 4]", t: "Tensor[..., 4]"}
let:
  iw: clamp(min(b[..., 0] + b[..., 2], t[..., 0] + t[..., 2]) - max(b[..., 0], t[..., 0]), 0)
  ih: clamp(min(b[..., 1] + b[..., 3], t[..., 1] + t[..., 3]) - max(b[..., 1], t[..., 1]), 0)
  inter: iw * ih
  union: b[..., 2] * b[..., 3] + t[..., 2] * t[..., 3] - inter
outputs: {loss: 1 - inter / union}
"""


def _iou_loss(b, t):
    """1 - IoU of (x, y, w, h) boxes, the overlap as torchvision's box_iou computes it, of corners."""
    b1, t1 = torch.cat([b[..., :2], b[..., :2] + b[..., 2:]], -1), torch.cat([t[..., :2], t[..., :2] + t[..., 2:]], -1)
    lo, hi = torch.maximum(b1[..., :2], t1[..., :2]), torch.minimum(b1[..., 2:], t1[..., 2:])
    inter = (hi - lo).clamp(min=0).prod(-1)
    return 1 - inter / (b[..., 2] * b[..., 3] + t[..., 2] * t[..., 3] - inter)


def test_box_and_interval_iou_losses_match_plain_torch(tmp_path):
    boxes = build_ops(tmp_path, "iou_ops", {"box_iou_loss": BOX_IOU}).box_iou_loss
    intervals = import_package(ROOT, "generated").interval_iou_loss
    g = torch.Generator().manual_seed(0)
    b, t = (torch.rand(6, 4, generator=g, dtype=DTYPE) * 2.5 + 0.5 for _ in range(2))
    assert_like_plain_torch(boxes, _iou_loss, [b, t])
    intervals_of = [torch.stack([x[:, 0], x[:, 2]], -1) for x in (b, t)]  # (start, length)
    assert_like_plain_torch(
        lambda b, t: intervals(b, t, 0.0), lambda b, t: _iou_loss(_as_box(b), _as_box(t)), intervals_of
    )


def _as_box(interval: torch.Tensor) -> torch.Tensor:
    """The interval (start, length) as the box (start, 0, length, 1): the IoU is the intervals'."""
    start, length = interval[..., 0], interval[..., 1]
    return torch.stack([start, torch.zeros_like(start), length, torch.ones_like(start)], -1)


INPUTS = '{b: "Tensor[..., 4]", x: "Tensor[N, K]", m: "Tensor[N, 4]"}'
BAD = {
    "b[..., 4]": "index 4 is outside the dimension of size 4 of [..., 4]",
    "x[..., 0]": "only a dimension of literal size can be indexed by a number, as Tensor[..., 4]; [N, K] has K",
    "m[0, 1]": "pick one entry of a dimension of literal size by one whole number",
    "b[0]": "with batch dimensions `...` index from the end",
    "b[..., k]": "`k` is no index: write a whole number (b[..., 0] of Tensor[..., 4]) or a slice",
    "m[..., 1.5]": "`1.5` is no index",
}


@pytest.mark.parametrize("formula", sorted(BAD))
def test_bad_indexes_are_located_with_a_fix(tmp_path, formula):
    assert_located(tmp_path, INPUTS, formula, BAD[formula])


def test_a_refused_tensor_type_is_the_only_error(tmp_path):
    """`Tensor[..., 0]` is refused; the op then has only a float input left, which is no second problem."""
    from opgen.pipeline import plan_all

    spec = tmp_path / "boxes.yaml"
    spec.write_text("name: boxes\ninputs:\n  b: Tensor[..., 0]\n  eps: float = 1e-7\noutputs:\n  y: b * eps\n")
    _, problems = plan_all([str(spec)])
    report = problems.report()
    assert len(report) == 1, report
    assert report[0].startswith(f"{spec}:3:6:") and "a literal dimension size is a whole number from 2" in report[0]


# -- multiples of a dimension (Note [multiples of a dimension] in opgen/formula/dims.py) ----------------------

HALVES = {
    "halves": """
        name: halves
        inputs: {x: "Tensor[..., 2*H]", w: "Tensor[H]"}
        outputs: {y: "x[..., :H] * sigmoid(x[..., H:]) * w / sqrt(H)"}
    """,
    "twice": """
        name: twice
        inputs: {a: "Tensor[N, K]", b: "Tensor[N, 2*K]"}
        outputs: {y: "cat([a, exp(a)], dim=-1) * b"}
    """,
}


@pytest.fixture(scope="module")
def halves(tmp_path_factory):
    return build_ops(tmp_path_factory.mktemp("halves"), "halves_ops", HALVES)


def test_a_declared_multiple_is_cut_in_its_parts(halves):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 8, generator=g, dtype=DTYPE), torch.randn(4, generator=g, dtype=DTYPE)
    assert_like_plain_torch(halves.halves, lambda x, w: torch.nn.functional.glu(x, -1) * w / 2, [x, w])
    a, b = torch.randn(3, 4, generator=g, dtype=DTYPE), torch.randn(3, 8, generator=g, dtype=DTYPE)
    assert_like_plain_torch(halves.twice, lambda a, b: torch.cat([a, a.exp()], -1) * b, [a, b])


def test_the_call_time_check_of_a_multiple(halves):
    with pytest.raises(ValueError, match=r"argument 'x' must have shape \[\.\.\., 2\*H\], got \[2, 7\]"):
        halves.halves(torch.zeros(2, 7, dtype=DTYPE), torch.zeros(3, dtype=DTYPE))
    with pytest.raises(ValueError, match=r"argument 'w' must have shape \[H\] with H=4 \(from 'x'\), got \[3\]"):
        halves.halves(torch.zeros(2, 8, dtype=DTYPE), torch.zeros(3, dtype=DTYPE))


@pytest.mark.parametrize(
    ("inputs", "formula", "expected"),
    [
        ('{x: "Tensor[..., 2*H]"}', "x[..., :3]", "a slice bound is a fraction of H's size such as `H // 2`"),
        ('{x: "Tensor[..., 2*H]", y: "Tensor[..., H]"}', "x * y", "cannot broadcast [..., 2*H] with [..., H]"),
    ],
)
def test_multiples_are_refused_located_where_they_do_not_fit(tmp_path, inputs, formula, expected):
    assert_located(tmp_path, inputs, formula, expected)
