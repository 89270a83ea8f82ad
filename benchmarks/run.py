"""Forward+backward time and bytes saved for backward of every elementwise op in `specs/` (or `--specs DIR`).

    .venv/bin/python -m benchmarks.run [--size 1000000 | --sizes 4096 1000000 8000000] [--compile]
        [--repeats 15] [--ops silu mish ...] [--specs DIR]

Each op is run four ways, interleaved in one process, on one thread, in float32:

- `generated`: the committed `generated` package (the op as opgen writes it); for `--specs DIR`,
  the specs of DIR generated into `benchmarks/results/benchmarked_ops`;
- `naive`: the spec's formula in plain torch under autograd -- the `reference` function of
  the op's generated test, which is translated from the formula text without SymPy, opgen's
  derivation or its printer (so it is the formula as written, not as opgen rewrites it);
- `native`: PyTorch's own op, where one exists (`NATIVE` below);
- `fused`: the same specs generated with `--fuse` (forward and backward math compiled by
  `torch.compile`) into `benchmarks/results/fused_ops`; `--no-fused` skips it (compiling
  takes a few seconds per op);
- `compiled`, with `--compile`: `torch.compile` (default inductor backend) of the naive formula,
  what a user would pick instead of opgen.

`--sizes` runs the whole table once per size (a size sweep); `--size` is one size.

Time is the median over `--repeats` runs of `forward + torch.autograd.grad`, after warm-up
runs. Bytes saved for backward are counted with `torch.autograd.graph.saved_tensors_hooks`,
each storage once. Prints a table of ratios and writes the raw numbers to
`benchmarks/results/latest.csv`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from opgen.errors import Problems
from opgen.pipeline import find_spec_files, source_name
from opgen.spec.load import load_file
from opgen.spec.model import Spec
from opgen.spec.parse import parse_spec

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# The ops the targets are measured over.
TARGETS = ("silu", "mish", "gelu", "gelu_tanh", "softplus", "logsigmoid", "sigmoid", "elu", "tanhshrink", "softsign")

# PyTorch's own op for a spec, called with the spec's inputs in spec order.
NATIVE: dict[str, Callable[..., torch.Tensor]] = {
    "silu": F.silu,
    "mish": F.mish,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "softplus": lambda x, beta: F.softplus(x, beta),
    "logsigmoid": F.logsigmoid,
    "sigmoid": torch.sigmoid,
    "elu": lambda x, alpha: F.elu(x, alpha),
    "selu": F.selu,
    "tanhshrink": F.tanhshrink,
    "softsign": F.softsign,
    "swish": lambda x, beta: F.silu(x) if beta == 1.0 else x * torch.sigmoid(beta * x),
    "bce_with_logits": lambda logits, target: F.binary_cross_entropy_with_logits(logits, target, reduction="none"),
    "huber": lambda input, target, delta: F.huber_loss(input, target, reduction="none", delta=delta),
    "smooth_l1": lambda input, target, beta: F.smooth_l1_loss(input, target, reduction="none", beta=beta),
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "mul_constant": torch.mul,
    "scaled_weight": torch.mul,
    "swiglu": lambda gate, up: F.silu(gate) * up,
}

VARIANTS = ("generated", "naive", "native", "fused", "compiled")


@dataclass
class Case:
    spec: Spec
    calls: dict[str, Callable[..., object]]
    args: list[object]
    tensors: list[int]  # positions of the Tensor inputs
    times: dict[str, list[float]] = field(default_factory=dict)
    saved: dict[str, int] = field(default_factory=dict)


def load_specs(folder: Path, keep: Callable[[Spec], bool]) -> list[Spec]:
    """The specs of `folder` that `keep` accepts; a bad spec ends the run with its located message."""
    problems = Problems()
    specs = []
    for path, display in find_spec_files([str(folder)], problems):
        spec = parse_spec(load_file(path, display), source_name(path), problems)
        if spec is not None and keep(spec):
            specs.append(spec)
    if problems:
        sys.exit("\n".join(problems.report()))
    return specs


def elementwise_specs(folder: Path) -> list[Spec]:
    """The specs whose Tensor inputs have no named dimensions (elementwise, broadcasting)."""
    return load_specs(folder, lambda s: bool(s.tensor_inputs) and all(i.type.dims is None for i in s.tensor_inputs))


def _naive(spec: Spec, package: str, compiled: bool = False) -> Callable[..., object]:
    """The spec's formula in plain torch; `compiled`: through `torch.compile` (its own code object
    per op, so Dynamo's recompile limit per function is never shared between ops)."""
    tests = importlib.import_module(f"{package}.tests.test_{spec.name}")
    # The reference's `T(...)` makes numbers tensors of the harness's dtype: the benchmark's.
    importlib.import_module(f"{package}.tests.harness").DTYPE = torch.float32
    names = [o.name for o in spec.outputs]
    reference = torch.compile(tests.reference, dynamic=False) if compiled else tests.reference

    def naive(*args: object) -> object:
        values = reference(*args)
        outs = tuple(values[n] for n in names)
        return outs[0] if len(outs) == 1 else outs

    return naive


def _fused(spec: Spec, fused_package: str | None) -> Callable[..., object] | None:
    if fused_package is None:
        return None
    package = importlib.import_module(fused_package)
    return getattr(package, spec.name, None)  # type: ignore[no-any-return]


def generate_package(specs_folder: str, name: str, *flags: str) -> str:
    """Generate the specs into the package `name` under benchmarks/results; returns its name."""
    from opgen.cli import main as opgen

    out = RESULTS / name
    if opgen(["generate", specs_folder, "-o", str(out), "--quiet", *flags]) != 0:
        sys.exit(f"could not generate {name} from {specs_folder}")
    if str(RESULTS) not in sys.path:
        sys.path.insert(0, str(RESULTS))
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]  # another package of that name imported before: this one is measured
    importlib.invalidate_caches()
    return out.name


def generated_package(specs_folder: str) -> str:
    """The package of the specs measured: the committed `generated` for `specs/` (the golden test keeps
    it equal to what opgen writes), else the specs of `--specs` generated afresh."""
    if Path(specs_folder).resolve() == (ROOT / "specs").resolve():
        return "generated"
    return generate_package(specs_folder, "benchmarked_ops")


def make_case(
    spec: Spec, size: int, seed: int, fused_package: str | None, package: str = "generated", compiled: bool = False
) -> Case:
    generator = torch.Generator().manual_seed(seed)
    args: list[object] = []
    tensors = []
    for k, inp in enumerate(spec.inputs):
        if inp.is_tensor:
            low, high = spec.tests.domain_of(inp.name)
            sample = low + (high - low) * torch.rand(size, generator=generator, dtype=torch.float32)
            args.append(sample.requires_grad_())
            tensors.append(k)
        else:
            args.append(spec.test_value(inp))
    generated = importlib.import_module(package)
    calls: dict[str, Callable[..., object]] = {
        "generated": getattr(generated, spec.name),
        "naive": _naive(spec, package),
    }
    if spec.name in NATIVE:
        calls["native"] = NATIVE[spec.name]
    fused = _fused(spec, fused_package)
    if fused is not None:
        calls["fused"] = fused
    if compiled:
        calls["compiled"] = _naive(spec, package, compiled=True)
    return Case(spec, calls, args, tensors)


def _outputs(value: object) -> tuple[torch.Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)  # type: ignore[return-value]


def run_once(case: Case, variant: str, grads: list[torch.Tensor]) -> float:
    inputs = [case.args[k] for k in case.tensors]
    start = time.perf_counter()
    outs = [o for o in _outputs(case.calls[variant](*case.args)) if o.requires_grad]
    torch.autograd.grad(outs, inputs, grads[: len(outs)], allow_unused=True)  # type: ignore[arg-type]
    return time.perf_counter() - start


@contextlib.contextmanager
def saved_storages() -> Iterator[dict[int, int]]:
    """The storages saved for backward while active, each once: address -> bytes."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield storages


def saved_bytes(case: Case, variant: str) -> int:
    with saved_storages() as storages:
        case.calls[variant](*case.args)
    return sum(storages.values())


def _elementwise_grads(case: Case) -> list[torch.Tensor]:
    """Incoming gradients for up to four outputs shaped like the first Tensor input."""
    shape = case.args[case.tensors[0]].shape  # type: ignore[union-attr]
    return [torch.randn(shape, generator=torch.Generator().manual_seed(1))] * 4


def measure(
    cases: list[Case], repeats: int, warmup: int, grads_for: Callable[[Case], list[torch.Tensor]] = _elementwise_grads
) -> None:
    grads = {id(case): grads_for(case) for case in cases}
    for case in cases:
        for variant in case.calls:
            case.saved[variant] = saved_bytes(case, variant)
            for _ in range(warmup):
                run_once(case, variant, grads[id(case)])
            case.times[variant] = []
    # Interleaved: every round runs every op and variant once, in a rotating order, so slow
    # drifts of the machine (other processes, frequency) spread over all of them alike.
    for round_ in range(repeats):
        for case in cases:
            variants = list(case.calls)
            shift = round_ % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                case.times[variant].append(run_once(case, variant, grads[id(case)]))


def median_ms(case: Case, variant: str) -> float | None:
    times = case.times.get(variant)
    return statistics.median(times) * 1e3 if times else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def geomean(values: list[float]) -> float | None:
    # A zero (an op that saves nothing) has no logarithm: no geometric mean of those.
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values and min(values) > 0 else None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


ROW_HEADERS = (
    "op",
    "gen ms",
    "gen/naive time",
    "gen/native time",
    "fused/native time",
    "gen/compiled time",
    "fused/compiled time",
    "gen/naive bytes",
    "gen/native bytes",
)


def rows(cases: list[Case]) -> list[dict[str, float | None | str]]:
    table = []
    for case in cases:
        gen, naive, native, fused, compiled = (median_ms(case, v) for v in VARIANTS)
        saved = case.saved
        table.append(
            {
                "op": case.spec.name,
                "gen ms": gen,
                "gen/naive time": ratio(gen, naive),
                "gen/native time": ratio(gen, native),
                "fused/native time": ratio(fused, native),
                "gen/compiled time": ratio(gen, compiled),
                "fused/compiled time": ratio(fused, compiled),
                "gen/naive bytes": ratio(saved.get("generated"), saved.get("naive")),
                "gen/native bytes": ratio(saved.get("generated"), saved.get("native")),
            }
        )
    return table


def summary(table: list[dict[str, float | None | str]], names: tuple[str, ...]) -> dict[str, float | None | str]:
    picked = [r for r in table if r["op"] in names]
    row: dict[str, float | None | str] = {"op": f"geomean ({len(picked)} target ops)"}
    for key in ROW_HEADERS[1:]:
        values = [r[key] for r in picked if isinstance(r[key], float)]
        row[key] = geomean(values) if len(values) == len(picked) else None  # type: ignore[arg-type]
    return row


def markdown(table: list[dict[str, float | None | str]]) -> str:
    lines = ["| " + " | ".join(ROW_HEADERS) + " |", "|" + "---|" * len(ROW_HEADERS)]
    for row in table:
        cells = [str(row["op"])] + [_fmt(row[k], 1 if k == "gen ms" else 2) for k in ROW_HEADERS[1:]]  # type: ignore[arg-type]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(path: Path, cases: list[tuple[int, Case]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["size", "op", "variant", "median_ms", "min_ms", "repeats", "saved_bytes"])
        for size, case in cases:
            for variant in VARIANTS:
                times = case.times.get(variant)
                if not times:
                    continue
                writer.writerow(
                    [
                        size,
                        case.spec.name,
                        variant,
                        f"{statistics.median(times) * 1e3:.4f}",
                        f"{min(times) * 1e3:.4f}",
                        len(times),
                        case.saved[variant],
                    ]
                )


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {torch.get_num_threads()} thread, torch {torch.__version__}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--size", type=int, default=1_000_000, help="elements per tensor input (default 1M)")
    sizes.add_argument("--sizes", type=int, nargs="+", help="a size sweep: the table once per size")
    parser.add_argument("--repeats", type=int, default=21, help="timed runs per op and variant (median taken)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--ops", nargs="*", help="only these ops (default: every elementwise spec)")
    parser.add_argument("--specs", default=str(ROOT / "specs"), help="the spec folder (default specs/)")
    parser.add_argument("--csv", default=str(RESULTS / "latest.csv"), help="where the raw numbers go")
    parser.add_argument("--no-fused", action="store_true", help="skip the fused (torch.compile) variant")
    parser.add_argument("--compile", action="store_true", help="add torch.compile of the naive formula")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    specs = [s for s in elementwise_specs(Path(args.specs)) if not args.ops or s.name in args.ops]
    package = generated_package(args.specs)
    fused_package = None if args.no_fused else generate_package(args.specs, "fused_ops", "--fuse")
    all_cases = []
    for size in args.sizes or [args.size]:
        cases = [make_case(spec, size, k, fused_package, package, args.compile) for k, spec in enumerate(specs)]
        measure(cases, args.repeats, args.warmup)
        table = rows(cases)
        print(f"{size:,} float32 elements, forward + backward, median of {args.repeats}; {machine()}")
        print("Times share the machine's cores with whatever else runs: ratios are noisy, rerun to compare.")
        print()
        print(markdown([*table, summary(table, TARGETS)]))
        print()
        all_cases += [(size, case) for case in cases]
    write_csv(Path(args.csv), all_cases)
    print(f"raw numbers: {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
