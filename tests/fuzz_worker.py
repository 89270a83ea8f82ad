"""The fuzz worker: a long-lived Python process that runs one fuzz job at a time.

`fuzz_sandbox.Worker` starts it and sends jobs (`module`, `function`, `args`, working
folder) as length-prefixed pickles on stdin; each answer, ("ok", result) or ("error",
traceback), goes back the same way on a private copy of stdout, so nothing a job prints
(or a hostile generated package writes to fd 1) can corrupt it. A job that does not end is
killed from outside, and the worker started again: torch and SymPy are imported once per
worker, not once per job.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import struct
import sys
import time
import traceback
from typing import Any

HEADER = struct.Struct(">Q")


def run_cli(argv: list[str]) -> dict[str, Any]:
    """`opgen ARGV` in this process: exit status, stdout, stderr, any exception that escaped, time taken."""
    from opgen.cli import main

    out, err = io.StringIO(), io.StringIO()
    escaped = None
    status: Any = None
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exit:
            status = exit.code
        except BaseException:  # noqa: BLE001 - anything that escapes is the finding
            escaped = traceback.format_exc()
    return {
        "status": status,
        "out": out.getvalue(),
        "err": err.getvalue(),
        "escaped": escaped,
        "seconds": time.perf_counter() - start,
    }


def smoke(parent: str, package: str, spec_path: str) -> list[str]:
    """Import a package generated from any spec and call each op once; what went wrong, as text."""
    from pathlib import Path

    import torch
    from fuzz_check import import_fresh

    from opgen.errors import Problems
    from opgen.spec.load import load_file
    from opgen.spec.parse import parse_spec

    module = import_fresh(parent, package)
    problems = Problems()
    spec = parse_spec(load_file(Path(spec_path), spec_path), spec_path, problems)
    if spec is None:
        return ["generated, but the spec no longer parses"]
    shapes = dict(spec.tests.shapes)
    args = []
    for inp in spec.inputs:
        if not inp.is_tensor:
            args.append(spec.test_value(inp))
            continue
        if inp.type.dims is None:
            shape = shapes.get(inp.name, (3, 4))
        else:
            sizes = [2 if d == "..." else int(shapes.get(d, 6)) for d in inp.type.dims]  # 6: halves and thirds
            shape = tuple(sizes)
        lo, hi = spec.tests.domain_of(inp.name)
        args.append((torch.rand(shape, dtype=torch.float64) * (hi - lo) + lo).requires_grad_())
    result = getattr(module, spec.name)(*args)
    outputs = result if isinstance(result, tuple) else (result,)
    differentiable = [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
    if differentiable:
        sum(o.sum() for o in differentiable).backward()  # type: ignore[union-attr]
    return []


def _serve() -> None:
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # stray prints go to the log, never into the answers
    sys.dont_write_bytecode = True
    import torch

    torch.set_num_threads(1)
    home = os.getcwd()
    while True:
        header = requests.read(HEADER.size)
        if len(header) < HEADER.size:
            return
        module_name, function, args, cwd = pickle.loads(requests.read(HEADER.unpack(header)[0]))
        try:
            os.chdir(cwd)
            module = __import__(module_name)
            answer = ("ok", getattr(module, function)(*args))
        except BaseException:  # noqa: BLE001
            answer = ("error", traceback.format_exc())
        finally:
            os.chdir(home)
        try:
            data = pickle.dumps(answer)
        except Exception:  # noqa: BLE001 - an unpicklable result is itself worth reporting
            data = pickle.dumps(("error", traceback.format_exc()))
        answers.write(HEADER.pack(len(data)) + data)
        answers.flush()


if __name__ == "__main__":
    _serve()
