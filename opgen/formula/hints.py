"""How to fix the formula mistakes people make most: what to write instead, in the formula language.

Used by opgen.formula.reader for its error messages. Receives the offending syntax (a name, a
call, an attribute); returns the text that follows "unknown function 'square'" and the like:
the call by bare name (`np.exp(u)` -> `exp(u)`, `F.relu(u)` -> `relu(u)`, `u.sum(dim=-1)` ->
`sum(u, dim=-1)`), a believable typo fix (Note [plausible suggestions] in
opgen.spec.parse_common), or else what the language has. `ALTERNATIVES` are the formulas PyTorch's
names stand for (opgen.formula.aliases reads them).
"""

from __future__ import annotations

import ast
import io
import tokenize

from opgen.formula.vocabulary import ALL_FUNCTIONS, CONSTANTS
from opgen.formula.words import ALTERNATIVES, arity, defaults
from opgen.spec.parse_common import plausible

_PLACEHOLDERS = ("x", "a", "b")
# Constants of numpy, torch and math: `np.pi` -> `pi`.
_CONSTANTS = {"pi": "pi", "inf": "inf", "e": "exp(1)", "Inf": "inf", "infty": "inf", "PINF": "inf"}


# PyTorch's other ways to stop a gradient: `stop_gradient(e)` (or `detach(e)`) is the language's.
_STOPPERS = {"no_grad", "detach_", "requires_grad_"}
_STOP_HINT = (
    "; to stop the gradient of part of a formula, write `stop_gradient(e)` (or `detach(e)`): the value of `e`,"
    " no gradient through it (for a straight-through estimator: `x + stop_gradient(round(x) - x)`)"
)


def unknown_function(name: str, args: list[ast.expr]) -> str:
    """What follows "unknown function 'NAME'": a typo fix, or what exists. PyTorch's names for the
    functions (`ALTERNATIVES`) are read as their formula before this is asked (opgen.formula.aliases)."""
    if name in _STOPPERS:
        return _STOP_HINT
    close = plausible(name, (*ALL_FUNCTIONS, *ALTERNATIVES))
    if close:
        return f"; did you mean '{close}'?"
    return "; the functions are: " + ", ".join(ALL_FUNCTIONS)


def spelled(name: str, args: list[ast.expr]) -> str:
    """The formula of `ALTERNATIVES[name]` for these arguments (placeholders where they do not fit)."""
    template = ALTERNATIVES[name]
    texts = [_text(arg) for arg in args]
    needed = arity(name)
    if len(texts) != needed:
        texts = list(_PLACEHOLDERS[:needed])
    text = template.format(*texts, **defaults(name))
    return ast.unparse(ast.parse(text, mode="eval"))  # only the parentheses it needs


def _text(node: ast.expr) -> str:
    return f"({ast.unparse(node)})"


def _dotted(node: ast.expr) -> list[str] | None:
    """`np.linalg.norm` -> ["np", "linalg", "norm"]; None for anything else."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else [*head, node.attr]
    return None


def qualified_call(node: ast.Call, names: set[str]) -> str:
    """Why `np.exp(u)`, `torch.nn.functional.gelu(u)` or `u.sum(dim=-1)` is refused, and what to write."""
    assert isinstance(node.func, ast.Attribute)
    name, receiver = node.func.attr, node.func.value
    dotted = _dotted(receiver)
    method = dotted is None or dotted[0] in names  # a method of a value: `u.exp()`
    args = [receiver, *node.args] if method else list(node.args)
    written = ast.unparse(node.func)
    if name in _STOPPERS:
        return f"`{written}()` is not part of the formula language{_STOP_HINT}"
    if name in ALL_FUNCTIONS or name in ALTERNATIVES:  # the language's name, or an alias of one
        instead = ast.unparse(ast.Call(ast.Name(name), args, node.keywords))
    else:
        close = plausible(name, ALL_FUNCTIONS)
        also = f"; did you mean '{close}'?" if close else f"; the functions are: {', '.join(ALL_FUNCTIONS)}"
        if method:
            return f"only the functions of the formula language can be called, by name as f(x), not `.{name}()`{also}"
        return f"`{written}` is not a function of the formula language, which calls functions by bare name{also}"
    if method:
        return f"formulas call functions by name, not as methods: write `{instead}`"
    return f"formulas use bare function names, without `{'.'.join(dotted or [])}.`: write `{instead}`"


def qualified_constant(node: ast.Attribute) -> str | None:
    """`np.pi`, `math.e`, `torch.inf`: the constant to write instead; None for other attributes."""
    dotted = _dotted(node)
    if dotted is None or len(dotted) < 2 or node.attr not in _CONSTANTS:
        return None
    instead = _CONSTANTS[node.attr]
    assert instead in CONSTANTS or instead == "exp(1)"
    return f"formulas use bare names for constants: write `{instead}`, not `{ast.unparse(node)}`"


def power(node: ast.BinOp, text: str) -> str:
    """`x^2`: Python reads `^` as exclusive or, and with a lower precedence than `*`, so the fix is
    the formula `text` with each `^` token written `**` (`3 * (x + 1)^2` -> `3 * (x + 1) ** 2`)."""
    try:
        tokens = [
            (tokenize.OP, "**") if token.type == tokenize.OP and token.string == "^" else (token.type, token.string)
            for token in tokenize.generate_tokens(io.StringIO(text).readline)
        ]
        instead = ast.unparse(ast.parse(tokenize.untokenize(tokens).strip(), mode="eval"))
    except (SyntaxError, tokenize.TokenError, ValueError):  # a formula split over lines, ...: this part alone
        instead = ast.unparse(ast.BinOp(node.left, ast.Pow(), node.right))
    return f"`^` is exclusive or, not a power; write `{instead}`"


def describe(node: ast.AST) -> str:
    """What a node of a kind formulas do not allow is, for the error."""
    names = {
        "Subscript": "indexing `[...]`",
        "Lambda": "`lambda`",
        "IfExp": "`a if c else b` (use where(c, a, b))",
        "ListComp": "a list comprehension",
        "List": "a list",
        "Tuple": "a tuple",
        "Dict": "a dict",
        "Set": "a set",
        "JoinedStr": "an f-string",
        "NamedExpr": "`:=`",
        "Starred": "`*`",
        "Await": "`await`",
        "Yield": "`yield`",
        "GeneratorExp": "a generator",
        "Slice": "a slice",
    }
    return names.get(type(node).__name__, f"`{type(node).__name__}`")
