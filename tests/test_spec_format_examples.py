"""Every YAML example of the spec-format reference generates, imports and passes its generated tests.

The reference is `docs/spec-format.md`; its examples are taken from it as written, not copied
here. It carries the v1 format's five examples word for word: `tests/spec_format_v1/` holds them as
the v1 contract page gives them, and a test checks that the reference still does.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, import_package

PAGE = ROOT / "docs" / "spec-format.md"
CONTRACT = Path(__file__).resolve().parent / "spec_format_v1"  # the v1 contract's examples, word for word
V1_EXAMPLES = ["linear", "mul_constant", "scaled_weight", "sign_ste", "swish"]


def yaml_blocks(page: Path) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.DOTALL)


def examples() -> list[str]:
    return yaml_blocks(PAGE)


def name_of(text: str) -> str:
    match = re.search(r"^name: (\w+)", text, flags=re.MULTILINE)
    assert match, text
    return match.group(1)


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    texts = examples()
    root = tmp_path_factory.mktemp("format")
    specs = root / "specs"
    specs.mkdir()
    for k, text in enumerate(texts):
        (specs / f"example_{k}.yaml").write_text(text, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "opgen", "generate", str(specs), "-o", str(root / "format_ops")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return root, texts


def test_the_page_has_the_five_v1_examples(package):
    _, texts = package
    names = [name_of(t) for t in texts]
    assert set(V1_EXAMPLES) <= set(names)
    assert len(names) == len(set(names)), "every example of the page needs its own op name"


def test_the_page_carries_the_contract_examples_word_for_word():
    ours = set(examples())
    contract = [path.read_text(encoding="utf-8") for path in sorted(CONTRACT.glob("*.yaml"))]
    assert sorted(name_of(t) for t in contract) == V1_EXAMPLES
    for text in contract:
        assert text in ours, f"docs/spec-format.md lost or changed the v1 example '{name_of(text)}'"


def test_generated_tests_of_every_example_pass(package):
    root, _ = package
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "format_ops" / "tests")],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert " passed" in result.stdout


def test_the_page_says_what_the_examples_do(package):
    root, _ = package
    ops = import_package(root, "format_ops")
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(ops.swish(x, beta=1.5), x * torch.sigmoid(1.5 * x))
    assert ops.MulConstantFunction.apply(x, 2.0).shape == x.shape
    torch.testing.assert_close(ops.mul_constant(x, 3.0), 3.0 * x)
    (grad,) = torch.autograd.grad(ops.mul_constant(x, 3.0).sum(), x)
    torch.testing.assert_close(grad, torch.full_like(x, 3.0))
    (grad,) = torch.autograd.grad(ops.sign_ste(x).sum(), x)
    torch.testing.assert_close(grad, (x.abs() <= 1).to(x.dtype))
    m = ops.Linear(4, 3)
    assert str(m) == "Linear(in_features=4, out_features=3, bias=True)"
    assert ops.Linear(4, 3, bias=False).bias is None
    torch.testing.assert_close(m(x.float()), torch.nn.functional.linear(x.float(), m.weight, m.bias))
    layer = ops.ScaledWeight(4)
    torch.testing.assert_close(layer(x.float()), x.float() * layer.weights)
