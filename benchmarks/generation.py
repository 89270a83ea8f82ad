"""Wall-clock time of `opgen generate`, cold (`--no-cache`) and from a warm cache, over `specs/`.

    .venv/bin/python -m benchmarks.generation [--runs 5] [--jobs 1 2] [--specs DIR]

Each measurement is a fresh `python -m opgen generate SPECS -o TMP` process, as a user runs it,
into a new temporary folder. `--jobs` lists the `OPGEN_JOBS` values to compare (worker processes;
1 is serial). The machine may be shared: the minimum over `--runs` is the number to compare,
the median shows the noise. Prints one line per setting; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _once(specs: str, out: Path, environment: dict[str, str], cold: bool) -> float:
    command = [sys.executable, "-m", "opgen", "generate", specs, "-o", str(out), "-q"]
    start = time.perf_counter()
    subprocess.run([*command, "--no-cache"] if cold else command, check=True, cwd=ROOT, env=environment)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--specs", default="specs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        base = {**os.environ, "PYTHONPATH": str(ROOT), "OPGEN_CACHE_DIR": str(Path(folder) / "cache")}
        for jobs in args.jobs:
            environment = {**base, "OPGEN_JOBS": str(jobs)}
            cold = [_once(args.specs, Path(folder) / f"cold{jobs}_{i}", environment, True) for i in range(args.runs)]
            _once(args.specs, Path(folder) / "fill", environment, False)  # fills the cache
            warm = [_once(args.specs, Path(folder) / f"warm{jobs}_{i}", environment, False) for i in range(args.runs)]
            for what, times in (("cold", cold), ("cached", warm)):
                print(f"jobs={jobs} {what:6s} min {min(times):.2f} s  median {statistics.median(times):.2f} s")


if __name__ == "__main__":
    main()
