"""Command line: `opgen generate SPEC... -o OUT` and `opgen check SPEC... -o OUT`.

Receives argv; returns an exit status: 0 done (or up to date), 1 `check` found OUT stale,
2 a bad spec or bad arguments (every problem printed as `FILE:LINE:COL: message`, nothing
in OUT changed).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from opgen.cache import CACHE_VARIABLE, Cache, default_folder
from opgen.emit.custom_op import namespace_problem
from opgen.emit.render import Renderer
from opgen.pipeline import build
from opgen.spec.model import FORMS, POLICIES
from opgen.write import files as write
from opgen.write import package_name as names

DESCRIPTION = """Generate custom PyTorch autograd ops (Function, functional, nn.Module and
tests) from YAML specs. Spec format: see the README."""

EPILOG = """exit status: 0 ok, 1 `check` found OUT out of date, 2 a bad spec or argument.
examples:
  opgen generate specs -o generated
  opgen check specs -o generated"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opgen", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in (
        ("generate", "write the package OUT from the specs"),
        ("check", "exit 1 with a diff when OUT is not what `generate` would write"),
    ):
        command = commands.add_parser(name, help=help_text, description=help_text)
        command.add_argument("specs", nargs="+", metavar="SPEC", help="a spec file or a folder of *.yaml specs")
        command.add_argument("-o", "--out", required=True, metavar="OUT", help="the package folder to write")
        command.add_argument(
            "--templates", metavar="DIR", help="a folder of templates that replace opgen's own, file by file"
        )
        command.add_argument(
            "--policy",
            choices=POLICIES,
            help="what backward saves, for every spec (default: each spec's optimize.policy, else balanced)",
        )
        command.add_argument(
            "--fuse", action="store_true", help="compile every op's forward and backward math with torch.compile"
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
    return parser


def _version() -> str:
    """opgen's installed version (the source tree's when it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("opgen")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _error(message: str) -> int:
    print(f"opgen: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = Path(args.out)
    problem = names.before_build(out.name)
    if problem:
        return _error(f"-o {args.out}: {problem}")
    if out.exists() and not out.is_dir():
        return _error(f"-o {args.out}: exists and is not a folder")
    templates = Path(args.templates) if args.templates else None
    if templates is not None and not templates.is_dir():
        return _error(f"--templates {args.templates}: no such folder")
    if args.namespace is not None and (problem := namespace_problem(args.namespace)):
        return _error(f"--namespace {args.namespace}: {problem}; choose an ASCII identifier such as my_ops")
    folder = None if args.no_cache else default_folder()
    cache = Cache(folder, templates) if folder is not None else None
    namespace = out.name if args.namespace is None else args.namespace
    result = build(list(args.specs), Renderer(templates), args.policy, args.fuse, cache, args.form, namespace)
    if result.problems:
        for line in result.problems.report():
            print(line, file=sys.stderr)
        count = len(result.problems.report())
        print(f"opgen: {count} problem{'s' if count != 1 else ''}; nothing was written", file=sys.stderr)
        return 2
    problem = names.after_build(out, result.files)
    if problem:
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
    written = len(change.write) + len(change.delete)
    print(f"{out}: {len(result.specs)} ops, {written} file{'s' if written != 1 else ''} changed")
    return 0


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
        print(f"{out}: up to date ({ops} ops)")
        return 0
    sys.stdout.write(text)
    print(f"{out}: out of date; run `opgen generate {' '.join(args.specs)} -o {args.out}`", file=sys.stderr)
    return 1


def run() -> None:
    sys.exit(main())
