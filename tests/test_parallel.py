"""Specs generated in forked worker processes (opgen/parallel.py, `build(jobs=...)`): the same
files, warnings and located problems, in the same order, as the serial run; a worker that dies
or raises changes nothing but where the work ran."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

from opgen import pipeline
from opgen.emit.render import Renderer
from opgen.parallel import can_fork, run_all

needs_fork = pytest.mark.skipif(not can_fork(), reason="the platform cannot fork: every run is serial")


def _spec(name: str, formula: str) -> str:
    return f"name: {name}\ninputs: {{x: Tensor}}\noutputs:\n  y: {formula}\n"


# Specs in file-name order: good ones, ones the generate stage refuses (in a worker), one the
# parser refuses (in the parent), and ones whose tests get a located warning.
MIXED = {
    "a_good.yaml": _spec("a_good", "x * sigmoid(x)"),
    "b_warn.yaml": _spec("b_warn", "log(x) * 2"),
    "c_bad.yaml": _spec("c_bad", "x * sqrt(-1)"),
    "d_parse.yaml": "name: d_parse\ninputs: {x: Tensor}\noutputz:\n  y: x\n",
    "e_good.yaml": _spec("e_good", "tanh(x) ** 2"),
    "f_bad.yaml": _spec("f_bad", "x + log(0)"),
    "g_warn.yaml": _spec("g_warn", "sqrt(x - 1)"),
    "h_good.yaml": _spec("h_good", "where(x > 0, x, exp(x) - 1)"),
}


def _folder(tmp_path: Path, specs: dict[str, str]) -> Path:
    folder = tmp_path / "specs"
    folder.mkdir()
    for name, text in specs.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def _run(folder: Path, jobs: int) -> tuple[dict[str, str], list[str], list[str], list[str]]:
    result = pipeline.build([str(folder)], Renderer(), jobs=jobs)
    return result.files, result.warnings, result.problems.report(), [spec.name for spec in result.specs]


@needs_fork
def test_parallel_generation_gives_the_serial_files_byte_for_byte(tmp_path):
    names = ("cross_entropy", "gelu_tanh", "layer_norm", "rms_norm", "safe_sqrt", "softmax", "swish")
    folder = _folder(tmp_path, {f"{n}.yaml": (ROOT / "specs" / f"{n}.yaml").read_text("utf-8") for n in names})
    serial, parallel = _run(folder, 1), _run(folder, 2)
    assert parallel == serial
    files, _, problems, _ = parallel
    assert not problems
    for name in names:  # and what the committed package holds
        assert files[f"ops/{name}.py"] == (ROOT / "generated" / "ops" / f"{name}.py").read_text("utf-8")


@needs_fork
def test_problems_and_warnings_from_workers_are_located_and_in_spec_order(tmp_path):
    folder = _folder(tmp_path, MIXED)
    serial = _run(folder, 1)
    assert _run(folder, 2) == serial
    assert _run(folder, 3) == serial
    _, warnings, problems, _ = serial
    files = [line.split(":")[0].rsplit("/", 1)[-1] for line in problems]
    assert files == ["c_bad.yaml", "d_parse.yaml", "d_parse.yaml", "f_bad.yaml"], problems
    assert problems[0].startswith(f"{folder / 'c_bad.yaml'}:4:10: ") and "sqrt(-1)" in problems[0]
    assert problems[3].startswith(f"{folder / 'f_bad.yaml'}:4:10: ") and "log(0)" in problems[3]
    assert [w.split(":")[0].rsplit("/", 1)[-1] for w in warnings] == ["b_warn.yaml", "g_warn.yaml"]


@needs_fork
def test_a_spec_over_its_budget_in_a_worker_is_a_located_error_in_its_place(tmp_path, monkeypatch):
    """The budget's timer runs in the worker (its main thread): the slow spec alone fails, located."""
    folder = _folder(tmp_path, {k: v for k, v in MIXED.items() if "good" in k})
    original = pipeline.generate

    def slow_e(spec, renderer, problems):  # inherited by the forked workers
        while spec.name == "e_good":
            time.sleep(0.05)
        return original(spec, renderer, problems)

    monkeypatch.setattr(pipeline, "generate", slow_e)
    monkeypatch.setenv("OPGEN_BUDGET", "3")
    files, _, problems, names = _run(folder, 2)
    assert names == ["a_good", "e_good", "h_good"]
    assert len(problems) == 1 and problems[0].startswith(f"{folder / 'e_good.yaml'}:1:1: spec too costly")
    assert "ops/a_good.py" in files and "ops/h_good.py" in files and "ops/e_good.py" not in files


@needs_fork
def test_the_work_runs_in_forked_workers_and_comes_back_in_order():
    # In a fresh interpreter: this one may run other threads by now (torch's), and then forks nothing.
    check = """if True:
        import os
        from opgen.parallel import run_all
        parent = os.getpid()
        results = run_all(lambda i: (i, os.getpid()), 12, jobs=2)
        assert [i for i, _ in results] == list(range(12))
        assert parent not in {pid for _, pid in results}
        assert run_all(lambda i: (i, os.getpid()), 3, jobs=1) == [(i, parent) for i in range(3)]
        import gc
        # the workers saw the inherited objects frozen; the caller has them back for its collections
        assert run_all(lambda i: gc.get_freeze_count() > 0, 4, jobs=2) == [True] * 4
        assert gc.get_freeze_count() == 0
    """
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@needs_fork
def test_work_a_dead_worker_did_not_return_runs_in_the_caller():
    parent = os.getpid()

    def task(i: int) -> int:
        if i == 3 and os.getpid() != parent:
            os._exit(7)  # the worker dies, as under the OOM killer
        return i * i

    assert run_all(task, 10, jobs=2) == [i * i for i in range(10)]


@needs_fork
def test_an_exception_in_a_worker_is_raised_in_the_caller():
    def task(i: int) -> int:
        if i == 4:
            raise ValueError("boom in 4")
        return i

    with pytest.raises(ValueError, match="boom in 4"):
        run_all(task, 8, jobs=2)


def test_one_job_or_one_spec_never_forks(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked"))
    parent = os.getpid()
    assert run_all(lambda i: os.getpid(), 1, jobs=4) == [parent]
    monkeypatch.setenv("OPGEN_JOBS", "1")
    assert run_all(lambda i: os.getpid(), 5) == [parent] * 5


@needs_fork
def test_without_working_semaphores_the_work_runs_in_the_caller(monkeypatch):
    import concurrent.futures

    def no_pool(*args, **kwargs):
        raise OSError(38, "Function not implemented")  # sem_open in a container without /dev/shm

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", no_pool)
    parent = os.getpid()
    assert run_all(lambda i: (i, os.getpid()), 4, jobs=2) == [(i, parent) for i in range(4)]


def test_a_process_running_other_threads_never_forks(monkeypatch):
    """A lock another thread holds at the fork would be held for ever in the child."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked"))
    with ThreadPoolExecutor(2) as threads:
        squares = threads.submit(run_all, lambda i: (i * i, os.getpid()), 16, 2)
        negatives = threads.submit(run_all, lambda i: -i, 16, 2)
        assert squares.result() == [(i * i, os.getpid()) for i in range(16)]
        assert negatives.result() == [-i for i in range(16)]


@needs_fork
@pytest.mark.parametrize(("specs", "forks"), [(3, False), (2 * pipeline.SPECS_PER_WORKER, True)])
def test_a_few_specs_are_generated_in_one_process_many_in_workers(tmp_path, monkeypatch, specs, forks):
    """A worker's start (templates, SymPy's caches) costs what a few specs do."""
    import opgen.parallel

    folder = _folder(tmp_path, {f"op{k}.yaml": _spec(f"op{k}", f"x * {k + 2}") for k in range(specs)})
    monkeypatch.setenv("OPGEN_JOBS", "2")
    calls: list[int] = []
    original = opgen.parallel.run_all

    def counting(task, count, jobs, finished=None):
        calls.append(jobs)
        return original(task, count, jobs, finished)

    monkeypatch.setattr(pipeline, "run_all", counting)
    result = pipeline.build([str(folder)], Renderer())
    assert not result.problems and len(result.specs) == specs
    assert calls == [2 if forks else 1]


@pytest.mark.parametrize("jobs", [1, 2])
def test_each_finished_call_is_reported_once_in_the_calling_process(jobs):
    """`finished(i)` runs here, once per call, whether the call ran here or in a forked worker."""
    parent, seen = os.getpid(), []
    results = run_all(lambda i: i * i, 6, jobs, finished=lambda i: seen.append((i, os.getpid())))
    assert results == [i * i for i in range(6)]
    assert sorted(seen) == [(i, parent) for i in range(6)]
