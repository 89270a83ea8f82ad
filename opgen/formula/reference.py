"""Reference printer: formula text -> plain torch code, straight from the syntax tree.

The generated tests compare each op with this independent translation of the same
formulas: it does not go through SymPy, the derivation or `TorchPrinter`, so a mistake
in any of those shows up as a mismatch. Every value is a float64 tensor (`T(...)` wraps
numbers), every function is PyTorch's own op, and autograd differentiates it.
"""

from __future__ import annotations

import ast

from opgen.formula.syntax import parse_ast
from opgen.spec.model import Formula

TORCH_FUNCTIONS = {
    "exp": "torch.exp",
    "log": "torch.log",
    "log1p": "torch.log1p",
    "expm1": "torch.expm1",
    "sqrt": "torch.sqrt",
    "rsqrt": "torch.rsqrt",
    "sin": "torch.sin",
    "cos": "torch.cos",
    "tan": "torch.tan",
    "asin": "torch.asin",
    "acos": "torch.acos",
    "atan": "torch.atan",
    "atan2": "torch.atan2",
    "sinh": "torch.sinh",
    "cosh": "torch.cosh",
    "tanh": "torch.tanh",
    "asinh": "torch.asinh",
    "acosh": "torch.acosh",
    "atanh": "torch.atanh",
    "sigmoid": "torch.sigmoid",
    "softplus": "torch.nn.functional.softplus",
    "erf": "torch.erf",
    "erfc": "torch.erfc",
    "erfinv": "torch.erfinv",
    "lgamma": "torch.lgamma",
    "digamma": "torch.digamma",
    "abs": "torch.abs",
    "sign": "torch.sign",
    "floor": "torch.floor",
    "ceil": "torch.ceil",
    "round": "torch.round",
    "trunc": "torch.trunc",
    "fmod": "torch.fmod",
    "remainder": "torch.remainder",
    "polygamma": "torch.polygamma",
    "cumsum": "torch.cumsum",
    "logcumsumexp": "torch.logcumsumexp",
    "cumprod": "torch.cumprod",
    "prod": "torch.prod",
    "where": "torch.where",
    "max": "torch.maximum",
    "min": "torch.minimum",
    "clamp": "torch.clamp",
    "sum": "torch.sum",
    "mean": "torch.mean",
    "amax": "torch.amax",
    "logsumexp": "torch.logsumexp",
    "var": "torch.var",
    "std": "torch.std",
    "norm": "torch.linalg.vector_norm",
    "xlogy": "torch.xlogy",
    "unsqueeze": "torch.unsqueeze",
    "stop_gradient": "torch.detach",
    "i0": "torch.special.i0",
    "diagonal": "torch.diagonal",
    "cat": "torch.cat",
    "stack": "torch.stack",
    "diag_embed": "torch.diag_embed",
    "diag": "torch.diag",
    "i0e": "torch.special.i0e",
    "i1": "torch.special.i1",
    "i1e": "torch.special.i1e",
    "erfcx": "torch.special.erfcx",
    "log_ndtr": "torch.special.log_ndtr",
    "ndtri": "torch.special.ndtri",
}


class _Translate(ast.NodeTransformer):
    def __init__(
        self, names: dict[str, str], wrap: str, torch: str, math: str, sizes: dict[str, str], tensors: frozenset[str]
    ) -> None:
        self.names = names
        self.tensors = tensors
        self.sizes = sizes
        self.wrap = wrap
        self.torch = torch
        self.math = math

    def _attr(self, dotted: str) -> ast.expr:
        head, *rest = dotted.split(".")
        node: ast.expr = ast.Name({"torch": self.torch}.get(head, head), ast.Load())
        for part in rest:
            node = ast.Attribute(node, part, ast.Load())
        return node

    def _tensor(self, node: ast.expr) -> ast.expr:
        """Wrap a plain number as a tensor; anything using a spec name is one already."""
        spec_names = set(self.names.values())
        if any(isinstance(n, ast.Name) and n.id in spec_names for n in ast.walk(node)):
            return node
        return ast.Call(ast.Name(self.wrap, ast.Load()), [node], [])

    def visit_Name(self, node: ast.Name) -> ast.expr:  # noqa: N802
        if node.id in self.names:
            return ast.Name(self.names[node.id], ast.Load())
        if node.id in self.sizes:  # a named dimension used as a number: its size
            return ast.Call(ast.Name(self.wrap, ast.Load()), [ast.parse(self.sizes[node.id], mode="eval").body], [])
        if node.id in ("pi", "inf"):
            return ast.Attribute(ast.Name(self.math, ast.Load()), node.id, ast.Load())
        if node.id in ("true", "True"):
            return ast.Constant(True)
        if node.id in ("false", "False"):
            return ast.Constant(False)
        raise ValueError(f"unknown name {node.id}")  # the formula parser already rejected these

    def _holds_tensor(self, node: ast.expr) -> bool:
        return any(isinstance(n, ast.Name) and n.id in self.tensors for n in ast.walk(node))

    def _condition(self, node: ast.expr) -> ast.expr:
        """A condition; a spec name standing for one holds it as 1/0 (Note [named conditions] in
        opgen/formula/read.py): `name == 1`, a bool tensor whether the name holds 1/0 or True/False."""
        visited = self.visit(node)
        if isinstance(node, ast.Name) and node.id in self.names:
            return ast.Compare(visited, [ast.Eq()], [ast.Constant(1)])
        return visited

    @staticmethod
    def _is_condition(node: ast.expr) -> bool:
        return isinstance(node, (ast.Compare, ast.BoolOp)) or (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, (ast.BitAnd, ast.BitOr))
            or isinstance(node, ast.UnaryOp)
            and isinstance(node.op, ast.Invert)
        )

    def _number(self, node: ast.expr, wrap: bool) -> ast.expr:
        """An operand of arithmetic; a condition written there, with `wrap`, is 1/0 as a float tensor: torch
        refuses `-` of a bool tensor, and `+` of two is their `or` (`(x > 0) + (y > 0)` is 2 where both hold)."""
        visited = self.visit(node)
        if not wrap or not self._is_condition(node):
            return visited
        one, zero = self._tensor(ast.Constant(1.0)), self._tensor(ast.Constant(0.0))
        return ast.Call(
            self._attr("torch.where"), [ast.Call(self._attr("torch.as_tensor"), [visited], []), one, zero], []
        )

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:  # noqa: N802
        if isinstance(node.op, ast.Invert):  # of a tensor: Python's `~False` is -1, `~(a > 1)` -1 or -2
            return ast.UnaryOp(node.op, ast.Call(self._attr("torch.as_tensor"), [self._condition(node.operand)], []))
        return ast.UnaryOp(node.op, self._number(node.operand, True))

    def visit_Compare(self, node: ast.Compare) -> ast.AST:  # noqa: N802
        """A chain `a != b >= c` is `(a != b) & (b >= c)`: Python's own chain `and`s them, which raises for
        tensors of more than one entry."""
        self.generic_visit(node)
        sides = [node.left, *node.comparators]
        parts: list[ast.expr] = [
            ast.Compare(a, [op], [b]) for a, op, b in zip(sides, node.ops, sides[1:], strict=False)
        ]
        chained = parts[0]
        for part in parts[1:]:
            chained = ast.BinOp(chained, ast.BitAnd(), part)
        return chained

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:  # noqa: N802
        if isinstance(node.op, (ast.BitAnd, ast.BitOr)):
            return ast.BinOp(self._condition(node.left), node.op, self._condition(node.right))
        # A condition with a tensor of numbers promotes to its dtype, but not under `-`.
        wrap = isinstance(node.op, ast.Sub) or (self._is_condition(node.left) and self._is_condition(node.right))
        return ast.BinOp(self._number(node.left, wrap), node.op, self._number(node.right, wrap))

    def visit_Call(self, node: ast.Call) -> ast.expr:  # noqa: N802
        assert isinstance(node.func, ast.Name)
        name = node.func.id
        if name == "eye":  # of a named dimension: its size, a Python integer
            size = ast.parse(self.sizes[ast.unparse(node.args[0])], mode="eval").body
            return ast.Call(self._attr("torch.eye"), [size], [ast.keyword("dtype", self._attr("torch.float64"))])
        holds = [self._holds_tensor(a) for a in node.args]
        # A condition as a function's argument is a number (`mean(x > 0)`: torch.mean refuses a bool tensor),
        # but for `where`'s first argument.
        visited = [
            self._condition(a) if name == "where" and k == 0 else self._number(a, True) for k, a in enumerate(node.args)
        ]
        args = [self._tensor(a) for a in visited]
        if name == "where" and args[0] is not visited[0]:
            # A condition of plain numbers (`0 > 1`): a bool tensor, not a float one.
            args[0] = ast.Call(self._attr("torch.as_tensor"), [visited[0]], [])
        if name in ("max", "min") and sum(holds) == 1:
            return self._against_number(name, *((args[0], args[1]) if holds[0] else (args[1], args[0])))
        if name == "heaviside":
            # torch.heaviside has no derivative at all; this step has the zero one PyTorch's other steps have.
            at_least_zero = ast.Compare(args[0], [ast.GtE()], [ast.Constant(0.0)])
            one, zero = self._tensor(ast.Constant(1.0)), self._tensor(ast.Constant(0.0))
            return ast.Call(self._attr("torch.where"), [at_least_zero, one, zero], [])
        if name == "clamp":
            return ast.Call(
                self._attr("torch.clamp"), [args[0]], [ast.keyword("min", args[1]), ast.keyword("max", args[2])]
            )
        if name == "polygamma":  # the order is a Python integer, as torch.polygamma takes it
            return ast.Call(self._attr("torch.polygamma"), [node.args[0], args[1]], [])
        if name in ("cumsum", "logcumsumexp", "cumprod"):  # the dim a Python integer, positional or keyword as written
            return ast.Call(self._attr(TORCH_FUNCTIONS[name]), [args[0], *node.args[1:]], node.keywords)
        keywords = [ast.keyword(k.arg, self.visit(k.value)) for k in node.keywords]
        if name == "prod":  # the dim a Python integer, as written
            return ast.Call(self._attr(TORCH_FUNCTIONS[name]), [args[0], *node.args[1:]], keywords)
        if name == "diagonal":  # of the last two dimensions, as the language's (torch's default is the first two)
            keywords = [ast.keyword("dim1", ast.Constant(-2)), ast.keyword("dim2", ast.Constant(-1))]
        return ast.Call(self._attr(TORCH_FUNCTIONS[name]), args, keywords)

    def _against_number(self, name: str, value: ast.expr, bound: ast.expr) -> ast.expr:
        """`max`/`min` of a tensor and a number: the tie goes to the number (Note [kink conventions]).

        `F.threshold(v, c, c)` is `v` where `v > c`, else `c`, with relu's gradient (relu is
        `threshold(v, 0, 0)`); `min(v, c)` is `-threshold(-v, -c, -c)`, exact in floating point.
        """
        if isinstance(bound, ast.Call) and isinstance(bound.func, ast.Name) and bound.func.id == self.wrap:
            bound = bound.args[0]  # a plain number needs no tensor
        number: ast.expr = ast.Call(ast.Name("float", ast.Load()), [bound], [])
        threshold = self._attr("torch.nn.functional.threshold")
        if name == "max":
            return ast.Call(threshold, [value, number, number], [])
        negated = ast.UnaryOp(ast.USub(), number)
        return ast.UnaryOp(ast.USub(), ast.Call(threshold, [ast.UnaryOp(ast.USub(), value), negated, negated], []))

    def visit_Subscript(self, node: ast.Subscript) -> ast.expr:  # noqa: N802
        """`x[..., :D // 2]` as Python slicing of the tensor, `chunk(x, 2, dim=-1)[0]` as torch.chunk's pick;
        the bounds are Python integers of the sizes, the counts and dims the literals written."""
        value = node.value
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "chunk":
            operand = self.visit(value.args[0])
            return ast.Subscript(
                ast.Call(self._attr("torch.chunk"), [operand, *value.args[1:]], value.keywords), node.slice
            )
        sizes = self.sizes

        class Sizes(ast.NodeTransformer):
            def visit_Name(self, name: ast.Name) -> ast.expr:  # noqa: N802
                return ast.parse(sizes[name.id], mode="eval").body

        return ast.Subscript(self.visit(value), Sizes().visit(node.slice), ast.Load())

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:  # noqa: N802
        # `.T` of the formula language swaps the last two dimensions, batched or not: torch's `.mT`.
        return ast.Attribute(self.visit(node.value), "mT", ast.Load())


def drop_names(node: ast.expr, absent: set[str]) -> ast.expr | None:
    """The syntax tree with every additive term that uses an absent name removed."""

    def uses(n: ast.AST) -> bool:
        return any(isinstance(sub, ast.Name) and sub.id in absent for sub in ast.walk(n))

    if not uses(node):
        return node
    if isinstance(node, ast.Name):
        return None  # the absent name itself
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        left, right = drop_names(node.left, absent), drop_names(node.right, absent)
        if left is None and right is None:
            return None
        if right is None:
            return left
        if left is None:
            return right if isinstance(node.op, ast.Add) else ast.UnaryOp(ast.USub(), right)
        return ast.BinOp(left, node.op, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = drop_names(node.operand, absent)
        return None if inner is None else ast.UnaryOp(node.op, inner)
    children = [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr)]
    replaced = {id(child): drop_names(child, absent) for child in children}
    if any(value is None for value in replaced.values()):
        return None

    class Swap(ast.NodeTransformer):
        def generic_visit(self, n: ast.AST) -> ast.AST:
            if id(n) in replaced and n is not node:
                return replaced[id(n)]  # type: ignore[return-value]
            return super().generic_visit(n)

    return Swap().visit(node)


def _copied(tree: ast.expr) -> ast.expr:
    """A copy of a syntax tree, made without recursion: a long sum as written is as deep as it has
    terms, deeper than `copy.deepcopy` can go."""
    copies: dict[int, ast.AST] = {}
    order: list[ast.AST] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(ast.iter_child_nodes(node))
    for node in reversed(order):  # children before their parents

        def fresh(value: object) -> object:
            if isinstance(value, ast.AST):
                return copies[id(value)]
            return [fresh(v) for v in value] if isinstance(value, list) else value

        fields = {name: fresh(value) for name, value in ast.iter_fields(node)}
        attributes = {name: getattr(node, name) for name in node._attributes if hasattr(node, name)}
        copies[id(node)] = type(node)(**fields, **attributes)
    return copies[id(tree)]  # type: ignore[return-value]


def reference_tree(
    formula: Formula,
    names: dict[str, str],
    wrap: str,
    torch: str,
    math: str,
    absent: set[str] | None = None,
    sizes: dict[str, str] | None = None,
    *,
    tensors: frozenset[str],
) -> ast.expr | None:
    """The plain torch syntax tree of a formula; None when every term uses an absent name.

    `sizes` gives, for each named dimension, source text for its size (`q.shape[-1]`);
    `tensors` the names that hold tensors (`opgen.formula.syntax.holds_tensors`), which decide the tie rule of
    `max` and `min`. `opgen.formula.python_source` prints it.
    """
    tree = _copied(parse_ast(formula))  # the translators below change it in place
    if absent:
        dropped = drop_names(tree, absent)
        if dropped is None:
            return None
        tree = dropped
    translator = _Translate(names, wrap, torch, math, sizes or {}, tensors)
    return ast.fix_missing_locations(translator._tensor(translator.visit(tree)))
