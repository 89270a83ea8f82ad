"""The README's examples in "Using generated ops with torch.func, torch.compile and torch.library" run
as written (against the committed `generated` package) and give what plain autograd gives."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch
from conftest import GENERATED, ROOT, import_package

TITLE = "## Using generated ops with torch.func, torch.compile and torch.library"


def _section_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.count(TITLE + "\n") == 1, "the README section's title changed"
    section = text.split(TITLE + "\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def _run_examples() -> dict:
    module = sys.modules.get("generated")
    if module is None or Path(module.__file__ or "").resolve().parent != GENERATED:
        import_package(ROOT, "generated")
    blocks = _section_blocks()
    assert len(blocks) == 2, "expected the per-sample-gradient and the Hessian examples"
    namespace: dict = {"__name__": "readme_example"}
    torch.manual_seed(0)
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)  # our own README's text
    return namespace


def test_per_sample_gradient_example_equals_a_loop_of_autograd() -> None:
    ns = _run_examples()
    model, batch, per_sample = ns["model"], ns["batch"], ns["per_sample"]
    reference = torch.nn.Linear(4, 3).double()
    reference.load_state_dict(model.state_dict())
    for b in range(batch.shape[0]):
        reference.zero_grad()
        reference(batch[b : b + 1]).square().sum().backward()
        for name, param in reference.named_parameters():
            torch.testing.assert_close(per_sample[name][b], param.grad, msg=lambda m, n=name, b=b: f"{n}[{b}]: {m}")


def test_hessian_example_equals_autograd_of_native_mish() -> None:
    ns = _run_examples()
    x, h = ns["x"], ns["h"]
    want = torch.autograd.functional.hessian(lambda x: torch.nn.functional.mish(x).sum(), x)
    assert h.shape == (5, 5)
    torch.testing.assert_close(h, want)
