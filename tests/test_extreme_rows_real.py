"""An extreme row is the formula's exact value over the real numbers (Note [real rows] in opgen.plan.extremes).

The reference is the same formula in plain torch at float64: where it gives NaN (a function outside
its domain, anywhere inside the formula), the op cannot be held to a finite value, so there is no
row; where it gives a finite number, a row (if any) agrees with it.
"""

from __future__ import annotations

import math

import pytest
import torch

from opgen.errors import Problems
from opgen.pipeline import run_stages
from opgen.plan.extremes import extreme_rows
from opgen.spec.load import load_text
from opgen.spec.parse import parse_spec

FORMULAS = {
    "atan2(acos(x), 1.0)": lambda x: torch.atan2(torch.acos(x), torch.ones_like(x)),
    "abs(acos(x))": lambda x: torch.acos(x).abs(),
    "max(acos(x), 0.5)": lambda x: torch.maximum(torch.acos(x), torch.full_like(x, 0.5)),
    "sign(sqrt(x)) + 2": lambda x: torch.sign(torch.sqrt(x)) + 2,
    "floor(asin(x)) + 1": lambda x: torch.floor(torch.asin(x)) + 1,
    "where(x < 1, acos(x), 0.0)": lambda x: torch.where(x < 1, torch.acos(x.clamp(max=1)), 0.0),
}


def rows(formula: str) -> dict[float, float]:
    text = f"name: r\ninputs:\n  x: Tensor\noutputs:\n  y: {formula}\n"
    spec = parse_spec(load_text(text, "r.yaml"), "r.yaml", Problems())
    assert spec is not None
    stages = run_stages(spec, Problems(), stop_after="derive")
    assert stages is not None
    found = extreme_rows(spec, stages.oracle)
    return {point: values[0] for _, point, values, _, _ in found}


@pytest.mark.parametrize("formula", sorted(FORMULAS))
def test_rows_only_where_the_formula_is_real(formula):
    got = rows(formula)
    assert got, "a formula real near 0 has rows there"
    for point in (-1e4, -100.0, -30.0, -3.0, 0.0, 3.0, 30.0, 100.0, 1e4):
        want = FORMULAS[formula](torch.tensor(point, dtype=torch.float64)).item()
        if not math.isfinite(want):
            assert point not in got, f"{formula} at {point}: a row {got[point]} where the formula is not real"
        elif point in got:
            assert got[point] == pytest.approx(want, rel=1e-12, abs=1e-12), f"{formula} at {point}"


def test_the_branch_where_does_not_take_may_be_undefined():
    assert {3.0, 1e4} <= set(rows("where(x < 1, acos(x), 0.0)"))
