"""The benchmark scripts run (tiny sizes: a smoke test, never a timing test) and their safety
column tells a finite op from one that overflows."""

from __future__ import annotations

import torch
from conftest import ROOT, SPECS, import_package

from benchmarks import run, tensor
from benchmarks.run import Case


def test_tensor_benchmark_prints_a_row_per_tensor_spec_with_a_native_op(capsys):
    import_package(ROOT, "generated")  # the committed package, whatever another test imported by that name
    assert tensor.main(["--rows", "6", "--dim", "6", "--matrix-dim", "4", "--repeats", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    expected = [s.name for s in tensor.tensor_specs(SPECS)]
    assert {"softmax", "logsumexp", "linear"} <= set(expected)
    for name in expected:
        assert f"| {name} |" in out
    assert "| NO |" not in out, "every library op is finite where PyTorch's is"


def test_the_finite_column_catches_a_textbook_softmax():
    spec = next(s for s in tensor.tensor_specs(SPECS) if s.name == "softmax")
    x = torch.randn(4, 6, requires_grad=True)

    def textbook(x):
        return torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)

    native = tensor.NATIVE["softmax"]
    assert not tensor.finite_at_extremes(Case(spec, {"generated": textbook, "native": native}, [x], [0]))
    assert tensor.finite_at_extremes(Case(spec, {"generated": native, "native": native}, [x], [0]))


def test_elementwise_benchmark_runs(capsys, tmp_path):
    import_package(ROOT, "generated")
    argv = ["--size", "16", "--repeats", "1", "--warmup", "0", "--no-fused", "--ops", "silu", "softplus"]
    assert run.main([*argv, "--csv", str(tmp_path / "out.csv")]) == 0
    out = capsys.readouterr().out
    assert "| silu |" in out and "| softplus |" in out
    assert (tmp_path / "out.csv").read_text().count("silu") >= 3  # generated, naive, native rows


def test_the_size_sweep_prints_a_table_per_size_with_the_compiled_column(capsys, tmp_path):
    import_package(ROOT, "generated")
    argv = ["--sizes", "8", "20000", "--compile", "--repeats", "1", "--warmup", "1", "--no-fused", "--ops", "silu"]
    assert run.main([*argv, "--csv", str(tmp_path / "out.csv")]) == 0
    out = capsys.readouterr().out
    assert "8 float32 elements" in out and "20,000 float32 elements" in out
    assert out.count("| silu |") == 2 and "gen/compiled time" in out
    header = [c.strip() for c in next(line for line in out.splitlines() if line.startswith("| op |")).split("|")]
    for line in (line for line in out.splitlines() if line.startswith("| silu |")):
        cells = [c.strip() for c in line.split("|")]
        assert float(cells[header.index("gen/compiled time")]) > 0, "the compiled column has a ratio"
    lines = (tmp_path / "out.csv").read_text().splitlines()
    assert {line.split(",")[0] for line in lines[1:]} == {"8", "20000"}
    assert any(",compiled," in line for line in lines)


def test_the_tensor_losses_with_a_pytorch_op_are_benchmarked():
    assert {"cross_entropy", "label_smoothing_ce", "kl_div"} <= set(tensor.NATIVE)
    assert "swiglu" in run.NATIVE
