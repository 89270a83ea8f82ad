"""Every YAML example of the spec-format page generates, imports and passes its generated tests.

The page is the format's contract and lives beside the repository (`../shared/spec-format.md`);
its examples are taken from it as written, not copied here.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, import_package

PAGE = ROOT.parent / "shared" / "spec-format.md"


def examples() -> list[str]:
    if not PAGE.is_file():
        pytest.skip(f"{PAGE} is not beside the repository")
    return re.findall(r"```yaml\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)


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


def test_the_page_has_its_five_examples(package):
    _, texts = package
    names = sorted(re.search(r"^name: (\w+)", t, flags=re.MULTILINE).group(1) for t in texts)
    assert names == ["linear", "mul_constant", "scaled_weight", "sign_ste", "swish"]


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
