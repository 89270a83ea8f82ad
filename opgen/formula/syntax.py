"""Formula text -> its Python syntax tree, within the limits (opgen.limits); no meaning yet.

`parse_ast` parses a formula's text with Python's `ast` (never `eval`) and refuses, located, a
syntax error, a number with too many digits, a formula too large or nested too deeply; it writes
out the PyTorch names of functions (`relu(x)` -> `max(x, 0)`, opgen.formula.aliases);
`holds_tensors` reads the trees of a spec for the names that hold tensors, `stopped_inputs` for the
inputs a stop-gradient reads. The tree is turned
into SymPy, node by node through a whitelist, by opgen.formula.reader.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator

from opgen import limits
from opgen.errors import Loc, SpecError
from opgen.formula.aliases import AliasError, expand
from opgen.formula.words import REDUCTIONS
from opgen.spec.model import Formula, Spec
from opgen.spec.parse_common import COMMENT_HINT, COMMENT_PROBLEM, comment_start


def node_loc(formula: Formula, node: ast.AST) -> Loc:
    """Where a node of the formula's syntax tree is in the spec file."""
    line = getattr(node, "lineno", 1)
    col = getattr(node, "col_offset", 0)
    base = formula.loc
    if line == 1:
        return Loc(base.file, base.line, base.col + col)
    return Loc(base.file, base.line + line - 1, col + 1)


def _text_loc(formula: Formula, index: int) -> Loc:
    """Where character `index` of the formula's text is."""
    base = formula.loc
    before = formula.text[:index]
    if "\n" not in before:
        return Loc(base.file, base.line, base.col + index)
    return Loc(base.file, base.line + before.count("\n"), len(before) - before.rfind("\n"))


@functools.lru_cache(maxsize=1024)  # each stage reads the same formulas: parsed and checked once
def parse_ast(formula: Formula) -> ast.expr:
    """The Python syntax tree of a formula; a syntax error or a formula over a limit is a located `SpecError`.
    The tree is shared by every caller that parses the same formula: copy it before changing it."""
    text = formula.text
    for start, length in limits.digit_runs(text):
        raise limits.DIGITS.refuse(_text_loc(formula, start), "this number", length, "write it shorter, e.g. 1.5e30")
    _refuse_comment(formula)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as error:
        col = (error.offset or 1) - 1 + (len(text) - len(text.lstrip()))
        loc = Loc(formula.loc.file, formula.loc.line, formula.loc.col + max(col, 0))
        raise SpecError(loc, f"syntax error in `{text}`: {error.msg}") from None
    except (RecursionError, MemoryError):
        limit = limits.FORMULA_DEPTH
        raise SpecError(
            formula.loc, f"`{short(text)}` is nested too deeply to read (the '{limit.name}' limit is {limit.value})"
        ) from None
    _check_size(tree.body, formula)
    try:
        return expand(tree.body)  # Note [aliases]
    except AliasError as error:
        raise SpecError(node_loc(formula, error.node), f"in `{short(text)}`: {error}") from None


def _refuse_comment(formula: Formula) -> None:
    index = comment_start(formula.text)
    if index is not None:
        message = f"in `{short(formula.text)}`: {COMMENT_PROBLEM.format('a formula')}; {COMMENT_HINT}"
        raise SpecError(_text_loc(formula, index), message)


def _check_size(tree: ast.expr, formula: Formula) -> None:
    """Refuse a formula, as written, over the 'formula size' or 'formula depth' limit."""
    count = 0
    stack: list[tuple[ast.AST, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, ast.expr):
            count += 1
            if depth > limits.FORMULA_DEPTH.value:
                hint = "name parts of it with `let`"
                raise limits.FORMULA_DEPTH.refuse(node_loc(formula, node), f"`{short(formula.text)}` here", depth, hint)
        for child in ast.iter_child_nodes(node):
            # A run of `+` and `-` is one sum, one level (SymPy's Add is flat): `a + b + c` is 2 levels.
            stack.append((child, depth if _additive(node) and _additive(child) else depth + 1))
    if count > limits.FORMULA_NODES.value:
        hint = "split it into several `let`s, or the op into several ops"
        raise limits.FORMULA_NODES.refuse(formula.loc, f"`{short(formula.text)}`", count, hint)


def _additive(node: ast.AST) -> bool:
    return isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))


def short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


@functools.lru_cache(maxsize=8)  # asked for by every scope of a spec: read once per spec
def holds_tensors(spec: Spec) -> frozenset[str]:
    """The names that hold tensors: the Tensor inputs, and the lets and outputs whose formula names one.

    Note [tensor-valued lets]
    ~~~~~~~~~~~~~~~~~~~~~~~~~
    Whether an argument of `max`/`min` holds a tensor decides its tie rule (Note [kink
    conventions] in opgen.formula.functions), and a let or output is a tensor when its formula
    names one, as it is in plain torch: `max(a, b)` of lets `a = min(x, y)`, `b = min(x, z)`
    splits the gradient at a tie as `torch.maximum` does, exactly as the same formula
    written inline. Counting only the inputs made it a max against a number, with the
    tie given to neither side: `do/dx` 0 where `x` is the smallest, instead of 1. The
    test is on the formula text, not on what SymPy makes of it: `0 * x` is a tensor of
    zeros, as in torch, though SymPy reads it as the number 0.
    """
    tensors = {i.name for i in spec.tensor_inputs}
    formulas = [(let.name, let.formula) for let in spec.lets] + [(o.name, o.formula) for o in spec.outputs]
    uses = {name: {n.id for n in ast.walk(parse_ast(f)) if isinstance(n, ast.Name)} for name, f in formulas}
    grown = True
    while grown:  # to a fixed point: a let may use one defined after it
        grown = False
        for name, used in uses.items():
            if name not in tensors and used & tensors:
                tensors.add(name)
                grown = True
    return frozenset(tensors)


def is_elementwise(spec: Spec) -> bool:
    """Tensor inputs without named dimensions and no formula that reduces them (`mean((x - t)**2)`):
    each entry of an output depends on the same entry of the inputs alone."""
    tensors = spec.tensor_inputs
    if not tensors or any(i.type.dims is not None for i in tensors):
        return False
    return not any(_reductions(spec, gradients=True))


def reduces_every_dim(spec: Spec) -> bool:
    """Whether a let or output reduces over every dimension (`var(norm(x, dim=-1))`: no `dim`)."""
    calls = _reductions(spec, gradients=False)
    return any(len(call.args) < 2 and all(kw.arg != "dim" for kw in call.keywords) for call in calls)


def _reductions(spec: Spec, gradients: bool) -> Iterator[ast.Call]:
    """The reduction calls of the lets and outputs (and of the `gradients:` formulas) as written."""
    formulas = [let.formula for let in spec.lets] + [o.formula for o in spec.outputs]
    formulas += [g.formula for g in spec.gradients] if gradients else []
    for node in (n for f in formulas for n in ast.walk(parse_ast(f))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in REDUCTIONS:
            yield node


BAD_DIMS = object()


def reduction_dims(node: ast.expr | None) -> tuple[int, ...] | None | object:
    """The `dim=` of a reduction as written: None when left out (every dimension), a tuple of whole
    numbers, or `BAD_DIMS`. Shared with `opgen.formula.written`, which reads the same text."""
    if node is None:
        return None
    items = node.elts if isinstance(node, ast.Tuple) else [node]
    dims = [int_literal(item) for item in items]
    if not dims or any(d is None for d in dims):
        return BAD_DIMS
    return tuple(dims)


def int_literal(node: ast.expr) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = int_literal(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    return None


STOPS = ("stop_gradient",)  # `detach` (opgen.formula.words.ALTERNATIVES) is written out by `parse_ast`


def stopped_inputs(spec: Spec) -> frozenset[str]:
    """The inputs some stop-gradient of the spec's formulas reads, through its lets and earlier outputs.

    Finite differences see the value change through a stop that the gradient leaves out (Note
    [stop-gradient] in opgen.nodes.stop_gradient): the generated tests check these inputs' gradients
    against plain autograd of the formula (which detaches the same parts), not with gradcheck."""
    formulas = {let.name: let.formula for let in spec.lets} | {out.name: out.formula for out in spec.outputs}
    inputs = {i.name for i in spec.inputs}
    found: set[str] = set()
    seen: set[str] = set()
    pending = [name for f in formulas.values() for name in _names_under_stops(parse_ast(f))]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            found.add(name)
        elif name in formulas:
            pending.extend(n.id for n in ast.walk(parse_ast(formulas[name])) if isinstance(n, ast.Name))
    return frozenset(found)


def _names_under_stops(tree: ast.expr) -> list[str]:
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    stops = [c for c in calls if c.func.id in STOPS]  # type: ignore[attr-defined]
    return [n.id for c in stops for arg in c.args for n in ast.walk(arg) if isinstance(n, ast.Name)]
