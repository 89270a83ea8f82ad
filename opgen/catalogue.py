"""The op catalogue: `opgen docs SPEC... -o DIR`, a Markdown page per op to look at.

Receives spec paths; writes `DIR/NAME.md` per op, `DIR/index.md`, and for elementwise ops
`DIR/NAME.png`, a plot of f and df/dx over the op's test domain (matplotlib and torch, opgen's
optional extra `docs`). A page shows what the generated code does, read from that code: the formulas
and gradients of the functional's docstring (after the optimizer's rewrites), what
`setup_context` saves, the PyTorch functions (kernels) forward and backward call, and the op's row of a
benchmark table when one is given.

Note [catalogue pages are read from the generated code]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The catalogue shows what a user's package runs, so it reads the op module the pipeline
writes (with Python's `ast`, never by executing it for the text) instead of asking the
stages again: the page cannot drift from the code. Only the plot runs the op, imported from
a temporary copy of the package, in float64 over the test domain. Pages are deterministic
(no dates, no paths outside DIR); the Markdown does not depend on the matplotlib version, the
PNG bytes may (Note [plots are byte-stable per matplotlib]).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import opgen
from opgen.cache import Cache, default_folder
from opgen.emit.render import Renderer
from opgen.formula.syntax import is_elementwise
from opgen.pipeline import Result, build
from opgen.spec.model import Spec

# Calls that are the generated code's plumbing (checks of the mode it runs in), not its math.
PLUMBING = ("torch._", "torch.autograd.", "torch.compiler.", "torch.fx.", "torch.is_", "torch.amp.", "torch.library.")
PLOT_HINT = f"The plot needs matplotlib and torch: {opgen.install_hint('docs')}, then run `opgen docs` again."


@dataclass(frozen=True)
class OpView:
    """What a page shows of one op, read from its generated module."""

    signature: str  # the functional's parameters as written: `x, beta=1.0`
    formulas: tuple[str, ...]  # the docstring's "Forward:" and "Gradients:" lines
    saved: tuple[str, ...]  # what setup_context passes to save_for_backward
    kept: tuple[str, ...]  # plain values setup_context keeps on ctx
    calls: tuple[tuple[str, tuple[str, ...]], ...]  # (forward/backward/jvp, the torch functions it calls)


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _torch_alias(tree: ast.Module) -> str:
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch":
                    return alias.asname or "torch"
    return "torch"


def _calls(function: ast.FunctionDef, torch: str, methods: dict[str, ast.FunctionDef]) -> tuple[str, ...]:
    """The `torch.*` functions a method calls, as `torch.NAME`, first use first; those of `backward` where it
    calls it (a `jvp` that is backward's formula)."""
    found: list[str] = []
    for node in ast.walk(function):
        name = _dotted(node.func) if isinstance(node, ast.Call) else None
        if name and name.endswith(".backward") and function.name != "backward" and "backward" in methods:
            found += [c for c in _calls(methods["backward"], torch, methods) if c not in found]
        elif name and name.startswith(torch + "."):
            name = "torch" + name[len(torch) :]
            if name not in found and not name.startswith(PLUMBING):
                found.append(name)
    return tuple(found)


def _setup(function: ast.FunctionDef, inputs: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(saved for backward, kept on ctx) of `setup_context`."""
    ctx = function.args.args[0].arg
    saved: list[str] = []
    kept: list[str] = []
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and _dotted(node.func) == f"{ctx}.save_for_backward":
            saved += [_saved_text(a, inputs) for a in node.args]
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and _dotted(target.value) == ctx:
                    kept.append(target.attr)
    return tuple(saved), tuple(kept)


def _saved_text(arg: ast.expr, inputs: tuple[str, ...]) -> str:
    """`x`, or `x` (for w's gradient) where setup_context saves it only when that gradient is needed
    (Note [saved for the gradients that read it] in opgen.plan.backward)."""
    if not isinstance(arg, ast.IfExp):
        return ast.unparse(arg)
    tests = arg.test.values if isinstance(arg.test, ast.BoolOp) else [arg.test]
    indices = [t.slice.value for t in tests if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)]
    readers = [inputs[k] for k in indices if isinstance(k, int)]
    return f"{ast.unparse(arg.body)} (for the gradient{'s' * (len(readers) > 1)} of {', '.join(readers)})"


def read_op(spec: Spec, source: str) -> OpView:
    """The page's facts of `spec`, from the text of its generated op module."""
    tree = ast.parse(source)
    torch = _torch_alias(tree)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    functional = functions[spec.name]
    methods = {n.name: n for n in classes[spec.function_class_name].body if isinstance(n, ast.FunctionDef)}
    doc = ast.get_docstring(functional) or ""
    formulas = tuple(doc[doc.index("Forward:") :].splitlines()) if "Forward:" in doc else ()
    saved, kept = _setup(methods["setup_context"], tuple(i.name for i in spec.inputs))
    calls = tuple((m, _calls(methods[m], torch, methods)) for m in ("forward", "backward", "jvp") if m in methods)
    return OpView(ast.unparse(functional.args), formulas, saved, kept, calls)


def elementwise(spec: Spec) -> bool:
    """An op a plot of f and df/dx over one input can show: Tensor inputs without named dimensions."""
    return is_elementwise(spec)


def benchmark_rows(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """The header and the rows by op of the first Markdown table whose first column is `op`."""
    header: list[str] = []
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else []
        if not cells:
            if header:
                break
            continue
        if not header:
            header = cells if cells[0] == "op" else []
        elif not set("".join(cells)) <= set("-: "):
            rows[cells[0]] = cells
    return header, rows


def _summary(spec: Spec) -> str:
    first = (spec.doc or "").strip().split("\n\n")[0]
    return " ".join(first.split())


def _plot_section(spec: Spec, plots: bool) -> list[str]:
    if not elementwise(spec):
        return ["An op of tensors with named dimensions: no plot of one input."]
    x = spec.tensor_inputs[0]
    low, high = spec.tests.domain_of(x.name)
    others = [i.name for i in spec.tensor_inputs[1:] if not i.type.optional]
    where = f"`{x.name}` over the test domain [{low:g}, {high:g}]"
    if others:
        where += ", " + ", ".join(f"`{n}`" for n in others) + " in the middle of theirs"
    lines = [f"f and df/d{x.name} (the gradient backward returns), float64, {where}."]
    if not plots:
        return [*lines, "", PLOT_HINT]
    return [*lines, "", f"![{spec.name} and its derivative]({spec.name}.png)"]


def page(spec: Spec, view: OpView, spec_text: str, bench: tuple[list[str], list[str]] | None, plots: bool) -> str:
    """The Markdown page of one op."""
    lines = [f"# {spec.name}", ""]
    if spec.doc:
        lines += [" ".join(spec.doc.split()), ""]
    exported = [f"`{spec.name}({view.signature})`", f"`{spec.function_class_name}`"]
    exported += [f"`{spec.module.name}`"] if spec.module else []
    lines += ["Generated from `" + spec.source + "`: " + ", ".join(exported) + ".", ""]
    lines += ["## Formulas", "", "As the generated code computes them, after the optimizer's rewrites:", ""]
    lines += ["```text", *view.formulas, "```", ""]
    lines += ["## Saved for backward", ""]
    quoted = [f"`{name}`{' ' * bool(why)}{why}" for name, _, why in (s.partition(" ") for s in view.saved)]
    lines += [(", ".join(quoted) + ".") if view.saved else "No tensor."]
    if view.kept:
        lines[-1] += " Kept on `ctx` as plain values: " + ", ".join(f"`{k}`" for k in view.kept) + "."
    lines += ["", "## PyTorch functions", "", "What the Function's methods call (besides operators):", ""]
    lines += ["| method | calls |", "| --- | --- |"]
    for method, calls in view.calls:
        lines.append(f"| `{method}` | {', '.join(f'`{c}`' for c in calls) or 'operators only'} |")
    if bench is not None:
        header, row = bench
        lines += ["", "## Benchmark", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |", "", "Ratios below 1: the generated op is faster or smaller."]
    lines += ["", "## Plot", "", *_plot_section(spec, plots), ""]
    lines += ["## Spec", "", "```yaml", spec_text.rstrip("\n"), "```"]
    return "\n".join(lines) + "\n"


def index(specs: list[Spec]) -> str:
    lines = ["# The op catalogue", "", INDEX_MARK, ""]
    lines += ["| op | what it is |", "| --- | --- |"]
    for spec in sorted(specs, key=lambda s: s.name):
        summary = _summary(spec).replace("|", "\\|")
        lines.append(f"| [{spec.name}]({spec.name}.md) | {summary} |")
    return "\n".join(lines) + "\n"


def pages(result: Result, spec_texts: dict[str, str], benchmarks: str | None, plots: bool) -> dict[str, str]:
    """Every page's path in DIR -> its Markdown; `plots`: the pages show the PNGs drawn beside them."""
    header, rows = benchmark_rows(benchmarks) if benchmarks is not None else ([], {})
    found = {"index.md": index(result.specs)}
    for spec in result.specs:
        view = read_op(spec, result.files[f"ops/{spec.name}.py"])
        bench = (header, rows[spec.name]) if spec.name in rows else None
        found[f"{spec.name}.md"] = page(spec, view, spec_texts[spec.name], bench, plots)
    return found


# Note [plots are byte-stable per matplotlib]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The PNG is drawn by the Agg backend of a `Figure` of its own (no pyplot state), with fixed
# size, resolution and fonts, and saved without the "Software" text chunk, which names the
# matplotlib version; so two runs with one matplotlib write the same bytes. Another
# matplotlib (or FreeType) may place a pixel differently: the staleness test compares the
# Markdown, and the PNGs only for being drawn where a page shows one.


def can_plot() -> bool:
    """matplotlib draws the plot and torch runs the op: both are the `docs` extra, neither is opgen's own
    dependency (generation needs no torch)."""
    try:
        importlib.import_module("matplotlib.backends.backend_agg")
        importlib.import_module("torch")
    except ImportError:
        return False
    return True


def curves(module: Any, spec: Spec, points: int = 401) -> tuple[Any, Any, Any]:
    """x, f(x) and df/dx of the op's functional over the test domain of its first Tensor input, float64."""
    import torch

    first, *others = spec.tensor_inputs
    low, high = spec.tests.domain_of(first.name)
    x = torch.linspace(low, high, points, dtype=torch.float64, requires_grad=True)
    args: list[Any] = []
    for inp in spec.inputs:
        if inp is first:
            args.append(x)
        elif inp.is_tensor and inp.type.optional:
            args.append(None)
        elif inp.is_tensor:
            a, b = spec.tests.domain_of(inp.name)
            args.append(torch.full((), (a + b) / 2, dtype=torch.float64))
        else:
            args.append(spec.test_value(inp))
    out = getattr(module, spec.name)(*args)
    y = out[0] if isinstance(out, tuple) else out
    (slope,) = torch.autograd.grad(y.sum(), x, allow_unused=True)
    slope = torch.zeros_like(x) if slope is None else slope
    return x.detach().numpy(), torch.broadcast_to(y.detach(), x.shape).numpy(), slope.numpy()


def draw(path: Path, spec: Spec, x: Any, y: Any, slope: Any) -> None:
    """The plot of one op as a PNG at `path` (Note [plots are byte-stable per matplotlib])."""
    from matplotlib import rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    name = spec.tensor_inputs[0].name
    with rc_context({"font.family": "DejaVu Sans", "font.size": 9, "svg.hashsalt": "opgen"}):
        figure = Figure(figsize=(5.0, 3.2), dpi=100)
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        axes.plot(x, y, label=spec.name, color="#1f77b4", linewidth=1.6)
        axes.plot(x, slope, label=f"d{spec.name}/d{name}", color="#d62728", linewidth=1.2, linestyle="--")
        axes.axhline(0, color="#888888", linewidth=0.6)
        axes.axvline(0, color="#888888", linewidth=0.6)
        axes.set_xlabel(name)
        axes.legend(loc="best", frameon=False)
        axes.grid(True, linewidth=0.3)
        figure.tight_layout()
        figure.savefig(path, format="png", metadata={"Software": None})


def plot_all(result: Result, folder: Path) -> None:
    """Draw `NAME.png` in `folder` for every elementwise op, importing a temporary copy of the package."""
    with tempfile.TemporaryDirectory(prefix="opgen-docs-") as temp:
        package = "_opgen_catalogue_ops"
        for rel, text in result.files.items():
            target = Path(temp) / package / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        sys.path.insert(0, temp)
        try:
            module = importlib.import_module(package)
            for spec in result.specs:
                if elementwise(spec):
                    draw(folder / f"{spec.name}.png", spec, *curves(module, spec))
        finally:
            sys.path.remove(temp)
            for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
                del sys.modules[name]


INDEX_MARK = "A page per op, written by `opgen docs`: do not edit."


def stale(out: Path, written: dict[str, str], plotted: set[str]) -> list[Path]:
    """The files of `out` an earlier `opgen docs` wrote that this run does not: the page and plot of
    each op its index listed that is gone, and the plot of a listed op this run draws none for.
    Only what that index names, and a page only if it is still the page opgen wrote (its
    `Generated from` line): a file of the user's in the same folder is never touched."""
    try:
        old = (out / "index.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    if INDEX_MARK not in old:
        return []
    listed = re.findall(r"^\| \[([A-Za-z_][A-Za-z0-9_]*)\]\(\1\.md\) \|", old, flags=re.MULTILINE)
    found = []
    for name in listed:
        page, plot = out / f"{name}.md", out / f"{name}.png"
        if f"{name}.md" not in written and _opgen_page(page, name):
            found.append(page)
        if name not in plotted and plot.is_file():
            found.append(plot)
    return found


def _opgen_page(path: Path, name: str) -> bool:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return text.startswith(f"# {name}\n") and "\nGenerated from `" in text


def _write(path: Path, data: bytes) -> None:
    """Replace `path` atomically, and only when its bytes change."""
    if path.exists() and path.read_bytes() == data:
        return
    temp = path.with_name(f".{path.name}.opgen-tmp")
    temp.write_bytes(data)
    temp.replace(path)


def add_parser(commands: Any) -> None:
    """The `docs` verb of the command line."""
    text = "write a Markdown page per op (and a plot of f and df/dx) into DIR"
    command = commands.add_parser("docs", help=text, description=text)
    command.add_argument("specs", nargs="+", metavar="SPEC", help="a spec file or a folder of *.yaml specs")
    command.add_argument("-o", "--out", required=True, metavar="DIR", help="the folder of the pages")
    command.add_argument(
        "--benchmarks", metavar="FILE", help="a Markdown file whose table with first column `op` gives each op's row"
    )
    command.add_argument("--no-plots", action="store_true", help="draw no plots, even with matplotlib installed")


def main(args: argparse.Namespace) -> int:
    """`opgen docs`: 0 written, 2 a bad spec or argument (nothing written)."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        return _error(f"-o {args.out}: exists and is not a folder")
    benchmarks = None
    if args.benchmarks is not None:
        try:
            benchmarks = Path(args.benchmarks).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            return _error(f"--benchmarks {args.benchmarks}: cannot read it ({error.__class__.__name__})")
        if not benchmark_rows(benchmarks)[1]:
            return _error(f"--benchmarks {args.benchmarks}: no Markdown table whose first column is `op`")
    folder = default_folder()
    result = build(list(args.specs), Renderer(), cache=Cache(folder, None) if folder is not None else None)
    if result.problems:
        for line in result.problems.report():
            print(line, file=sys.stderr)
        print("opgen: nothing was written", file=sys.stderr)
        return 2
    plots = not args.no_plots and can_plot()
    texts = {s.name: Path(s.loc.file).read_text(encoding="utf-8") for s in result.specs}
    written = pages(result, texts, benchmarks, plots)
    plotted = {s.name for s in result.specs if elementwise(s)} if plots else set()
    try:
        out.mkdir(parents=True, exist_ok=True)
        removed = stale(out, written, plotted)  # read from the index before it is rewritten
        if plots:
            plot_all(result, out)
        for rel, text in sorted(written.items()):
            _write(out / rel, text.encode("utf-8"))
        for path in removed:
            path.unlink()
    except OSError as error:
        return _error(f"cannot write {out}: {error}")
    drawn = len(plotted)
    hint = "" if plots or args.no_plots else f" ({PLOT_HINT})"
    print(f"{out}: {len(result.specs)} op pages, {drawn} plots{hint}")
    return 0


def _error(message: str) -> int:
    print(f"opgen: error: {message}", file=sys.stderr)
    return 2
