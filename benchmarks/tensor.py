"""Forward+backward time, bytes saved and extreme-input safety of the tensor ops in `specs/`
(norms, softmax, losses, matrix ops), against PyTorch's own op.

    .venv/bin/python -m benchmarks.tensor [--rows 4096] [--dim 1024] [--repeats 15] [--ops softmax ...]

Each op with a PyTorch counterpart (`NATIVE` below) runs, interleaved in one process on one
thread in float32, as `generated` (the committed package), `naive` (the spec's formula in plain
torch under autograd: the generated test's `reference`), `native` (PyTorch's op) and, with
`--compile`, `compiled` (`torch.compile` of the naive formula: what a user would pick instead
of opgen). Inputs are `[rows, dim]` (a leading `...` is `rows`; every named dimension is `dim`,
or `--matrix-dim` for ops with two or more named dimensions, whose matmuls would dominate).
"finite" says whether the generated op's values and gradients are finite at logits of ±1e4
wherever PyTorch's are.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.run import ROOT, Case, geomean, load_specs, machine, measure, median_ms, ratio
from opgen.spec.model import Spec


def _attention(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.softmax(q @ k.mT / math.sqrt(q.shape[-1]), dim=-1)


# PyTorch's own op for a spec, called with the spec's inputs in spec order.
NATIVE: dict[str, Callable[..., torch.Tensor]] = {
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "softmax_naive": lambda x: torch.softmax(x, dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=-1),
    "logsumexp": lambda x: torch.logsumexp(x, dim=-1),
    "linear": F.linear,
    "cosine_similarity": lambda x1, x2, eps: F.cosine_similarity(x1, x2, dim=-1, eps=eps),
    "attention_scores": _attention,
    "rms_norm": lambda x, weight, eps: F.rms_norm(x, (x.shape[-1],), weight, eps),
    "layer_norm": lambda x, weight, bias, eps: F.layer_norm(x, (x.shape[-1],), weight, bias, eps),
    "glu": lambda x: F.glu(x, dim=-1),
    "cross_entropy": lambda input, target: F.cross_entropy(input, target),  # probability targets, batch mean
    "label_smoothing_ce": lambda input, target, smoothing: F.cross_entropy(input, target, label_smoothing=smoothing),
    "kl_div": lambda input, target: F.kl_div(input, target, reduction="batchmean"),
}


def tensor_specs(folder: Path) -> list[Spec]:
    """The specs with named dimensions that have a PyTorch counterpart."""
    return load_specs(folder, lambda s: s.name in NATIVE and any(i.type.dims for i in s.tensor_inputs))


def _shape(spec: Spec, dims: tuple[str, ...], rows: int, dim: int, matrix_dim: int) -> list[int]:
    """Elementwise-over-rows ops (one named dimension): `...` is `rows`, the dimension `dim`.
    Matrix ops (two or more): no `...`, their first named dimension `rows`, the others `matrix_dim`."""
    named = [d for i in spec.tensor_inputs for d in (i.type.dims or ()) if d != "..."]
    if len(set(named)) <= 1:
        return [rows if d == "..." else dim for d in dims]
    return [rows if d == named[0] else matrix_dim for d in dims if d != "..."]


def make_case(spec: Spec, rows: int, dim: int, matrix_dim: int, seed: int, compiled: bool) -> Case:
    generator = torch.Generator().manual_seed(seed)
    args: list[object] = []
    tensors = []
    for k, inp in enumerate(spec.inputs):
        if inp.is_tensor and inp.type.dims is not None:
            low, high = spec.tests.domain_of(inp.name)
            shape = _shape(spec, inp.type.dims, rows, dim, matrix_dim)
            sample = low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float32)
            args.append(sample.requires_grad_())
            tensors.append(k)
        elif inp.is_tensor:
            args.append(None)  # an optional elementwise input: absent
        else:
            args.append(spec.test_value(inp))
    generated = importlib.import_module("generated")
    tests = importlib.import_module(f"generated.tests.test_{spec.name}")
    importlib.import_module("generated.tests.harness").DTYPE = torch.float32
    first = spec.outputs[0].name

    def naive(*values: object) -> object:
        return tests.reference(*values)[first]

    calls: dict[str, Callable[..., object]] = {
        "generated": lambda *a: _first(getattr(generated, spec.name)(*a)),
        "naive": naive,
        "native": NATIVE[spec.name],
    }
    if compiled:
        calls["compiled"] = torch.compile(naive)
    return Case(spec, calls, args, tensors)


def _first(value: object) -> object:
    return value[0] if isinstance(value, tuple) else value


def finite_at_extremes(case: Case, scale: float = 1e4) -> bool:
    """Whether the generated op is finite (values and gradients) at ±`scale` inputs wherever
    PyTorch's op is."""
    results = {}
    for variant in ("generated", "native"):
        args = [
            (torch.sign(a.detach() - a.detach().mean()) * scale).requires_grad_() if k in case.tensors else a
            for k, a in enumerate(case.args)
        ]
        out = case.calls[variant](*args)
        grads = torch.autograd.grad(out.sum(), [args[k] for k in case.tensors], allow_unused=True)
        results[variant] = [bool(torch.isfinite(out).all())] + [
            g is None or bool(torch.isfinite(g).all()) for g in grads
        ]
    return all(g or not n for g, n in zip(results["generated"], results["native"], strict=True))


def _output_grad(case: Case) -> list[torch.Tensor]:
    """The incoming gradient: shaped like the op's (first) output."""
    out = case.calls["native"](*case.args)
    return [torch.randn(out.shape, generator=torch.Generator().manual_seed(1))]  # type: ignore[union-attr]


def table(cases: list[Case]) -> str:
    headers = (
        "op",
        "gen ms",
        "gen/native time",
        "gen/naive time",
        "compiled/native time",
        "gen/native bytes",
        "finite",
    )
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    ratios = []
    for case in cases:
        gen, native = median_ms(case, "generated"), median_ms(case, "native")
        values = [
            gen,
            ratio(gen, native),
            ratio(gen, median_ms(case, "naive")),
            ratio(median_ms(case, "compiled"), native),
            ratio(case.saved.get("generated"), case.saved.get("native")),
        ]
        if values[1] is not None:
            ratios.append(values[1])
        cells = ["-" if v is None else f"{v:.2f}" for v in values]
        lines.append(
            f"| {case.spec.name} | " + " | ".join(cells) + f" | {'yes' if finite_at_extremes(case) else 'NO'} |"
        )
    mean = geomean(ratios)
    lines.append(f"| geomean | | {'-' if mean is None else f'{mean:.2f}'} | | | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tensor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4096, help="the leading (`...`) size (default 4096)")
    parser.add_argument("--dim", type=int, default=1024, help="every named dimension's size (default 1024)")
    parser.add_argument("--matrix-dim", type=int, default=256, help="named sizes of ops with 2+ named dims")
    parser.add_argument("--repeats", type=int, default=15, help="timed runs per op and variant (median taken)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--ops", nargs="*", help="only these ops (default: every tensor spec with a native op)")
    parser.add_argument("--specs", default=str(ROOT / "specs"), help="the spec folder (default specs/)")
    parser.add_argument("--compile", action="store_true", help="add torch.compile of the naive formula")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    specs = [s for s in tensor_specs(Path(args.specs)) if not args.ops or s.name in args.ops]
    cases = [make_case(s, args.rows, args.dim, args.matrix_dim, k, args.compile) for k, s in enumerate(specs)]
    measure(cases, args.repeats, args.warmup, _output_grad)
    print(f"[{args.rows}, {args.dim}] float32, forward + backward, median of {args.repeats}; {machine()}")
    print("Times share the machine's cores with whatever else runs: ratios are noisy, rerun to compare.\n")
    print(table(cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
