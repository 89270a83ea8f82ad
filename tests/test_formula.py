"""The whitelisting formula parser: text -> SymPy, and located errors for everything else."""

from __future__ import annotations

import pytest
import sympy

from opgen.errors import Loc, SpecError
from opgen.formula import functions as fn
from opgen.formula.reader import NUM, Scope, Value, read_formula
from opgen.spec.model import Formula

x, y = sympy.symbols("x y", real=True)
SCOPE = Scope({"x": Value(x, NUM), "y": Value(y, NUM)}, frozenset({x, y}))


def read(text: str, col: int = 7) -> sympy.Basic:
    return read_formula(Formula(text, Loc("s.yaml", 3, col)), SCOPE)


def error(text: str, col: int = 7) -> SpecError:
    with pytest.raises(SpecError) as info:
        read(text, col)
    return info.value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("x / (1 + exp(-2 * x))", x / (1 + sympy.exp(-2 * x))),
        ("x ** 2 - -y", x**2 + y),
        ("sqrt(x) * rsqrt(y)", sympy.sqrt(x) / sympy.sqrt(y)),
        ("atan2(y, x) + pi", sympy.atan2(y, x) + sympy.pi),
        ("0.5 * x", x / 2),
        ("sigmoid(x) + softplus(y)", fn.sigmoid(x) + fn.softplus(y)),
        ("lgamma(x) + digamma(y)", sympy.loggamma(x) + sympy.polygamma(0, y)),
        ("where(x > 0, x, 0)", fn.where(sympy.StrictGreaterThan(x, 0), x, 0)),
        ("(x > 0) * y", fn.where(sympy.StrictGreaterThan(x, 0), 1, 0) * y),
        (
            "where((x > 0) & ~(y <= 1), x, y)",
            fn.where(sympy.And(sympy.StrictGreaterThan(x, 0), sympy.Not(sympy.LessThan(y, 1))), x, y),
        ),
    ],
)
def test_reads_the_formula_language(text, expected):
    assert sympy.simplify(read(text) - expected) == 0


def test_true_and_false_in_both_spellings():
    assert read("where(true, x, y)") == x
    assert read("where(False, x, y)") == y


@pytest.mark.parametrize(
    ("text", "col", "message"),
    [
        ("x + z", 11, "unknown name 'z'"),
        ("exq(x)", 7, "unknown function 'exq'; did you mean 'exp'?"),
        ("clamp(x)", 7, "clamp() takes 3 arguments, got 1"),
        ("x.real", 7, "attribute `.real` is not allowed"),
        ("(lambda: 1)()", 7, "only the functions of the formula language can be called"),
        ("__import__('os').system('true')", 7, "only the functions of the formula language can be called"),
        ("open('/etc/passwd')", 7, "unknown function 'open'"),
        ("'text'", 7, "the constant 'text' is not a number"),
        ("x if y else 0", 7, "use where(c, a, b)"),
        ("x // 2", 7, "the operator `//` is not allowed"),
        ("where(x, 1, 0)", 13, "must be a condition such as `x > 0`"),
        ("(x > 0) and (y > 0)", 7, "`and` is not allowed"),
        ("exp(x, keep=1)", 7, "exp() takes no keyword arguments"),
        ("x(1)", 7, "'x' is an input or intermediate, not a function"),
        ("x / 0", 7, "division by the constant zero"),
    ],
)
def test_rejects_with_a_located_message(text, col, message):
    found = error(text)
    assert message in found.message
    assert found.loc == Loc("s.yaml", 3, col)


def test_syntax_error_points_into_the_formula():
    found = error("x + * y")
    assert found.loc.line == 3 and found.loc.col >= 7
    assert found.message.startswith("syntax error in `x + * y`")


def test_never_evaluates_spec_text(tmp_path):
    marker = tmp_path / "ran"
    text = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    error(text)
    assert not marker.exists()
