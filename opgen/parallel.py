"""Work spread over the machine's cores: `run_all(task, count, jobs)` is `[task(i) for i in range(count)]`.

A helper of the pipeline that knows nothing of specs. Where the platform forks, the calls run
in `jobs` forked processes (Note [forked workers]); elsewhere, with one job, or with too little
work to share, they run here, one after the other. Either way the results come back as a list
in the order of `i`, so a caller that merges them in that order gets what a serial run gives.

Note [forked workers]
~~~~~~~~~~~~~~~~~~~~~
Generating a spec is pure CPU work in SymPy, and the specs are independent of each other
(the generation cache already relies on it: a spec's files are the same whether it is
generated alone or among others). So `opgen generate` shares the specs among one process per
core. The workers are *forked* after the caller has imported the stages: they start with
SymPy imported and `task` in memory, so nothing but the index goes to a worker and nothing
but the (picklable) result comes back. Writing stays with the caller, which gets every result
before it writes anything. A worker that dies (killed, out of memory) breaks the pool: the
calls whose results did not come back are then run here, one after the other, so the run ends
as a serial run would, with the same output and the same located messages. A process running
other threads never forks (one of them may hold a lock the child would wait on for ever), nor
one where the pool cannot be made (no working semaphores): the calls run here. A `spawn` start
method would import opgen and SymPy again in every worker, which costs more than it saves;
without `fork` (Windows) the calls run here. The objects the workers inherit are frozen
(`gc.freeze`) before the fork: a worker's garbage collection would otherwise visit every one of
them, the whole of SymPy, and so copy every page of the parent's memory it shares.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from concurrent.futures import Future

JOBS_VARIABLE = "OPGEN_JOBS"  # the number of worker processes; 1 runs every spec in the calling process

T = TypeVar("T")

_task: Callable[[int], Any] | None = None  # what this process runs, in a forked worker (`_start`)


def default_jobs() -> int:
    """`$OPGEN_JOBS` if it is a positive whole number, else the cores this process may use."""
    text = os.environ.get(JOBS_VARIABLE, "").strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        return os.cpu_count() or 1


def can_fork() -> bool:
    import multiprocessing  # here, not at the top: a run served from the cache never needs it

    return "fork" in multiprocessing.get_all_start_methods()


def _start(task: Callable[[int], Any]) -> None:
    """Run in each worker as it starts: with `fork` the task is inherited, never pickled."""
    global _task
    _task = task


def _call(index: int) -> Any:
    assert _task is not None, "every worker is started with the task"
    return _task(index)


def _reporting(task: Callable[[int], T], finished: Callable[[int], None]) -> Callable[[int], T]:
    """`task`, calling `finished(i)` after each call that runs here. In a forked worker the pool's
    loop reports instead: the worker runs the task it was started with, `task` unwrapped there."""
    parent = os.getpid()

    def run(index: int) -> T:
        value = task(index)
        if os.getpid() == parent:
            finished(index)
        return value

    return run


@contextlib.contextmanager
def _unfrozen() -> Iterator[None]:
    try:
        yield
    finally:
        gc.unfreeze()


def run_all(
    task: Callable[[int], T], count: int, jobs: int | None = None, finished: Callable[[int], None] | None = None
) -> list[T]:
    """`[task(i) for i in range(count)]`, shared among up to `jobs` forked workers (Note [forked workers]).

    `finished(i)` is called here as each call's result arrives, in whatever order they finish (for a
    progress display). An exception `task` raises in a worker is raised here, as a serial run would raise it."""
    if finished is not None:
        task = _reporting(task, finished)
    jobs = min(default_jobs() if jobs is None else jobs, count)
    if jobs < 2 or not can_fork() or threading.active_count() > 1:  # Note [forked workers]: no other thread
        return [task(i) for i in range(count)]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    results: dict[int, T] = {}
    try:
        context = multiprocessing.get_context("fork")
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_start, initargs=(task,))
    except (OSError, ImportError, NotImplementedError):  # no working semaphores (some containers): serially
        return [task(i) for i in range(count)]
    gc.freeze()  # Note [forked workers]: the workers' collections leave the inherited objects alone
    with pool, _unfrozen():
        futures: list[Future[T]] = [pool.submit(_call, i) for i in range(count)]
        index_of = {future: index for index, future in enumerate(futures)}
        try:
            for future in as_completed(futures):
                with contextlib.suppress(BrokenProcessPool):  # a worker died: run it here, below
                    results[index_of[future]] = future.result()
                    if finished is not None:
                        finished(index_of[future])
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return [results[i] if i in results else task(i) for i in range(count)]
