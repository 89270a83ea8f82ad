"""Bounds on the values of a fuzzer formula tree, so random formulas stay where they are defined.

`bounds(op, value, args)` returns an interval containing every value the node can take,
given intervals for its arguments (conservative: wider is always safe). The grammar uses
it to keep `log`, `sqrt`, `asin`, divisions and powers inside their domains and away from
overflow, by wrapping an argument that could leave them (`fuzz_grammar.Builder.within`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

INF = math.inf
MAX_SIZE = 5  # no dimension is larger when ops are evaluated: bounds sums and matmuls
WHOLE_SIZE = 24  # no plain Tensor has more entries (fuzz_specs.PLAIN_SHAPES): bounds whole reductions

Interval = tuple[float, float]
ANY: Interval = (-INF, INF)

# Where each function is safe: finite with finite, moderate first and second derivatives.
SAFE_ARG: dict[str, Interval] = {
    "exp": (-30.0, 30.0),
    "expm1": (-30.0, 30.0),
    "sinh": (-20.0, 20.0),
    "cosh": (-20.0, 20.0),
    "log": (0.05, INF),
    "sqrt": (0.05, INF),
    "rsqrt": (0.05, INF),
    "lgamma": (0.1, 1e4),
    "digamma": (0.1, 1e4),
    "log1p": (-0.9, INF),
    "asin": (-0.9, 0.9),
    "acos": (-0.9, 0.9),
    "atanh": (-0.9, 0.9),
    "erfinv": (-0.9, 0.9),
    "acosh": (1.1, INF),
    "tan": (-1.2, 1.2),
}


def _mul(a: float, b: float) -> float:
    if a == 0 or b == 0:
        return 0.0
    return a * b


def _hull(values: Sequence[float]) -> Interval:
    if any(math.isnan(v) for v in values):
        return ANY
    return (min(values), max(values))


def _monotone(f: Callable[[float], float], decreasing: bool = False) -> Callable[[Interval], Interval]:
    def apply(iv: Interval) -> Interval:
        try:
            lo, hi = f(iv[0]), f(iv[1])
        except (OverflowError, ValueError):
            return ANY
        return (hi, lo) if decreasing else (lo, hi)

    return apply


def _exp(v: float) -> float:
    return math.exp(v) if v < 700 else INF


def _safe(f: Callable[[float], float], low: float, high: float = INF) -> Callable[[float], float]:
    """`f` on finite values, with its limits at the infinities (for the unbounded ends of intervals)."""

    def g(v: float) -> float:
        if v == INF:
            return high
        if v == -INF:
            return low
        return f(v)

    return g


def _cosh(iv: Interval) -> Interval:
    big = max(abs(iv[0]), abs(iv[1]))
    small = 0.0 if iv[0] <= 0 <= iv[1] else min(abs(iv[0]), abs(iv[1]))
    return (math.cosh(min(small, 700)), math.cosh(big) if big < 700 else INF)


def _abs(iv: Interval) -> Interval:
    big = max(abs(iv[0]), abs(iv[1]))
    return (0.0 if iv[0] <= 0 <= iv[1] else min(abs(iv[0]), abs(iv[1])), big)


def _lgamma(iv: Interval) -> Interval:
    if iv[0] <= 0:
        return ANY
    ends = [math.lgamma(v) if v < INF else INF for v in iv]
    return (min(*ends, -0.1215), max(ends))


def _tan(iv: Interval) -> Interval:
    return (math.tan(iv[0]), math.tan(iv[1])) if -1.5 < iv[0] and iv[1] < 1.5 else ANY


UNARY_BOUNDS: dict[str, Callable[[Interval], Interval]] = {
    "exp": _monotone(_safe(_exp, 0.0)),
    "expm1": _monotone(_safe(lambda v: _exp(v) - 1, -1.0)),
    "log": lambda iv: (math.log(iv[0]) if iv[0] > 0 else -INF, math.log(iv[1]) if iv[1] > 0 else -INF),
    "log1p": lambda iv: (math.log1p(iv[0]) if iv[0] > -1 else -INF, math.log1p(iv[1]) if iv[1] > -1 else -INF),
    "sqrt": lambda iv: (math.sqrt(max(iv[0], 0.0)), math.sqrt(max(iv[1], 0.0))),
    "rsqrt": lambda iv: (1 / math.sqrt(iv[1]), 1 / math.sqrt(iv[0])) if iv[0] > 0 else (0.0, INF),
    "sin": lambda iv: (-1.0, 1.0),
    "cos": lambda iv: (-1.0, 1.0),
    "tan": _tan,
    "asin": lambda iv: (-math.pi / 2, math.pi / 2),
    "acos": lambda iv: (0.0, math.pi),
    "atan": _monotone(_safe(math.atan, -math.pi / 2, math.pi / 2)),
    "sinh": _monotone(_safe(lambda v: math.sinh(v) if abs(v) < 700 else math.copysign(INF, v), -INF)),
    "cosh": _cosh,
    "tanh": _monotone(_safe(math.tanh, -1.0, 1.0)),
    "asinh": _monotone(_safe(math.asinh, -INF)),
    "acosh": lambda iv: (0.0, math.acosh(iv[1]) if iv[1] >= 1 else 0.0),
    "atanh": lambda iv: (math.atanh(max(iv[0], -0.999999)), math.atanh(min(iv[1], 0.999999))),
    "sigmoid": lambda iv: (0.0, 1.0),
    "softplus": lambda iv: (0.0, max(iv[1], 0.0) + 1.0),
    "erf": lambda iv: (-1.0, 1.0),
    "erfc": lambda iv: (0.0, 2.0),
    "erfinv": lambda iv: (-3.0, 3.0) if -0.99 < iv[0] and iv[1] < 0.99 else ANY,
    "lgamma": _lgamma,
    "digamma": lambda iv: (
        (math.log(iv[0]) - 1 / iv[0] - 1, math.log(iv[1]) if iv[1] < INF else INF) if iv[0] > 0 else ANY
    ),
    "abs": _abs,
    "sign": lambda iv: (-1.0, 1.0),
    "heaviside": lambda iv: (0.0, 1.0),
    "floor": lambda iv: (math.floor(iv[0]) if iv[0] > -INF else -INF, iv[1]),
    "ceil": lambda iv: (iv[0], math.ceil(iv[1]) if iv[1] < INF else INF),
    "round": lambda iv: (iv[0] - 0.5, iv[1] + 0.5),
}


def add(a: Interval, b: Interval) -> Interval:
    return _hull([a[0] + b[0], a[1] + b[1]])


def neg(a: Interval) -> Interval:
    return (-a[1], -a[0])


def mul(a: Interval, b: Interval) -> Interval:
    return _hull([_mul(x, y) for x in a for y in b])


def div(a: Interval, b: Interval) -> Interval:
    if b[0] <= 0 <= b[1]:
        return ANY
    return mul(a, (1 / b[1], 1 / b[0]))


def power(a: Interval, b: Interval, exponent: float | None) -> Interval:
    """`a ** b`; `exponent` is b's value when it is a literal number."""
    if exponent is not None and float(exponent).is_integer():
        k = int(exponent)
        if k >= 0:
            try:
                ends = [v**k if abs(v) < 1e30 else INF * (1 if k % 2 == 0 or v > 0 else -1) for v in a]
            except OverflowError:
                return ANY
            if k % 2 == 0:
                return (0.0 if a[0] <= 0 <= a[1] else min(abs(e) for e in ends), max(abs(e) for e in ends))
            return (ends[0], ends[1])
        if a[0] <= 0 <= a[1]:
            return ANY
        inverse = div((1.0, 1.0), a)
        return power(inverse, (-k, -k), -k)
    if a[0] <= 0:
        return ANY
    logs = (math.log(a[0]), math.log(a[1]) if a[1] < INF else INF)
    product = mul(logs, b)
    return (_exp(product[0]) if product[0] > -INF else 0.0, _exp(product[1]))


def extremum(a: Interval, b: Interval, big: bool) -> Interval:
    pick = max if big else min
    return (pick(a[0], b[0]), pick(a[1], b[1]))


def union(a: Interval, b: Interval) -> Interval:
    return (min(a[0], b[0]), max(a[1], b[1]))


def reduction(name: str, a: Interval, count: int = MAX_SIZE) -> Interval:
    """Bounds of a reduction of `count` entries at most, each in `a`."""
    if name == "sum":
        return (min(a[0], count * a[0]), max(a[1], count * a[1]))
    if name == "logsumexp":
        return (a[0], a[1] + math.log(count))
    spread = a[1] - a[0]
    if name == "var":  # at most (spread / 2)**2 * n / (n - 1), n >= 2
        return (0.0, spread**2 / 2)
    if name == "std":
        return (0.0, spread / math.sqrt(2))
    if name == "norm":
        return (0.0, math.sqrt(count) * max(abs(a[0]), abs(a[1])))
    return a  # mean, amax, amin


def alias_bounds(name: str, ivs: list[Interval]) -> Interval:
    """Bounds of PyTorch's name of a function (`fuzz_ast.ALIASES`), from those of its arguments."""
    lo, hi = ivs[0]
    if name == "relu":
        return (max(lo, 0.0), max(hi, 0.0))
    if name == "relu6":
        return (min(max(lo, 0.0), 6.0), min(max(hi, 0.0), 6.0))
    if name in ("silu", "gelu"):
        return (-0.3, max(hi, 0.0))
    if name == "softsign":
        return (-1.0, 1.0)
    if name == "logsigmoid":
        return (min(lo, 0.0) - 0.7, 0.0)
    if name == "expit":
        return (0.0, 1.0)
    if name in ("square", "cube"):
        return power(ivs[0], (2.0, 2.0) if name == "square" else (3.0, 3.0), 2.0 if name == "square" else 3.0)
    if name == "neg":
        return neg(ivs[0])
    if name == "absolute":
        return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi)))
    if name == "sgn":
        return (-1.0, 1.0)
    if name in ("maximum", "fmax", "minimum", "fmin"):
        return extremum(ivs[0], ivs[1], name in ("maximum", "fmax"))
    if name == "clip":
        return extremum(extremum(ivs[0], ivs[1], True), ivs[2], False)
    if name in ("arcsinh", "arctan"):
        return (-INF, INF) if name == "arcsinh" else (-math.pi / 2, math.pi / 2)
    table: dict[str, Callable[[float], float]] = {
        "exp2": lambda v: 2.0**v,
        "reciprocal": lambda v: 1 / v,
        "log2": math.log2,
        "log10": math.log10,
        "logit": lambda v: math.log(v / (1 - v)),
    }
    if name in table:
        return _monotone(table[name], decreasing=name == "reciprocal")(ivs[0])
    return ANY


# Where each alias is safe, as SAFE_ARG (the aliases not listed are safe everywhere).
ALIAS_ARG: dict[str, Interval] = {
    "exp2": (-20.0, 20.0),
    "reciprocal": (0.2, INF),
    "log2": (0.05, INF),
    "log10": (0.05, INF),
    "logit": (0.05, 0.95),
    "square": (-100.0, 100.0),
    "cube": (-20.0, 20.0),
}


def within(a: Interval, box: Interval) -> bool:
    return box[0] <= a[0] and a[1] <= box[1]
