"""`opgen docs`: the op catalogue, and the committed one under docs/ops/ kept in step with specs/.

Refresh the committed catalogue (with matplotlib installed, `pip install -e ".[docs]"`) with

    opgen docs specs -o docs/ops --benchmarks docs/benchmarks.md

The Markdown is compared byte for byte. The PNGs are compared only for being there where a
page shows one: their bytes are stable from run to run with one matplotlib (checked below),
but another matplotlib or FreeType may draw a pixel differently (Note [plots are byte-stable
per matplotlib] in opgen/catalogue.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import ROOT, SPECS, SWISH

import generated
from opgen import catalogue

OPS = ROOT / "docs" / "ops"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
REFRESH = "run `opgen docs specs -o docs/ops --benchmarks docs/benchmarks.md` (with matplotlib installed)"


def _pages(golden, plots: bool = True) -> dict[str, str]:
    texts = {s.name: Path(s.loc.file).read_text(encoding="utf-8") for s in golden.specs}
    return catalogue.pages(golden, texts, BENCHMARKS.read_text(encoding="utf-8"), plots)


def test_the_committed_catalogue_is_what_opgen_docs_writes(golden):
    expected = _pages(golden)
    committed = {p.name: p.read_text(encoding="utf-8") for p in OPS.glob("*.md")}
    assert sorted(committed) == sorted(expected), REFRESH
    stale = [name for name, text in expected.items() if committed[name] != text]
    assert not stale, f"stale pages {stale}: {REFRESH}"


def test_every_plot_a_page_shows_is_committed_and_carries_no_version(golden):
    shown = sorted(s.name for s in golden.specs if catalogue.elementwise(s))
    assert len(shown) > 20
    assert sorted(p.stem for p in OPS.glob("*.png")) == shown, REFRESH
    for name in shown:
        data = (OPS / f"{name}.png").read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        assert b"Software" not in data and b"matplotlib" not in data


def test_a_page_reads_the_generated_code(golden):
    pages = _pages(golden)
    swish = pages["swish.md"]
    assert "    y = x*sigmoid(beta*x)" in swish  # after the stable rewrite
    assert "`x`. Kept on `ctx` as plain values: `beta`." in swish
    assert "| swish | 3.0 |" in swish
    gelu = pages["gelu.md"]
    assert "| `backward` | `torch.ops.aten.gelu_backward` |" in gelu
    assert "| `forward` | `torch.nn.functional.gelu` |" in gelu
    assert "## Benchmark" not in pages["linear.md"]  # no row for it
    assert "named dimensions: no plot" in pages["linear.md"]
    assert "[softmax](softmax.md)" in pages["index.md"]


def test_without_matplotlib_the_page_says_how_to_get_the_plot(golden):
    page = _pages(golden, plots=False)["swish.md"]
    assert catalogue.PLOT_HINT in page and "swish.png" not in page


@pytest.mark.parametrize(
    ("name", "slope"),
    [
        ("swish", None),  # the derived gradient: compared with autograd of the formula
        ("sign_ste", lambda x: (x.abs() <= 1).double()),  # the override, straight through
        ("clip_grad", lambda x: torch.ones_like(x)),  # backward clamps the incoming gradient of 1 to [-c, c]
    ],
)
def test_the_plotted_curves_are_the_op_and_its_gradient(golden, name, slope):
    spec = next(s for s in golden.specs if s.name == name)
    x, y, dy = catalogue.curves(generated, spec, points=101)
    t = torch.tensor(x, requires_grad=True)
    if slope is None:
        plain = t / (1 + torch.exp(-t))  # swish's formula as written, beta = 1
        (expected,) = torch.autograd.grad(plain.sum(), t)
        torch.testing.assert_close(torch.tensor(y), plain.detach())
    else:
        expected = slope(t.detach())
    torch.testing.assert_close(torch.tensor(dy), expected)
    low, high = spec.tests.domain_of(spec.tensor_inputs[0].name)
    assert math.isclose(x[0], low) and math.isclose(x[-1], high)


def test_opgen_docs_writes_pages_and_deterministic_plots(run_cli, tmp_path):
    pytest.importorskip("matplotlib")
    specs = [str(SPECS / f"{n}.yaml") for n in ("softsign", "sign_ste", "linear")]
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        status, stdout, stderr = run_cli("docs", *specs, "-o", str(out), "--benchmarks", str(BENCHMARKS))
        assert status == 0, stderr
        assert "3 op pages, 2 plots" in stdout
    for name in ("softsign.png", "sign_ste.png", "softsign.md", "linear.md", "index.md"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert not (first / "linear.png").exists()
    assert (first / "softsign.md").read_text() == (OPS / "softsign.md").read_text()


def test_no_plots_writes_the_hint_and_no_png(run_cli, tmp_path):
    spec = tmp_path / "swish.yaml"
    spec.write_text(SWISH)
    status, stdout, stderr = run_cli("docs", str(spec), "-o", str(tmp_path / "out"), "--no-plots")
    assert status == 0, stderr
    assert catalogue.PLOT_HINT in (tmp_path / "out" / "swish.md").read_text()
    assert not list((tmp_path / "out").glob("*.png"))


def test_pages_and_plots_of_ops_gone_are_removed_and_nothing_else(run_cli, tmp_path):
    """A second run over fewer specs removes the pages and plots the first wrote for the ops now
    gone, and a plot of an op it draws none for; a file of the user's in the folder stays."""
    pytest.importorskip("matplotlib")
    out, specs = tmp_path / "out", tmp_path / "specs"
    specs.mkdir()
    names = ("softsign", "sign_ste", "tanhshrink")
    for name in names:
        (specs / f"{name}.yaml").write_text((SPECS / f"{name}.yaml").read_text())
    assert run_cli("docs", str(specs), "-o", str(out))[0] == 0
    assert {p.name for p in out.iterdir()} == {"index.md", *(f"{n}.{e}" for n in names for e in ("md", "png"))}
    (out / "notes.md").write_text("# notes\n")
    (out / "tanhshrink.md").write_text("# tanhshrink\n\nMy own notes on it.\n")  # the user's page now
    (specs / "softsign.yaml").unlink()
    (specs / "tanhshrink.yaml").unlink()
    status, stdout, stderr = run_cli("docs", str(specs), "-o", str(out), "--no-plots")
    assert status == 0, stderr
    assert not (out / "softsign.md").exists() and not (out / "softsign.png").exists()
    assert not (out / "sign_ste.png").exists() and (out / "sign_ste.md").exists()  # it shows no plot now
    assert (out / "notes.md").read_text() == "# notes\n" and "My own" in (out / "tanhshrink.md").read_text()
    assert "[softsign]" not in (out / "index.md").read_text()


def test_a_bad_spec_or_argument_writes_nothing(run_cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ninputs:\n  x: Tensor\noutputs:\n  y: x^2\n")
    status, _, stderr = run_cli("docs", str(bad), "-o", str(tmp_path / "out"))
    assert status == 2 and "bad.yaml:5:" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "out").exists()
    good = tmp_path / "swish.yaml"
    good.write_text(SWISH)
    status, _, stderr = run_cli("docs", str(good), "-o", str(tmp_path / "out"), "--benchmarks", str(tmp_path / "no"))
    assert status == 2 and "--benchmarks" in stderr
    status, _, stderr = run_cli("docs", str(good), "-o", str(good))
    assert status == 2 and "not a folder" in stderr
    assert not (tmp_path / "out").exists()


def test_the_help_names_the_verb(run_cli):
    status, stdout, _ = run_cli("--help")
    assert status == 0 and "docs" in stdout
    status, stdout, _ = run_cli("docs", "--help")
    assert status == 0 and "--benchmarks" in stdout and "-o DIR" in stdout


def test_benchmark_rows_take_the_first_op_table():
    text = (
        "intro\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        "| op | t |\n|---|---|\n| mish | 0.5 |\n| geomean | 1 |\n\n| op | x |\n| relu | 9 |\n"
    )
    header, rows = catalogue.benchmark_rows(text)
    assert header == ["op", "t"] and rows == {"mish": ["mish", "0.5"], "geomean": ["geomean", "1"]}


def test_every_page_of_the_catalogue_describes_its_op(golden):
    """A page opens with what its op is (the spec's `doc:`); `linear` and three more had none. swish
    is the format page's first example, as written there, without one."""
    for spec in golden.specs:
        if spec.name == "swish":
            continue
        assert spec.doc.strip(), f"specs/{spec.name}.yaml has no doc:"
        opening = (OPS / f"{spec.name}.md").read_text(encoding="utf-8").split("\n\n")[1]
        assert opening == spec.doc.strip().split("\n\n")[0].replace("\n", " "), spec.name
