"""Residuals are plan data, never outputs added to the spec (Note [hidden outputs] in opgen.optimize.save).

`choose_saved` returns the gradients it rewrote and the residuals they read; the `Spec`
stays the user's. `plan` decides everything backward needs before anything prints: the
residuals it saves, and the `Tensor?` inputs it saves because backward branches on them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import SPECS
from spec_ops import build_ops

import generated  # at collection: a test may later import another package of that name
from opgen.errors import Problems
from opgen.pipeline import run_stages
from opgen.spec.load import load_file
from opgen.spec.parse import parse_spec


def _planned(path: Path):
    problems = Problems()
    spec = parse_spec(load_file(path, path.name), f"specs/{path.name}", problems)
    assert spec is not None, problems.report()
    stages = run_stages(spec, problems)
    assert stages is not None and stages.planned is not None, problems.report()
    return spec, stages.saved, stages.residuals, stages.planned.plan


@pytest.mark.parametrize("path", sorted(SPECS.glob("*.yaml")), ids=lambda p: p.stem)
def test_the_spec_stays_the_users_and_residuals_are_plan_data(path: Path) -> None:
    spec, chosen, residuals, op_plan = _planned(path)
    assert chosen.spec == spec, "choose_saved changed the spec"
    assert set(chosen.symbols.outputs) == {o.name for o in spec.outputs}
    assert op_plan.residuals == residuals
    taken = {i.name for i in spec.inputs} | {let.name for let in spec.lets} | {o.name for o in spec.outputs}
    assert not taken & {r.name for r in residuals}
    assert op_plan.returned == (*(o.name for o in spec.outputs), *(r.name for r in residuals))
    # Backward reads what the plan saves, and nothing else of forward's.
    read = {c.output for bp in op_plan.backward for g in bp.grads for c in g.contributions}
    assert read - {None} <= {o.name for o in spec.outputs} | {r.name for r in residuals}
    if op_plan.varies:
        assert {i.name for i in spec.tensor_inputs if i.type.optional} <= set(op_plan.saved)


def test_library_ops_with_residuals_exist_and_tanhshrink_saves_tanh() -> None:
    _, _, residuals, op_plan = _planned(SPECS / "tanhshrink.yaml")
    assert [r.name for r in residuals] == ["saved_tanh"] and op_plan.saved == ("saved_tanh",)


RESIDUAL_OPS = {
    "shrink": "name: shrink\ninputs: {x: Tensor}\noutputs:\n  y: x - tanh(x)\n",
    # a spec name that the residual would take: the residual gets another
    "taken": "name: taken\ninputs: {saved_tanh: Tensor}\noutputs:\n  y: saved_tanh - tanh(saved_tanh)\n",
    "two": "name: two\ninputs: {x: Tensor}\noutputs:\n  y: x * tanh(x)\n  z: tanh(x) + sin(x) ** 2\n",
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory):
    return build_ops(tmp_path_factory.mktemp("residuals"), "residual_ops", RESIDUAL_OPS)


@pytest.mark.parametrize("name", sorted(RESIDUAL_OPS))
def test_ops_with_residuals_match_plain_autograd_to_second_order(ops, name: str) -> None:
    x = torch.linspace(-2, 2, 9, dtype=torch.float64, requires_grad=True)
    f = getattr(ops, name)
    plain = {
        "shrink": lambda x: x - torch.tanh(x),
        "taken": lambda x: x - torch.tanh(x),
        "two": lambda x: (x * torch.tanh(x), torch.tanh(x) + torch.sin(x) ** 2),
    }[name]
    got, want = f(x), plain(x)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    assert len(got) == len(want), "the functional returns the residuals"
    for picked in [[k] for k in range(len(want))] + [list(range(len(want)))]:
        (g1,) = torch.autograd.grad(sum(got[k].sin().sum() for k in picked), x, create_graph=True)
        (w1,) = torch.autograd.grad(sum(want[k].sin().sum() for k in picked), x, create_graph=True)
        torch.testing.assert_close(g1, w1)
        (g2,) = torch.autograd.grad(g1.pow(2).sum(), x, retain_graph=True)
        (w2,) = torch.autograd.grad(w1.pow(2).sum(), x, retain_graph=True)
        torch.testing.assert_close(g2, w2)
    assert torch.autograd.gradgradcheck(f, (x,))


def test_docstrings_show_the_gradient_a_caller_gets():
    """A residual is returned for backward only: its incoming gradient (nonzero only inside double
    backward) is no part of the gradients a docstring shows, nor is the residual itself: the formulas read
    what it computes. One visible output's incoming gradient is `grad`."""
    for name in ("tanhshrink", "cross_entropy", "label_smoothing_ce", "rms_norm", "layer_norm"):
        doc = getattr(generated, name).__doc__
        gradients = doc.split("Gradients")[1]
        assert "saved" not in doc, name
        assert re.search(r"\bgrad\b", gradients) and not re.search(r"\bgrad_(y|loss)\b", gradients), name
    assert "grad_x = grad*tanh(x)**2\n" in generated.tanhshrink.__doc__


def test_docstrings_call_only_words_of_the_formula_language():
    """A docstring's formulas are in the spec's language: no kernel, residual or IR pseudo-function
    (`layer_norm_backward(grad, x)[0]`, `pad(...)`, `glu_backward(...)`) that a spec could not write."""
    import inspect

    from opgen.formula.aliases import ALIASES
    from opgen.formula.vocabulary import ALL_FUNCTIONS

    words = {*ALL_FUNCTIONS, *ALIASES}
    called: dict[str, list[str]] = {}
    for name in generated.__all__:
        function = getattr(generated, name)
        if inspect.isfunction(function) and "Forward:" in (function.__doc__ or ""):
            formulas = function.__doc__.split("Forward:")[1]
            for word in set(re.findall(r"\b([A-Za-z_]\w*)\(", formulas)) - words:
                called.setdefault(word, []).append(name)
    # Known gaps, shown as they are until their nodes show their gradients in the language: the gradient of
    # a part of `cat` (a padding), of an integer index (the entry put back in place) and of logcumsumexp (a
    # scan from the end: the language has no flip).
    assert called == {
        "pad": ["rotary_embedding"],
        "put_at": ["interval_iou_loss"],
        "reverse_logcumsumexp": ["cox_partial_nll"],
    }
    assert "grad_x[..., :D // 2] = grad*sigmoid(x[..., D // 2:])\n" in generated.glu.__doc__  # each half in its place
