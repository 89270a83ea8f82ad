"""Resource limits: the numbers that refuse a pathological spec in seconds, and the time budget.

Every limit is far above what a real op needs (the largest spec in `specs/` is under a tenth
of each) and below where opgen gets slow; a spec over one gets a located `SpecError` naming
the limit. What no size limit can foresee is stopped by the time budget: each spec gets
`budget_seconds()` of wall-clock time to load, derive and emit (Note [spec budget]).
The "Limits" table of docs/spec-format.md lists them; keep the two in step.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import TYPE_CHECKING

from opgen.errors import Interrupted, Loc, SpecError

if TYPE_CHECKING:  # annotations only: the spec stage reads these limits without importing SymPy
    import sympy


@dataclass(frozen=True)
class Limit:
    """One resource limit; `name` is its row in the Limits table of docs/spec-format.md."""

    name: str
    value: int
    unit: str

    def refuse(self, loc: Loc, what: str, size: int, hint: str) -> SpecError:
        """The error for `what` at `loc`, `size` units big: which limit, and how to get under it."""
        size_text = f"{size} {self.unit}" if self.unit else str(size)
        return SpecError(loc, f"{what} is {size_text}, over the '{self.name}' limit of {self.value}; {hint}")


YAML_NODES = Limit("YAML nodes", 10_000, "nodes")  # counting what every alias `*name` repeats
YAML_DEPTH = Limit("YAML depth", 32, "levels deep")  # nesting of mappings and lists
DIGITS = Limit("digits per number", 100, "digits")  # one number literal, in a formula or a YAML value
FORMULA_NODES = Limit("formula size", 500, "nodes")  # operators, calls, names and numbers as written
FORMULA_DEPTH = Limit("formula depth", 100, "levels deep")  # as written: `a + b + c` is 3 deep
INLINED_NODES = Limit("inlined size", 1_000, "nodes")  # an output with its lets written out, each use counted
INLINED_DEPTH = Limit("inlined depth", 100, "levels deep")
INPUTS = Limit("inputs", 64, "")
LETS = Limit("lets", 64, "")
OUTPUTS = Limit("outputs", 16, "")
# An op's name names its files (`tests/test_NAME.py`, `docs/ops/NAME.md`): a file system takes 255 bytes.
NAME_LENGTH = Limit("name length", 200, "characters")
FLOAT64_BITS = 1024  # 'constant size': a constant power must stay below 2 ** 1024 in size (float64's range)
BUDGET_SECONDS = 20.0  # 'time budget' per spec; `OPGEN_BUDGET` (seconds) changes it
BUDGET_VARIABLE = "OPGEN_BUDGET"


def digit_runs(text: str) -> Iterator[tuple[int, int]]:
    """(start, length) of each run of digits in `text` longer than the 'digits per number' limit."""
    start = None
    for k, char in enumerate(text + " "):
        if "0" <= char <= "9":
            if start is None:
                start = k
        elif start is not None:
            if k - start > DIGITS.value:
                yield start, k - start
            start = None


def power_bits(base: sympy.Expr, exponent: sympy.Expr) -> float:
    """log2 of |base ** exponent| for two numbers, estimated in floats (±inf when it overflows)."""
    try:
        size = abs(complex(base.evalf(15)))
        power = complex(exponent.evalf(15))
    except (TypeError, ValueError, OverflowError):
        return 0.0  # zoo, nan and the like: SymPy's own rules apply
    if size in (0.0, 1.0) or math.isnan(size) or math.isnan(power.real):
        return 0.0
    bits = power.real * math.log2(size)
    return bits if math.isfinite(bits) else math.copysign(math.inf, bits)


def beyond_float64(expr: sympy.Expr) -> bool:
    """Whether the number `expr`, or a literal number among its operands or theirs (the coefficients
    SymPy folds, `1e308 * 1e308 * x`), is finite but at least 2 ** 1024 in size: outside float64.
    `inf` as written is no such number."""
    # not `log(10**400)`: a function's exact argument
    sums = [e for e in (expr, *expr.args) if e.is_Add or e.is_Mul] if expr.is_Add or expr.is_Mul else []
    literals = [a for e in sums for a in e.args if a.is_Rational or a.is_Float]
    for sub in (expr, *literals):
        if not sub.is_number or sub.is_infinite or sub.is_Float and math.isnan(float(sub)):
            continue
        try:
            size = abs(sub) if sub.is_Rational or sub.is_Float else abs(sub.evalf(15))
            if size.is_Number and not size.is_infinite and size >= 2**FLOAT64_BITS:
                return True
        except (TypeError, ValueError, OverflowError):
            continue
    return False


def evaluated(expr: sympy.Expr) -> sympy.Expr:
    """A number SymPy evaluated into an exact form that holds an integer beyond float64 (`lgamma(100000)`
    is `log(99999!)`, whose digits no printer writes): its float64 value; any other `expr` as it is."""
    if not expr.is_number or expr.is_Rational or expr.is_Float:
        return expr
    if not any(a.is_Rational and max(abs(a.p), a.q) >= 2**FLOAT64_BITS for a in expr.atoms()):
        return expr
    value = expr.evalf(17)
    return value if value.is_Float else expr


def tree_size_and_depth(expr: sympy.Basic) -> tuple[int, int]:
    """Size and depth of `expr` as a tree (a shared subexpression counts each time it is used).

    Computed over the distinct subexpressions, so it stays fast when the tree is huge.
    """
    size: dict[sympy.Basic, int] = {}
    depth: dict[sympy.Basic, int] = {}
    stack: list[tuple[sympy.Basic, bool]] = [(expr, False)]
    while stack:
        node, children_done = stack.pop()
        if node in size:
            continue
        if not children_done:
            stack.append((node, True))
            stack.extend((arg, False) for arg in node.args if arg not in size)
            continue
        size[node] = 1 + sum(size[arg] for arg in node.args)
        depth[node] = 1 + max((depth[arg] for arg in node.args), default=0)
    return size[expr], depth[expr]


def check_inlined(expr: sympy.Basic, loc: Loc, name: str) -> None:
    """Refuse a formula (`name`: "output 'y'") that is over the size or depth limit with its lets written out."""
    size, depth = tree_size_and_depth(expr)
    what = f"{name} with its lets written out"
    if size > INLINED_NODES.value:
        hint = "use each let fewer times (every use repeats its whole formula), or split the op"
        raise INLINED_NODES.refuse(loc, what, size, hint)
    if depth > INLINED_DEPTH.value:
        raise INLINED_DEPTH.refuse(loc, what, depth, "nest fewer calls, or split the op")


# Note [spec budget]
# ~~~~~~~~~~~~~~~~~~
# SymPy has no cost bound: a legal formula can make `diff`, `simplify` or a printer run for
# minutes. Each spec runs under a wall-clock budget. In the main thread a SIGALRM timer
# (`signal.setitimer`) raises `BudgetExceeded` into whatever SymPy is doing; elsewhere (a
# thread, or a platform without SIGALRM) a watchdog thread raises it asynchronously in the
# working thread (`PyThreadState_SetAsyncExc`). Either way it fires again every half second
# until the budget's frame has it, in case some `except Exception` in SymPy swallows it; and
# it is a BaseException (`errors.Interrupted`) so that opgen's own `located` blocks let it
# pass, the innermost marking where the work was. Caught at the spec, it becomes a located `SpecError` naming the
# stage that was running. SymPy's caches may keep entries of the abandoned work; they are
# pure memoization, so the next spec's output does not change. Neither mechanism can stop a
# single long C call (a huge integer power), which is why the size limits above exist.
# Reading and checking a spec, and generating it, each run under the budget; between them
# (and outside any budget) the pipeline imports the stages that use SymPy, which is no
# spec's cost, and the generation cache is consulted.


class BudgetExceeded(Interrupted):
    """Raised into a spec's work when its time budget runs out (Note [spec budget])."""

    def __init__(self) -> None:
        super().__init__("the time budget ran out")


def budget_seconds() -> float:
    """The budget per spec: `OPGEN_BUDGET` seconds if set to a positive number, else `BUDGET_SECONDS`."""
    text = os.environ.get(BUDGET_VARIABLE, "")
    try:
        value = float(text)
    except ValueError:
        return BUDGET_SECONDS
    return value if value > 0 and math.isfinite(value) else BUDGET_SECONDS


# The opgen functions a spec's work runs through, and how a message names them.
STAGES = {
    "load_file": "reading the YAML",
    "parse_spec": "checking the spec",
    "read": "reading the formulas",
    "optimize_formulas": "optimizing the formulas",
    "derive": "deriving the gradients",
    "rewrite_gradients": "rewriting the gradients",
    "choose_saved": "choosing what backward saves",
    "derive_jvp": "deriving the forward-mode tangents",
    "optimize_tangents": "rewriting the tangents",
    "plan": "planning the code",
    "emit_op": "writing the op",
    "emit_tests": "writing the tests",
    "extreme_rows": "computing exact test values",
}


# What to make smaller when a stage runs out of time: the file itself before any formula is read.
_WHOLE_FILE = ("reading the YAML", "checking the spec")


def _stage(traceback: TracebackType | None) -> str:
    """The innermost known stage among the frames the exception passed through."""
    found = "generating the op"
    while traceback is not None:
        name = traceback.tb_frame.f_code.co_name
        if name in STAGES and traceback.tb_frame.f_globals.get("__name__", "").startswith("opgen."):
            found = STAGES[name]
        traceback = traceback.tb_next
    return found


class _Timer:
    """Raises `BudgetExceeded` in the calling thread after `seconds`, and again every half second."""

    REPEAT = 0.5

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.thread_id = threading.get_ident()
        self.use_signal = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
        self.stopped = False
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.previous: object = None

    def __enter__(self) -> _Timer:
        if self.use_signal:
            self.previous = signal.signal(signal.SIGALRM, self._on_alarm)
            signal.setitimer(signal.ITIMER_REAL, self.seconds, self.REPEAT)
        else:
            threading.Thread(target=self._watch, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.use_signal:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)  # type: ignore[arg-type]
            return
        with self.lock:  # the watchdog raises nothing once this is set ...
            self.stopped = True
            self.wake.set()
            self._raise_in_thread(None)  # ... and one it raised but not yet delivered is withdrawn

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        raise BudgetExceeded

    def _watch(self) -> None:
        wait = self.seconds
        while not self.wake.wait(wait):
            with self.lock:
                if self.stopped:
                    return
                self._raise_in_thread(BudgetExceeded)
            wait = self.REPEAT

    def _raise_in_thread(self, exception: type[BaseException] | None) -> None:
        target = ctypes.c_ulong(self.thread_id)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(target, ctypes.py_object(exception) if exception else None)


@contextlib.contextmanager
def budget(loc: Loc, seconds: float | None = None) -> Iterator[None]:
    """Run one spec's work under its time budget; running out is a `SpecError` (Note [spec budget])."""
    seconds = budget_seconds() if seconds is None else seconds
    try:
        with _Timer(seconds):
            yield
    except BudgetExceeded as exceeded:
        where = exceeded.loc or loc
        during = f" ({exceeded.what})" if exceeded.what else ""
        stage = _stage(exceeded.__traceback__)
        fix = "make the spec file smaller" if stage in _WHOLE_FILE else "simplify its formulas"
        message = (
            f"spec too costly: it exceeded the {seconds:g} s time budget while {stage}"
            f"{during}; {fix}, or raise the budget with {BUDGET_VARIABLE}=SECONDS"
        )
        raise SpecError(where, message) from None
