"""Backward work and memory of every op in `specs/`, counted, not timed: aten calls, full passes and
bytes saved for backward, for the generated op, plain autograd of its formula and PyTorch's op.

    .venv/bin/python -m benchmarks.work [--ops mish layer_norm ...] [--scale 8] [--specs DIR]

Each op runs three ways on the same inputs, in one process, in float32:

- `generated`: the committed `generated` package, always through its `autograd.Function` (the
  small-call path of Note [small calls] is switched off: it is PyTorch's own ops);
- `naive`: the spec's formulas in plain torch under autograd -- the `reference` of the op's
  generated test, translated from the formula text without SymPy or opgen's plan;
- `native`: PyTorch's own op where the spec names one (`tests: {native: NAME}`, the generated
  test's `native`), which computes the first output only; the generated op is counted again
  with only that output's gradient for its column.

The inputs are those of the generated test (`sample_inputs`, the batched shapes where the spec
has them), each dimension of more than one entry made `--scale` times larger. Counted:

- `calls`: aten operators dispatched during `torch.autograd.grad` (a `TorchDispatchMode`), the
  forward excluded;
- `passes`: those of them that are no view and read or write a tensor as large as the op's largest
  Tensor input or output -- the calls that sweep the data;
- `bytes`: storage saved for backward during the forward (`saved_tensors_hooks`), each storage once,
  inputs included.

Counts do not move with the machine's load, so this benchmark can be read on a shared machine;
it times nothing. The table prints the generated op's counts and their ratios to naive and native.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.run import ROOT, generated_package, geomean, load_specs, machine, ratio, saved_storages
from opgen.spec.model import Spec


@dataclass(frozen=True)
class Work:
    """What one backward costs: aten calls, full passes among them, bytes saved for it."""

    calls: int
    passes: int
    saved: int
    names: tuple[str, ...] = ()  # the aten calls, in order


class CountCalls(TorchDispatchMode):
    """Counts the aten calls dispatched while active, and those that sweep `full` elements or more."""

    def __init__(self, full: int) -> None:
        super().__init__()
        self.full = full
        self.names: list[str] = []
        self.passes: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket.__name__)
        self.names.append(name)
        tensors = [t for t in _flat((args, kwargs or {}, out)) if isinstance(t, torch.Tensor)]
        if not func.is_view and any(t.numel() >= self.full for t in tensors):
            self.passes.append(name)
        return out


def _flat(value: object) -> Iterator[object]:
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _flat(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _flat(item)
    else:
        yield value


def _tensors(value: object) -> list[torch.Tensor]:
    return [t for t in _flat(value) if isinstance(t, torch.Tensor)]


def count_work(call: Callable[..., object], args: Sequence[object], outputs: int | None = None) -> Work:
    """The backward work of `call(*args)`: gradients of its first `outputs` outputs (all by default)
    that need one, with respect to every Tensor argument that requires grad."""
    inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    with saved_storages() as storages:
        outs = _tensors(call(*args))
    outs = outs[:outputs] if outputs is not None else outs
    full = max(t.numel() for t in [*outs, *_tensors(list(args))])
    live = [o for o in outs if o.requires_grad]
    generator = torch.Generator().manual_seed(1)
    grads = [torch.randn(o.shape, generator=generator, dtype=o.dtype) for o in live]
    counter = CountCalls(full)
    if live and inputs:
        with counter:
            torch.autograd.grad(live, inputs, grads, allow_unused=True)
    return Work(len(counter.names), len(counter.passes), sum(storages.values()), tuple(counter.names))


@contextlib.contextmanager
def through_functions(module: object) -> Iterator[None]:
    """Every `autograd.Function` of an op module taken for every input size (Note [small calls])."""
    saved = {}
    for value in vars(module).values():
        if isinstance(value, type) and "native_below" in vars(value):
            saved[value] = value.native_below
            value.native_below = 0
    try:
        yield
    finally:
        for cls, below in saved.items():
            cls.native_below = below


def scaled_inputs(tests: Any, scale: int, fixed: dict[str, tuple[int | None, ...]] | None = None) -> list[object]:
    """The generated test's inputs in float32, each dimension of more than one entry `scale` times larger,
    except those of a literal size in the spec (`fixed`: per input, its trailing dimensions' sizes or None)."""
    shapes = getattr(tests, "BATCHED_SHAPES", None) or tests.SHAPES

    def scaled(name: str, shape: list[int]) -> list[int]:
        literal = (fixed or {}).get(name, ())
        literal = (None,) * (len(shape) - len(literal)) + literal[-len(shape) :] if shape else ()
        return [n if size is not None or n <= 1 else n * scale for n, size in zip(shape, literal, strict=True)]

    shapes = {name: scaled(name, shape) for name, shape in shapes.items()}
    args = tests.sample_inputs(shapes)
    return [a.detach().float().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]


def measure(
    name: str,
    scale: int = 8,
    package: str = "generated",
    fixed: dict[str, tuple[int | None, ...]] | None = None,
    first_only: bool = False,
) -> dict[str, Work]:
    """The work of op `name` as generated, as naive autograd of its formula, and as PyTorch's op;
    `first_only`: with only the first Tensor input requiring a gradient (a loss's target does not)."""
    tests = importlib.import_module(f"{package}.tests.test_{name}")
    importlib.import_module(f"{package}.tests.harness").DTYPE = torch.float32
    op = tests.OP
    args = scaled_inputs(tests, scale, fixed)
    if first_only:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        for later in tensors[1:]:
            later.requires_grad_(False)

    def naive(*values: object) -> tuple[torch.Tensor, ...]:
        result = tests.reference(*values)
        return tuple(result[n] for n in op.outputs)

    work = {}
    with through_functions(importlib.import_module(f"{package}.ops.{name}")):
        work["generated"] = count_work(op.functional, args)
        work["naive"] = count_work(naive, args)
        native = getattr(tests, "native", None)
        if native is not None:
            work["native"] = count_work(native, args)
            work["generated, first output"] = count_work(op.functional, args, outputs=1)
    return work


def literal_sizes(spec: Spec) -> dict[str, tuple[int | None, ...]]:
    """Per Tensor input of `spec`, the sizes of its declared dimensions that are literal numbers (None else)."""
    return {i.name: tuple(int(d) if str(d).isdigit() else None for d in i.type.dims or ()) for i in spec.tensor_inputs}


HEADERS = (
    "op",
    "gen calls",
    "naive calls",
    "native calls",
    "gen passes",
    "naive passes",
    "native passes",
    "gen/naive bytes",
    "gen/native bytes",
)


def row(name: str, work: dict[str, Work]) -> list[str]:
    gen, naive, native = work["generated"], work["naive"], work.get("native")
    first = work.get("generated, first output", gen)

    def pair(first_only: int, every: int, theirs: int | None) -> str:
        # The generated op's count for the first output alone, in brackets where it differs.
        return "-" if theirs is None else str(theirs) if first_only == every else f"{theirs} ({first_only})"

    bytes_naive = ratio(gen.saved, naive.saved)
    bytes_native = ratio(first.saved, native.saved if native else None)
    return [
        name,
        str(gen.calls),
        str(naive.calls),
        pair(first.calls, gen.calls, native.calls if native else None),
        str(gen.passes),
        str(naive.passes),
        pair(first.passes, gen.passes, native.passes if native else None),
        "-" if bytes_naive is None else f"{bytes_naive:.2f}",
        "-" if bytes_native is None else f"{bytes_native:.2f}",
    ]


def summary(works: dict[str, dict[str, Work]]) -> list[str]:
    """How many ops do no more backward calls than naive (and native), and the totals."""
    gen = sum(w["generated"].calls for w in works.values())
    naive = sum(w["naive"].calls for w in works.values())
    within = sum(w["generated"].calls <= w["naive"].calls for w in works.values())
    with_native = [w for w in works.values() if "native" in w]
    within_native = sum(w["generated, first output"].calls <= w["native"].calls for w in with_native)
    counted = [w for w in works.values() if w["naive"].calls and w["generated"].calls]
    ratios = [w["generated"].calls / w["naive"].calls for w in counted]
    worst = max(works, key=lambda n: works[n]["generated"].calls / max(works[n]["naive"].calls, 1))
    mean = geomean(ratios)
    bytes_gen = sum(w["generated"].saved for w in works.values())
    bytes_naive = sum(w["naive"].saved for w in works.values())
    return [
        f"backward calls <= naive for {within} of {len(works)} ops; {gen} calls against {naive} in all; "
        f"geomean gen/naive {'-' if mean is None else f'{mean:.2f}'}; worst {worst} "
        f"({works[worst]['generated'].calls} against {works[worst]['naive'].calls})",
        f"backward calls <= native for {within_native} of {len(with_native)} ops with a native op",
        f"bytes saved: {bytes_gen:,} generated against {bytes_naive:,} naive in all",
    ]


def markdown(works: dict[str, dict[str, Work]]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row(name, work)) + " |" for name, work in works.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.work", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", nargs="*", help="only these ops (default: every spec)")
    parser.add_argument("--scale", type=int, default=8, help="how much larger than the test's shapes (default 8)")
    parser.add_argument("--calls", action="store_true", help="list each op's backward aten calls, per variant")
    parser.add_argument("--specs", default=str(ROOT / "specs"), help="the spec folder (default specs/)")
    parser.add_argument("--first-only", action="store_true", help="only the first Tensor input requires a gradient")
    args = parser.parse_args(argv)
    specs = load_specs(Path(args.specs), lambda s: not args.ops or s.name in args.ops)
    package = generated_package(args.specs)  # the committed `generated` for specs/, else generated afresh
    ordered = sorted(specs, key=lambda s: s.name)
    works = {
        spec.name: measure(spec.name, args.scale, package, literal_sizes(spec), args.first_only) for spec in ordered
    }
    print(f"backward work, counted (the test's shapes x{args.scale}, float32); {machine()}")
    print("native columns: the generated op's own count in brackets where only the first output's gradient differs.\n")
    print(markdown(works))
    print()
    print("\n".join(summary(works)))
    if args.calls:
        for name, work in works.items():
            print(f"\n{name}:")
            for variant, counted in work.items():
                print(f"  {variant}: {' '.join(counted.names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
