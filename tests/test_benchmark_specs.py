"""`python -m benchmarks.run --specs DIR` measures the specs of DIR, generated from DIR."""

from __future__ import annotations

import csv

from conftest import SWISH


def test_benchmark_measures_the_specs_of_its_folder(tmp_path, monkeypatch):
    from benchmarks import run

    specs = tmp_path / "specs"
    specs.mkdir()
    # An op that is not in specs/ (nor in the committed package), and one that is, written differently.
    (specs / "my_gate.yaml").write_text(SWISH.replace("swish", "my_gate"))
    (specs / "silu.yaml").write_text("name: silu\ninputs:\n  x: Tensor\noutputs:\n  y: x * 2\n")
    monkeypatch.setattr(run, "RESULTS", tmp_path / "results")
    table = tmp_path / "numbers.csv"
    args = ["--specs", str(specs), "--size", "64", "--repeats", "1", "--warmup", "0", "--no-fused", "--csv", str(table)]
    assert run.main(args) == 0
    with table.open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted({row["op"] for row in rows}) == ["my_gate", "silu"]
    # `silu` here saves nothing (its gradient is 2), unlike the library's silu, which saves x.
    saved = {row["variant"]: int(row["saved_bytes"]) for row in rows if row["op"] == "silu"}
    assert saved["generated"] == 0 and saved["naive"] == 0
