"""Command line: `opgen generate|check [SPEC...] [-o OUT]`, `opgen show SPEC...`, `opgen new NAME`.

Receives argv; returns an exit status: 0 done (or up to date), 1 `check` found OUT stale,
2 a bad spec, argument or `[tool.opgen]` (every problem printed as `FILE:LINE:COL: message`,
nothing in OUT changed). `generate` and `check` take what the command line leaves out from
`[tool.opgen]` in the project's pyproject.toml (opgen.commands.config); flags win.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import opgen
from opgen import catalogue
from opgen.cache import CACHE_VARIABLE, Cache, default_folder
from opgen.commands import config as configuration
from opgen.commands.skeleton import skeleton
from opgen.emit.custom_op import namespace_problem
from opgen.emit.render import Renderer
from opgen.errors import Problems, SpecError
from opgen.pipeline import build, plan_all
from opgen.spec.model import FORMS, POLICIES
from opgen.spec.parse import name_problem
from opgen.write import files as write
from opgen.write import package_name as names

DESCRIPTION = """Generate custom PyTorch autograd ops (Function, functional, nn.Module and
tests) from YAML specs. Spec format: docs/spec-format.md."""

EPILOG = """exit status: 0 ok, 1 `check` found OUT out of date, 2 a bad spec, argument or [tool.opgen].
examples:
  opgen new my_act -o specs         # a commented spec to start from
  opgen show specs/my_act.yaml      # its formulas, gradients, saved tensors and kernels
  opgen generate specs -o generated
  opgen check specs -o generated
  opgen generate                    # with [tool.opgen] specs and out in pyproject.toml"""

CONFIG_HELP = "(default: [tool.opgen] in pyproject.toml, found from here upward)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opgen", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    # -q/-v before the command too (`opgen -v generate`), as after it; Note [loudness anywhere]
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", dest="quiet_before", action="store_true", help="generate's and check's -q")
    loud.add_argument("-v", "--verbose", dest="verbose_before", action="store_true", help="generate's and check's -v")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in (
        ("generate", "write the package OUT from the specs"),
        ("check", "exit 1 when OUT is not what `generate` would write (--diff shows how)"),
    ):
        command = commands.add_parser(name, help=help_text, description=f"{help_text}. {CONFIG_HELP[1:-1]}.")
        _build_options(command)
        if name == "check":
            command.add_argument("--diff", action="store_true", help="print the unified diff of a stale OUT")
        loudness = command.add_mutually_exclusive_group()
        loudness.add_argument("-q", "--quiet", action="store_true", help="print problems only, no summary")
        loudness.add_argument("-v", "--verbose", action="store_true", help="also name the config and every file")
    show = commands.add_parser(
        "show",
        help="print each op's formulas, gradients, what backward saves and its kernels; writes nothing",
        description="print each op's formulas after the rewrites, every gradient, what backward saves and the "
        "kernels chosen; writes nothing",
    )
    show.add_argument("specs", nargs="*", metavar="SPEC", help=f"a spec file or a folder of *.yaml specs {CONFIG_HELP}")
    show.add_argument("--latex", action="store_true", help="the formulas and gradients in LaTeX")
    show.add_argument("--policy", choices=POLICIES, help="what backward saves (default: each spec's)")
    new = commands.add_parser(
        "new", help="write a commented spec NAME.yaml to start from", description="write a commented spec to start from"
    )
    new.add_argument("name", metavar="NAME", help="the op's name, snake_case (e.g. my_act)")
    new.add_argument("--module", action="store_true", help="with a `module:` section (an nn.Module with a parameter)")
    new.add_argument("-o", "--out", metavar="DIR", help="the folder to write NAME.yaml in (default: here)")
    catalogue.add_parser(commands)
    return parser


def _build_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "specs", nargs="*", metavar="SPEC", help=f"a spec file or a folder of *.yaml specs {CONFIG_HELP}"
    )
    command.add_argument("-o", "--out", metavar="OUT", help=f"the package folder to write {CONFIG_HELP}")
    command.add_argument(
        "--templates", metavar="DIR", help="a folder of templates that replace opgen's own, file by file"
    )
    command.add_argument(
        "--policy",
        choices=POLICIES,
        help="what backward saves, for every spec (default: each spec's optimize.policy, else balanced)",
    )
    command.add_argument(
        "--fuse",
        action=argparse.BooleanOptionalAction,
        help="compile every op's forward and backward math with torch.compile",
    )
    command.add_argument(
        "--form",
        choices=FORMS,
        help="the form of every spec without a `form:` key (default: function, a torch.autograd.Function)",
    )
    command.add_argument(
        "--namespace",
        metavar="NAME",
        help="the torch.library namespace of custom_op-form ops (default: the package name)",
    )
    command.add_argument(
        "--no-cache",
        action="store_true",
        help=f"generate every spec afresh, without reading or writing the cache (${CACHE_VARIABLE})",
    )
    command.add_argument(
        "--wait",
        type=float,
        default=write.swap.LOCK_WAIT,
        metavar="SECONDS",
        help=f"how long to wait for another opgen run writing OUT (default {write.swap.LOCK_WAIT:g})",
    )


def _version() -> str:
    """opgen's version, and the torch releases the code it generates supports."""
    return f"{opgen.__version__} (generated code: {opgen.TORCH_REQUIREMENT})"


def _error(message: str) -> int:
    print(f"opgen: error: {message}", file=sys.stderr)
    return 2


def _report(problems: Problems, what: str = "nothing was written") -> int:
    lines = problems.report()
    for line in lines:
        print(line, file=sys.stderr)
    print(f"opgen: {len(lines)} problem{'s' if len(lines) != 1 else ''}; {what}", file=sys.stderr)
    return 2


# Note [loudness anywhere]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# `-q`/`-v` belong to `generate` and `check`, but users put them before the command as often as
# after it (`opgen -v generate`, as `git -C`, `pip -v`). The top-level parser takes them under
# other names (a subparser's defaults would overwrite the same names) and `main` merges them;
# one of each side together (`opgen -q check -v`) is refused as the pair is after the command.


def _merge_loudness(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    before = "-q" if args.quiet_before else "-v" if args.verbose_before else None
    if before is None:
        return
    if not hasattr(args, "quiet"):
        parser.error(f"{before} is an option of generate and check only")
    if (before == "-q" and args.verbose) or (before == "-v" and args.quiet):
        parser.error("argument -q/--quiet: not allowed with argument -v/--verbose")
    args.quiet = args.quiet or args.quiet_before
    args.verbose = args.verbose or args.verbose_before


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(words)
    _merge_loudness(parser, args)
    args.words = words
    if args.command == "docs":
        return catalogue.main(args)
    if args.command == "show":
        return _show(args)
    if args.command == "new":
        return _new(args)
    try:
        problem = _configure(args)
    except configuration.NoToml as error:
        if not (args.specs and args.out):
            print(error, file=sys.stderr)
            return 2
        print(
            f"{error.loc}: warning: [tool.opgen] not read ({error.why}); running with the command line alone",
            file=sys.stderr,
        )
        args.config = None
        problem = _configure(args, configuration.Config())
    except SpecError as error:
        print(error, file=sys.stderr)
        return 2
    if problem:
        return _error(problem)
    return _generate(args)


def _configure(args: argparse.Namespace, found: configuration.Config | None = None) -> str | None:
    """Fill what the command line left out from `[tool.opgen]` (`found`, else the one read from
    here upward; flags win); why it cannot run, or None."""
    if found is None:
        found = configuration.load(Path.cwd())
    args.config = found.file
    if not args.specs and found.specs is not None:
        args.specs = list(found.specs)
    for key in ("out", "policy", "fuse", "templates", "form"):
        if getattr(args, key, None) is None:
            setattr(args, key, getattr(found, key))
    missing = [what for what, value in (("SPEC", args.specs), ("-o OUT", args.out)) if not value]
    if missing:
        where = f"{found.file}'s [tool.opgen]" if found.file else "a [tool.opgen] table in pyproject.toml"
        return f"give {' and '.join(missing)} on the command line, or set them in {where} (specs, out)"
    args.fuse = bool(args.fuse)
    return None


def _generate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if problem := names.before_build(out.name):
        return _error(f"-o {args.out}: {problem}")
    if out.exists() and not out.is_dir():
        return _error(f"-o {args.out}: exists and is not a folder")
    templates = Path(args.templates) if args.templates else None
    if templates is not None and not templates.is_dir():
        return _error(f"--templates {args.templates}: no such folder")
    if args.verbose and args.config is not None:
        print(f"opgen: using [tool.opgen] of {args.config}", file=sys.stderr)
    if args.namespace is not None and (problem := namespace_problem(args.namespace)):
        return _error(f"--namespace {args.namespace}: {problem}; choose an ASCII identifier such as my_ops")
    folder = None if args.no_cache else default_folder()
    cache = Cache(folder, templates) if folder is not None else None
    namespace = out.name if args.namespace is None else args.namespace
    progress = _Progress(verbose=args.verbose) if not args.quiet else None
    result = build(
        list(args.specs),
        Renderer(templates),
        args.policy,
        args.fuse,
        cache,
        args.form,
        namespace,
        progress=progress,
    )
    if progress is not None:
        progress.close()
    if result.problems:
        return _report(result.problems)
    if args.command == "generate":
        for line in result.warnings:  # located warnings print under --quiet too, as problems do
            print(line, file=sys.stderr)
    if problem := names.after_build(out, result.files):
        return _error(f"-o {args.out}: {problem}")
    try:
        if args.command == "check":
            return _check(args, out, result.files, len(result.specs))
        change, kept = write.generate(out, result.files, args.wait)
    except write.WriteError as error:
        return _error(str(error))
    except OSError as error:
        return _error(f"cannot write {out}: {error}; nothing was changed")
    if change.conflicts:
        return _conflicts(out, change)
    for folder in kept:
        print(f"opgen: warning: files that changed in {out} while opgen wrote it are kept in {folder}", file=sys.stderr)
    if args.verbose:
        for rel in _changed(change):
            print(f"{out / rel}: {'removed' if rel in change.delete else 'written'}")
    written = len(change.write) + len(change.delete)
    if not args.quiet:
        print(f"{out}: {len(result.specs)} ops, {written} file{'s' if written != 1 else ''} changed")
    return 0


class _Progress:
    """How far a generation is, on stderr: on a terminal one line rewritten in place and cleared at the
    end; elsewhere (a CI log, a pipe) a plain line per spec under -v, nothing otherwise."""

    def __init__(self, verbose: bool) -> None:
        self.terminal = sys.stderr.isatty()
        self.verbose = verbose
        self.shown = False

    def __call__(self, done: int, total: int, name: str) -> None:
        if self.terminal:
            sys.stderr.write(f"\r\033[Kopgen: generated {done}/{total} ({name})")
            sys.stderr.flush()
            self.shown = True
        elif self.verbose:
            print(f"opgen: generated {name} ({done}/{total})", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _changed(change: write.Changes) -> list[str]:
    return sorted([*change.write, *change.delete])


def _conflicts(out: Path, change: write.Changes) -> int:
    for rel in change.conflicts:
        print(
            f"{out / rel}: exists and is not opgen's (not in its {write.MANIFEST}); move it away or choose another -o",
            file=sys.stderr,
        )
    print("opgen: nothing was written", file=sys.stderr)
    return 2


def _check(args: argparse.Namespace, out: Path, files: dict[str, str], ops: int) -> int:
    change, text = write.check(out, files, args.wait)
    if change.conflicts:
        return _conflicts(out, change)
    if change.clean:
        if not args.quiet:
            print(f"{out}: up to date ({ops} ops)")
        return 0
    if args.diff:
        sys.stdout.write(text)
    if args.verbose:
        for rel in _changed(change):
            print(f"{out / rel}: {'would be removed' if rel in change.delete else 'differs'}", file=sys.stderr)
    count = len(change.write) + len(change.delete)
    command = _regenerate(args.words)
    more = "" if args.diff else f"; `{_diff(args.words)}` shows how"
    print(
        f"{out}: out of date ({count} file{'s' if count != 1 else ''} differ{'' if count != 1 else 's'}); "
        f"run `{command}`{more}",
        file=sys.stderr,
    )
    return 1


# What only changes how `check` reports, not what it compares: left out of the hint's `generate`.
_REPORT_ONLY = ("--diff", "-q", "--quiet", "-v", "--verbose")


def _regenerate(words: list[str]) -> str:
    """The `generate` command that writes what `check words...` compared with: the same specs, OUT,
    config and options (the first `check` is the command; only global -q/-v can stand before it)."""
    at = words.index("check")
    kept = [w for w in words[:at] + ["generate"] + words[at + 1 :] if w not in _REPORT_ONLY]
    return shlex.join(["opgen", *kept])


def _diff(words: list[str]) -> str:
    """`check words...` again, with --diff."""
    return shlex.join(["opgen", *[w for w in words if w not in ("-q", "--quiet")], "--diff"])


def _show(args: argparse.Namespace) -> int:
    from opgen.emit.show import show  # imports SymPy: only `show` pays for it

    if not args.specs:
        try:
            args.specs = list(configuration.load(Path.cwd()).specs or ())
        except SpecError as error:
            print(error, file=sys.stderr)
            return 2
        if not args.specs:
            return _error("give SPEC on the command line, or set specs in [tool.opgen] of pyproject.toml")
    planned, problems = plan_all(list(args.specs), args.policy)
    if problems:
        return _report(problems, "nothing to show")
    blocks = ["\n".join(show(one.plan, args.latex)) for one in planned]
    print("\n\n".join(blocks))
    return 0


def _new(args: argparse.Namespace) -> int:
    name = args.name
    if problem := name_problem(name):
        return _error(f"NAME '{name}' {problem}")
    folder = Path(args.out) if args.out else Path(".")
    path = folder / f"{name}.yaml"
    if path.exists() or path.is_symlink():
        return _error(f"{path} already exists; opgen new never overwrites a file: choose another NAME or -o DIR")
    if folder.exists() and not folder.is_dir():
        return _error(f"-o {args.out}: exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with path.open("x", encoding="utf-8") as handle:  # "x": never replaces a file made meanwhile
            handle.write(skeleton(name, args.module))
    except FileExistsError:
        return _error(f"{path} already exists; opgen new never overwrites a file: choose another NAME or -o DIR")
    except OSError as error:
        return _error(f"cannot write {path}: {error.strerror}")
    print(f"{path}: written; try `opgen show {path}`, then `opgen generate {folder} -o OUT`")
    return 0


# Note [quick exit]
# ~~~~~~~~~~~~~~~~~
# A process that derived specs holds SymPy's caches and millions of small objects; tearing the
# interpreter down frees them one by one, about a tenth of a cold `opgen generate`. The console
# command has nothing left to do once `main` returns (the writer has closed, fsynced and renamed
# every file; the worker processes have been joined), so it runs the exit handlers registered
# with `atexit` (a coverage tool's, say), flushes its streams and ends the process without the
# teardown. `main`, which tests and other programs call, returns normally.


def run() -> None:  # Note [quick exit]
    try:
        status = main()
    except BrokenPipeError:  # `opgen show | head`: the reader has gone; nothing more can be told
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 141  # as a shell reports a command that SIGPIPE ended
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe or stream: nothing more can be told
        pass
    os._exit(status)
