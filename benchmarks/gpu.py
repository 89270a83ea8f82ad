"""Every op of `specs/` on a GPU: values and gradients against plain autograd of the formula, in float32
and under autocast (bfloat16, float16), then forward + backward timed against PyTorch's op and
`torch.compile` of the formula.

    .venv/bin/python -m benchmarks.gpu [--ops mish kl_div ...] [--sizes 1000000 64000000] [--no-time]

Without a CUDA device it says so and exits 0 (`--device cpu` runs the same logic on the CPU, which
is how `tests/test_gpu_benchmark.py` checks it). The specs are generated afresh into
`benchmarks/results/gpu_ops` (`--specs` names another folder).

Checked, per op and dtype: the inputs of the op's generated test (`sample_inputs`, in float32 on the
device), the op and its formula in plain torch (the test's `reference`, translated from the formula
text without opgen's plan) run the same way -- as they are in float32, under `torch.autocast` for
bfloat16 and float16 -- and both compared with the formula in float64 on the CPU, the truth: the
largest error `|a - t| / (|t| + 1)` over the outputs, and over the gradients of the inputs whose
gradient is derived (an override's is not the formula's). The op passes where its error is at most
`FACTOR` times plain autograd's plus the dtype's `SLACK`, and it is finite wherever plain autograd is
and the truth is. Timed, for the elementwise specs: the median of `--repeats` runs of forward +
`torch.autograd.grad` at each size (synchronised with the device), for the generated op, PyTorch's
op (`benchmarks.run.NATIVE`) and `torch.compile` of the formula. Timings are never pass/fail.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from benchmarks.run import NATIVE, ROOT, elementwise_specs, generate_package, load_specs, machine, ratio

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FACTOR = 4.0  # the op may be this many times less accurate than plain autograd of its formula
SLACK = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3}  # and this much beyond it, per dtype


@dataclass(frozen=True)
class Check:
    """One op in one dtype on the device: its error and plain autograd's, against the float64 truth."""

    op: str
    dtype: str
    error: float
    naive_error: float
    finite: bool  # finite wherever the truth and plain autograd are

    @property
    def ok(self) -> bool:
        return self.finite and self.error <= FACTOR * self.naive_error + SLACK[self.dtype]


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, dict):
        value = list(value.values())
    return [v for v in (value if isinstance(value, (tuple, list)) else [value]) if isinstance(v, torch.Tensor)]


def _on(args: Sequence[object], device: torch.device, dtype: torch.dtype) -> list[object]:
    """The arguments on `device`, floating tensors in `dtype`, each a fresh leaf that requires grad as before."""
    moved: list[object] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            b = a.detach().to(device=device, dtype=dtype if a.is_floating_point() else a.dtype)
            moved.append(b.requires_grad_(a.requires_grad))
        else:
            moved.append(a)
    return moved


def _run(
    call: Callable[..., object], args: list[object], op: Any, weights: list[torch.Tensor], autocast: torch.dtype | None
) -> list[torch.Tensor]:
    """The outputs and the gradients of the checked inputs of `sum(weight * output)`, float64 on the CPU."""
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    context = torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext()
    with context:
        outs = _tensors(call(*args))
        live = [outs[k] for k in op.differentiable if outs[k].requires_grad]
        total = sum(((o * w.to(o.device, o.dtype)).sum() for o, w in zip(live, weights, strict=False)), torch.zeros(()))
    leaves = [args[k] for k in op.checked if isinstance(args[k], torch.Tensor) and args[k].requires_grad]
    grads = torch.autograd.grad(total, leaves, allow_unused=True, materialize_grads=True) if leaves else ()
    return [t.detach().to("cpu", torch.float64) for t in (*outs, *grads)]


def _error(got: list[torch.Tensor], truth: list[torch.Tensor]) -> tuple[float, torch.Tensor]:
    """The largest `|a - t| / (|t| + 1)` where the truth is finite, and where `got` is finite there."""
    worst, finite = 0.0, []
    for a, t in zip(got, truth, strict=True):
        a = a.expand(t.shape) if a.shape != t.shape else a
        where = torch.isfinite(t)
        finite.append((torch.isfinite(a) | ~where).flatten())
        diff = ((a - t).abs() / (t.abs() + 1))[where & torch.isfinite(a)]
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
    return worst, torch.cat(finite) if finite else torch.ones(0, dtype=torch.bool)


def check_op(tests: ModuleType, name: str, device: torch.device, dtype: str) -> Check:
    """The op of a generated test module against plain autograd of its formula on `device` (module docstring)."""
    harness = importlib.import_module(tests.__name__.rsplit(".", 1)[0] + ".harness")
    op = tests.OP
    harness.DTYPE = torch.float64
    args = tests.sample_inputs()
    outs = _tensors(op.functional(*args))
    generator = torch.Generator().manual_seed(1)
    weights = [torch.randn(outs[k].shape, generator=generator, dtype=torch.float64) for k in op.differentiable]

    def naive(*values: object) -> tuple[torch.Tensor, ...]:
        result = tests.reference(*values)
        return tuple(result[n] for n in op.outputs)

    truth = _run(naive, _on(args, torch.device("cpu"), torch.float64), op, weights, None)
    harness.DTYPE = torch.float32
    autocast = None if dtype == "float32" else DTYPES[dtype]
    try:
        got = _run(op.functional, _on(args, device, torch.float32), op, weights, autocast)
        plain = _run(naive, _on(args, device, torch.float32), op, weights, autocast)
    finally:
        harness.DTYPE = torch.float64
    error, finite = _error(got, truth)
    naive_error, naive_finite = _error(plain, truth)
    return Check(name, dtype, error, naive_error, bool((finite | ~naive_finite).all()))


def check_all(package: str, names: Sequence[str], device: torch.device, dtypes: Sequence[str]) -> list[Check]:
    return [
        check_op(importlib.import_module(f"{package}.tests.test_{name}"), name, device, dtype)
        for name in names
        for dtype in dtypes
    ]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(call: Callable[..., object], args: list[object], device: torch.device, repeats: int) -> float:
    """Median seconds of forward + `torch.autograd.grad` of `call(*args)`, after two warm-up runs."""
    inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    times = []
    for k in range(repeats + 2):
        _synchronize(device)
        start = time.perf_counter()
        outs = [o for o in _tensors(call(*args)) if o.requires_grad]
        torch.autograd.grad(outs, inputs, [torch.ones_like(o) for o in outs], allow_unused=True)
        _synchronize(device)
        if k > 1:  # two warm-up runs: the first of a compiled call compiles
            times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclass(frozen=True)
class Timing:
    op: str
    size: int
    seconds: dict[str, float]  # variant -> median seconds


def time_op(package: str, spec: Any, size: int, device: torch.device, repeats: int, compile: bool) -> Timing:
    """The generated op, PyTorch's op and the compiled formula, on `size` float32 elements per Tensor input."""
    tests = importlib.import_module(f"{package}.tests.test_{spec.name}")
    importlib.import_module(f"{package}.tests.harness").DTYPE = torch.float32
    generator = torch.Generator().manual_seed(0)
    args: list[object] = []
    for inp in spec.inputs:
        if inp.is_tensor:
            low, high = spec.tests.domain_of(inp.name)
            sample = low + (high - low) * torch.rand(size, generator=generator)
            args.append(sample.to(device).requires_grad_())
        else:
            args.append(spec.test_value(inp))
    names = [o.name for o in spec.outputs]

    def naive(*values: object) -> tuple[torch.Tensor, ...]:
        result = tests.reference(*values)
        return tuple(result[n] for n in names)

    calls: dict[str, Callable[..., object]] = {"generated": getattr(importlib.import_module(package), spec.name)}
    if spec.name in NATIVE:
        calls["native"] = NATIVE[spec.name]
    if compile:
        calls["compiled"] = torch.compile(naive, dynamic=False)
    return Timing(spec.name, size, {v: time_call(c, args, device, repeats) for v, c in calls.items()})


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def check_table(checks: list[Check]) -> Iterator[str]:
    yield "| op | dtype | error | naive error | finite | ok |"
    yield "|---|---|---|---|---|---|"
    for c in checks:
        finite, ok = "yes" if c.finite else "no", "yes" if c.ok else "NO"
        yield f"| {c.op} | {c.dtype} | {c.error:.2e} | {c.naive_error:.2e} | {finite} | {ok} |"


def time_table(timings: list[Timing]) -> Iterator[str]:
    yield "| op | elements | gen ms | gen/native time | gen/compiled time |"
    yield "|---|---|---|---|---|"
    for t in timings:
        gen = t.seconds["generated"]
        native, compiled = ratio(gen, t.seconds.get("native")), ratio(gen, t.seconds.get("compiled"))
        yield f"| {t.op} | {t.size:,} | {gen * 1e3:.2f} | {_fmt(native)} | {_fmt(compiled)} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to try the logic")
    parser.add_argument("--ops", nargs="*", help="only these ops (default: every spec)")
    parser.add_argument("--specs", default=str(ROOT / "specs"), help="the spec folder (default specs/)")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 64_000_000])
    parser.add_argument("--repeats", type=int, default=11, help="timed runs per op, variant and size (median taken)")
    parser.add_argument("--no-time", action="store_true", help="check values and gradients only")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile of the formula")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks.gpu: no CUDA device on this machine; nothing checked or timed.")
        return 0
    specs = load_specs(Path(args.specs), lambda s: not args.ops or s.name in args.ops)
    names = sorted(s.name for s in specs)
    package = generate_package(args.specs, "gpu_ops")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {name}; {machine()}\n")
    checks = check_all(package, names, device, args.dtypes)
    print("\n".join(check_table(checks)))
    failed = [c for c in checks if not c.ok]
    print(f"\n{len(checks) - len(failed)} of {len(checks)} checks pass")
    if not args.no_time:
        elementwise = {s.name for s in elementwise_specs(Path(args.specs))}
        timed = [s for s in sorted(specs, key=lambda s: s.name) if s.name in elementwise]
        timings = [
            time_op(package, s, size, device, args.repeats, not args.no_compile) for size in args.sizes for s in timed
        ]
        print("\nforward + backward, float32, median of", args.repeats)
        print("\n".join(time_table(timings)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
