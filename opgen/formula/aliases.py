"""PyTorch and numpy names for formula-language functions: `relu(x)` is read as `max(x, 0)`.

Receives a formula's syntax tree (opgen.formula.syntax); returns the same tree with every call of
an alias replaced by the formula it stands for (`opgen.formula.words.ALTERNATIVES`, each checked
against the PyTorch function it names in tests/test_error_hints.py), or raises `AliasError`
(what is wrong, and the node where) for a call the alias cannot take.

Note [aliases]
~~~~~~~~~~~~~~
Users write `relu(x)`, `softmax(x, dim=-1)`, `square(x)`, `clip(x, 0, 1)` because that is what
PyTorch calls them. Each is replaced in the syntax tree, before anything reads it, by the
formula-language text it means, so the reader, the plain-torch reference of the generated tests,
the shapes as written and the stable rewrites (softmax is recognised as `torch.softmax`) all see
one language. The arguments are copied into the template as written (an argument used twice is
read twice: the same SymPy expression). `softmax` and `log_softmax` need `dim=`, as
`torch.softmax` does; `amin` and `average` take `dim=` and `keepdim=` like the reductions and
pass them on. PyTorch's parameters of an activation are taken as it takes them, by position or
keyword, with its defaults (`elu(x, alpha=0.5)`, `leaky_relu(x, 0.1)`, `hardtanh(x, -2, 2)`), and
`softplus` with `beta` or `threshold` is F.softplus's formula; `gelu(x, approximate='tanh')` picks the
tanh form as its string says. A template's own nodes carry the
call's position, so an error inside one points at the call. Expansion is bottom-up and counted
against the 'formula size' limit as it grows, so nested aliases that double their argument cannot
build a tree the limit would refuse.
"""

from __future__ import annotations

import ast
import copy

from opgen import limits
from opgen.formula.words import ALTERNATIVES, CHOICES, PARAMETERS, PARAMETRIZED, REDUCTIONS, arity

# `norm` is a reduction of the language itself; the others are read as their formula.
ALIASES = frozenset(ALTERNATIVES) - {"norm"}

# The keywords an alias takes, passed on to the reduction in its formula (`dim=-1` replaced).
_KEYWORDS = {name: ("dim",) for name in ("softmax", "log_softmax", "softmin")} | {
    name: ("dim", "keepdim") for name in ("amin", "average")
}
_NEEDS_DIM = ("softmax", "log_softmax", "softmin")
# What a call may give by position after its tensor, as PyTorch's function (`torch.sum(x, 0, True)`,
# `torch.softmax(x, -1)`): read as those keywords. torch.var's third argument is `unbiased` in one
# overload, so `var` and `std` take `dim` alone by position; `norm`'s second is the order `p`: none.
_POSITIONAL = {name: ("dim", "keepdim") for name in REDUCTIONS if name not in ("var", "std", "norm")} | {
    "var": ("dim",),
    "std": ("dim",),
    **_KEYWORDS,
}
_REDUCTIONS = ("logsumexp", "amax", "mean")


class AliasError(Exception):
    def __init__(self, node: ast.AST, message: str) -> None:
        super().__init__(message)
        self.node = node


def _placed(tree: ast.expr, at: ast.AST) -> ast.expr:
    for node in ast.walk(tree):
        for attr in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
            if hasattr(at, attr):
                setattr(node, attr, getattr(at, attr))
    return tree


def _size(tree: ast.AST) -> int:
    return sum(1 for node in ast.walk(tree) if isinstance(node, ast.expr))


def _keywords_by_position(node: ast.Call) -> None:
    """`sum(x, 0, True)` as `sum(x, dim=0, keepdim=True)` (`_POSITIONAL`); other calls stay as written."""
    assert isinstance(node.func, ast.Name)
    names = _POSITIONAL.get(node.func.id, ())
    extra = node.args[1:]
    if not extra or len(extra) > len(names) or any(isinstance(a, ast.Starred) for a in node.args):
        return  # the reader or the alias reports the count
    given = {kw.arg for kw in node.keywords}
    for name in names[: len(extra)]:
        if name in given:
            raise AliasError(node, f"{node.func.id}() got `{name}` twice, by position and as `{name}=`")
    node.keywords = [*(ast.keyword(n, a) for n, a in zip(names, extra, strict=False)), *node.keywords]
    node.args = node.args[:1]


def _clamp_bounds(node: ast.Call) -> None:
    """`clamp(x, min=a)`, `clamp(x, a)`, `clamp(x, max=b)` as `clamp(x, a, inf)`, `clamp(x, -inf, b)`:
    torch.clamp's bounds are optional, by position or keyword (`clip` too, as torch.clip)."""
    given = {kw.arg: kw.value for kw in node.keywords if kw.arg in ("min", "max")}
    if not given and len(node.args) != 2:
        return
    if any(isinstance(a, ast.Starred) for a in node.args) or not 1 <= len(node.args) <= 3:
        return  # the reader or the alias reports the count
    bounds: list[ast.expr | None] = [*node.args[1:], None, None][:2]
    for k, name in enumerate(("min", "max")):
        if name not in given:
            continue
        if bounds[k] is not None:
            raise AliasError(node, f"{node.func.id}() got `{name}` twice, by position and as `{name}=`")  # type: ignore[attr-defined]
        bounds[k] = given[name]
    if bounds == [None, None]:
        return
    unbounded = (ast.UnaryOp(ast.USub(), ast.Name("inf", ast.Load())), ast.Name("inf", ast.Load()))
    node.args = [node.args[0], *(b if b is not None else _placed(unbounded[k], node) for k, b in enumerate(bounds))]
    node.keywords = [kw for kw in node.keywords if kw.arg not in ("min", "max")]


def _chosen(node: ast.Call, name: str) -> str | None:
    """The formula a string parameter picks (`gelu(x, approximate='tanh')`), taken out of the call."""
    if name not in CHOICES:
        return None
    keyword, formulas = CHOICES[name]
    given = next((kw for kw in node.keywords if kw.arg == keyword), None)
    if given is None:
        return None
    value = given.value
    if not (isinstance(value, ast.Constant) and value.value in formulas):
        options = " or ".join(f"`{keyword}={v!r}`" for v in formulas)
        raise AliasError(node, f"{name}() takes {options}, as torch does, not `{keyword}={ast.unparse(value)}`")
    node.keywords = [kw for kw in node.keywords if kw is not given]
    return formulas[value.value]


def _parameters(node: ast.Call, name: str, needed: int) -> dict[str, ast.expr]:
    """PyTorch's parameters of the call (`PARAMETERS`), taken out of it: by position after the tensor
    (`leaky_relu(x, 0.1)`, `hardtanh(x, -2, 2)`) or by keyword (`elu(x, alpha=0.5)`), else their defaults."""
    names = [p for p, _ in PARAMETERS.get(name, ())]
    if not names:
        return {}
    extra = node.args[needed:]
    if len(extra) > len(names) or any(isinstance(a, ast.Starred) for a in node.args):
        takes = ", ".join(["x" if needed == 1 else "the tensors", *names])
        raise AliasError(node, f"{name}() takes ({takes}), got {len(node.args)} arguments")
    given = dict(zip(names, extra, strict=False))
    node.args = node.args[:needed]
    for kw in node.keywords:
        if kw.arg is None or kw.arg not in names:
            continue
        if kw.arg in given:
            raise AliasError(node, f"{name}() got `{kw.arg}` twice, by position and as `{kw.arg}=`")
        given[kw.arg] = kw.value
    node.keywords = [kw for kw in node.keywords if kw.arg not in names]
    for parameter, default in PARAMETERS[name]:
        if parameter not in given:
            given[parameter] = _placed(ast.parse(default, mode="eval").body, node)
    return given


class _Expand(ast.NodeTransformer):
    def __init__(self, budget: int) -> None:
        self.budget = budget

    def visit_Call(self, node: ast.Call) -> ast.expr:  # noqa: N802
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in _POSITIONAL:
            _keywords_by_position(node)
        if isinstance(node.func, ast.Name) and node.func.id in ("clamp", "clip"):
            _clamp_bounds(node)
        if not isinstance(node.func, ast.Name):
            return node
        name = node.func.id
        if name in PARAMETRIZED and (len(node.args) > 1 or node.keywords):
            template = PARAMETRIZED[name]
        elif name in ALIASES:
            template = _chosen(node, name) or ALTERNATIVES[name]
        else:
            return node
        needed = arity(name)
        parameters = _parameters(node, name, needed)
        if len(node.args) != needed or any(isinstance(a, ast.Starred) for a in node.args):
            plural = "s" if needed != 1 else ""
            raise AliasError(node, f"{name}() takes {needed} argument{plural}, got {len(node.args)}")
        allowed = _KEYWORDS.get(name, ())
        for kw in node.keywords:
            if kw.arg not in allowed:
                words = [*allowed, *(p for p, _ in PARAMETERS.get(name, ()))]
                takes = " and ".join(f"`{k}=`" for k in words) if words else "no keyword arguments"
                raise AliasError(node, f"{name}() takes {takes}, not `{kw.arg}=`")
        if name in _NEEDS_DIM and not any(kw.arg == "dim" for kw in node.keywords):
            raise AliasError(node, f"{name}() needs `dim=`, as torch.{name} does, e.g. {name}(x, dim=-1)")
        holes = [f"__opgen_arg{k}__" for k in range(needed)]
        named = {p: f"__opgen_{p}__" for p in parameters}
        tree = _placed(ast.parse(template.format(*holes, **named), mode="eval").body, node)
        filled = dict(zip(holes, node.args, strict=True)) | {named[p]: v for p, v in parameters.items()}
        tree = _Fill(filled, node.keywords, name in _KEYWORDS).visit(tree)
        if _size(tree) > self.budget:
            limit = limits.FORMULA_NODES
            raise AliasError(
                node,
                f"{name}() here makes the formula too large once written out as `{template.format(*'xab')}`"
                f" (the '{limit.name}' limit is {limit.value} {limit.unit}); name its argument with `let`",
            )
        return tree


class _Fill(ast.NodeTransformer):
    """Put the arguments into a template, and the call's keywords into its reduction."""

    def __init__(self, args: dict[str, ast.expr], keywords: list[ast.keyword], reduces: bool) -> None:
        self.args = args
        self.keywords = keywords
        self.reduces = reduces

    def visit_Name(self, node: ast.Name) -> ast.expr:  # noqa: N802
        return copy.deepcopy(self.args[node.id]) if node.id in self.args else node

    def visit_Call(self, node: ast.Call) -> ast.expr:  # noqa: N802
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in _REDUCTIONS and self.reduces:
            given = {kw.arg for kw in self.keywords}
            kept = [kw for kw in node.keywords if kw.arg not in given and kw.arg != "dim"]
            node.keywords = [*kept, *copy.deepcopy(self.keywords)]
        return node


def expand(tree: ast.expr) -> ast.expr:
    """`tree` with its alias calls written out (Note [aliases]); `AliasError` for a bad call."""
    calls = (n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name))
    rewritten = ALIASES | set(_POSITIONAL) | set(PARAMETRIZED) | {"clamp"}
    if not any(call.func.id in rewritten for call in calls):  # type: ignore[attr-defined]
        return tree
    return _Expand(limits.FORMULA_NODES.value).visit(copy.deepcopy(tree))
