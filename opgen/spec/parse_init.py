"""Parse stage, a parameter's `init:`: text -> `Init` (which `torch.nn.init` function, its arguments).

Receives the `init:` scalar and the module's args; returns an `Init` whose arguments are numbers, or
arithmetic on the module's `int`/`float` args kept as checked text (Note [init from constructor args]).
The text is read with Python's `ast` and a whitelist; it is never evaluated here.

Note [init from constructor args]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
`init: constant(alpha)` (Snake's `a` starts at the module's `alpha`), `uniform(-1 / sqrt(in_features),
1 / sqrt(in_features))` (nn.Linear's default bounds) and `normal(0, std)`: an argument of `init` may be
a number or arithmetic (`+ - * / **`, `sqrt exp log`, `pi`, parentheses) on numbers and the module's
`int` and `float` args. A plain number stays a float (printed as the spec wrote it); anything else is
kept as the checked text, which the module emitter prints in `reset_parameters()` with each arg read
from the module (`self.alpha`), so `reset_parameters()` after a change of the attribute uses it. A
name that is not such an arg (a `bool` arg, an input, a typo), any other syntax, and a non-finite
constant are located errors; so is arithmetic on numbers alone whose value, computed now in floats,
is not finite (`1 / 0`, `10 ** 400`, `log(0)`), which would fail or give NaN in `reset_parameters()`.
"""

from __future__ import annotations

import ast
import math

from opgen.errors import Loc, SpecError
from opgen.spec.load import Raw, RawScalar
from opgen.spec.model import INIT_ARITY, Init, Input
from opgen.spec.parse_common import COMMENT_HINT, COMMENT_PROBLEM, comment_start, plausible, suggest

INIT_FUNCTIONS = ("sqrt", "exp", "log")
INIT_CONSTANTS = ("pi",)
_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)


def parse_init(node: Raw, name: str, args: list[Input]) -> Init:
    """The `init:` of parameter `name`, with `args` the module's constructor args."""
    if not isinstance(node, RawScalar) or not isinstance(node.value, str):
        raise SpecError(node.loc, f"init of parameter '{name}' must be text such as `uniform(-0.1, 0.1)`")
    text = node.value
    kinds = tuple(INIT_ARITY)
    comment = comment_start(text)
    if comment is not None:
        one_line = "\n" not in text[:comment]
        at = Loc(node.loc.file, node.loc.line, node.loc.col + int(node.quoted) + comment) if one_line else node.loc
        raise SpecError(at, f"init '{text}': {COMMENT_PROBLEM.format('an init')}; {COMMENT_HINT}")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        tree = None
    call = tree if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) else None
    kind = call.func.id if call is not None else tree.id if isinstance(tree, ast.Name) else None  # type: ignore[attr-defined]
    if kind not in INIT_ARITY or (call is not None and call.keywords):
        word = kind or text.split("(")[0].strip()
        raise SpecError(node.loc, f"unknown init '{text}'{suggest(word, kinds)}")
    # Columns of the text: one later when it is quoted, and after the spaces `strip` took.
    start = Loc(node.loc.file, node.loc.line, node.loc.col + int(node.quoted) + len(text) - len(text.lstrip()))
    values = tuple(_argument(a, text, start, args) for a in call.args) if call is not None else ()
    if len(values) not in INIT_ARITY[kind]:
        counts = " or ".join(str(n) for n in INIT_ARITY[kind])
        raise SpecError(node.loc, f"init '{kind}' takes {counts} argument(s), got {len(values)}")
    return Init(kind, values)


def _argument(tree: ast.expr, text: str, loc: Loc, args: list[Input]) -> float | str:
    """A number, or the checked text of arithmetic on the module's number args."""
    at = Loc(loc.file, loc.line, loc.col + tree.col_offset) if tree.lineno == 1 else loc
    number = _number(tree)
    if number is not None:
        if not math.isfinite(number):
            raise SpecError(loc, f"init '{text}': arguments must be finite, else the parameter is NaN or infinite")
        return number
    _check(tree, text, at, args)
    if not any(
        isinstance(sub, ast.Name) and sub.id not in (*INIT_FUNCTIONS, *INIT_CONSTANTS) for sub in ast.walk(tree)
    ):
        try:  # arithmetic on numbers alone: its value is known now, and must be a finite float
            value = _constant(tree)
        except (ArithmeticError, ValueError):
            value = math.nan
        if not math.isfinite(value):
            what = f"`{ast.unparse(tree)}` is not a finite number (a division by zero, log(0), an overflow)"
            raise SpecError(at, f"init '{text}': {what}, so the parameter would be NaN or infinite")
    return ast.unparse(tree)


def _constant(tree: ast.expr) -> float:
    """The value of checked arithmetic on numbers, in floats (`10 ** 400` overflows at once, never a huge int)."""
    if isinstance(tree, ast.Constant):
        return float(tree.value)  # type: ignore[arg-type]  # a checked number
    if isinstance(tree, ast.Name):
        return math.pi
    if isinstance(tree, ast.UnaryOp):
        inner = _constant(tree.operand)
        return -inner if isinstance(tree.op, ast.USub) else inner
    if isinstance(tree, ast.Call):
        return float(getattr(math, tree.func.id)(_constant(tree.args[0])))  # type: ignore[attr-defined]
    assert isinstance(tree, ast.BinOp)
    a, b = _constant(tree.left), _constant(tree.right)
    ops = {ast.Add: float.__add__, ast.Sub: float.__sub__, ast.Mult: float.__mul__, ast.Div: float.__truediv__}
    result = a**b if isinstance(tree.op, ast.Pow) else ops[type(tree.op)](a, b)
    if isinstance(result, complex):  # (-8) ** (1 / 3)
        raise ValueError("not a real number")
    return float(result)


def _number(tree: ast.expr) -> float | None:
    """A plain (maybe negated) number literal; `nan` and `inf` as names too, to be refused as not finite."""
    if isinstance(tree, ast.UnaryOp) and isinstance(tree.op, (ast.USub, ast.UAdd)):
        inner = _number(tree.operand)
        return None if inner is None else -inner if isinstance(tree.op, ast.USub) else inner
    if isinstance(tree, ast.Constant) and isinstance(tree.value, (int, float)) and not isinstance(tree.value, bool):
        return float(tree.value)
    if isinstance(tree, ast.Name) and tree.id in ("nan", "inf"):
        return float(tree.id)
    return None


def _check(tree: ast.expr, text: str, at: Loc, args: list[Input]) -> None:
    """Refuse, located, anything in an init argument but numbers, number args and the whitelist."""
    numbers = [a.name for a in args if a.type.kind in ("int", "float")]
    called = {id(sub.func) for sub in ast.walk(tree) if isinstance(sub, ast.Call)}
    for sub in ast.walk(tree):
        if id(sub) in called and isinstance(sub, ast.Name) and sub.id in INIT_FUNCTIONS:
            continue
        where = Loc(at.file, at.line, at.col + sub.col_offset - tree.col_offset) if hasattr(sub, "col_offset") else at
        if isinstance(sub, ast.Name):
            problem = _name_problem(sub.id, numbers, args)
            if problem:
                raise SpecError(where, f"init '{text}': {problem}")
            continue
        if isinstance(sub, ast.Call):
            if not isinstance(sub.func, ast.Name) or sub.func.id not in INIT_FUNCTIONS or sub.keywords:
                raise SpecError(where, f"init '{text}': only {', '.join(INIT_FUNCTIONS)} can be called in an init")
            if len(sub.args) != 1:
                raise SpecError(where, f"init '{text}': {sub.func.id}() takes one argument")
        elif isinstance(sub, ast.BinOp):
            if not isinstance(sub.op, _OPERATORS):
                raise SpecError(where, f"init '{text}': an init argument uses + - * / ** only")
        elif isinstance(sub, ast.Constant):
            if isinstance(sub.value, bool) or not isinstance(sub.value, (int, float)) or not math.isfinite(sub.value):
                raise SpecError(where, f"init '{text}': arguments must be finite numbers or module args")
        elif not isinstance(sub, (ast.UnaryOp, ast.USub, ast.UAdd, ast.Load, *_OPERATORS)):
            raise SpecError(where, f"init '{text}': arguments must be numbers or arithmetic on the module's args")


def _name_problem(name: str, numbers: list[str], args: list[Input]) -> str:
    """What is wrong with `name` in an init argument ("" when it is a number arg or `pi`)."""
    if name in numbers or name in INIT_CONSTANTS:
        return ""
    if name in ("nan", "inf"):
        return "arguments must be finite, else the parameter is NaN or infinite"
    if name in INIT_FUNCTIONS:
        return f"'{name}' is a function; call it as {name}(...)"
    if any(a.name == name for a in args):
        return f"'{name}' is a bool module arg; an init takes int and float args"
    close = plausible(name, numbers)
    return f"unknown name '{name}'" + (
        f"; did you mean '{close}'?" if close else "; an init uses numbers and the module's int and float args"
    )
