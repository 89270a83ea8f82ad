"""PyTorch's own ops that a spec's generated tests may compare with (`tests: {native: NAME}`).

A whitelist, read by `opgen.spec.parse` (to check the name and the number of inputs), by the
pipeline (to check its output shape against the first output's, `shape_problem`) and by
`opgen.emit.tests` (to write the call). The spec's inputs are passed in spec order: first
positionally, then as the keywords listed, with `fixed` keyword arguments added. Nothing
from the spec text is ever evaluated: it only selects an entry of this table.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from opgen.errors import SpecError
from opgen.spec import quote
from opgen.spec.model import Spec

# Note [native output shapes]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The generated tests compare the spec's first output with the native op's result entry by entry,
# so the two must have one shape. Each entry says what shape its op returns, as far as the spec's
# formula text can show it before the formulas are read:
# - ELEMENTWISE: one value per element of the broadcast inputs (the losses with reduction='none'):
#   the first output, and every let it reads, must reduce nothing and multiply no matrices.
# - LAST_REDUCED: the last dimension reduced (logsumexp, cosine_similarity): the first output
#   must reduce over dim=-1.
# - "": a shape of its own (softmax over rows, bilinear, attention, rbf): not checked here; the
#   generated tests compare and name the shapes.
# A mismatch is a located error at `tests.native` when generating, not a failing generated test.
ELEMENTWISE = "elementwise"
LAST_REDUCED = "last dimension reduced"


@dataclass(frozen=True)
class NativeOp:
    function: str  # dotted path, starting with `torch`
    positional: int  # how many spec inputs are passed positionally
    keywords: tuple[str, ...] = ()  # the keyword of each further spec input
    fixed: tuple[tuple[str, str | int], ...] = ()  # keyword -> value, written as `quote.literal` writes it
    # For a reference that is not one call (`exp(-gamma * cdist(x, y) ** 2)`): Python source
    # with `{torch}` and `{0}`, `{1}`, ... for the spec's inputs; written here, never by a spec.
    expression: str = ""
    shape: str = ELEMENTWISE  # what shape it returns (Note [native output shapes])

    @property
    def arity(self) -> int:
        return self.positional + len(self.keywords)

    def call(self, args: list[str], torch: str) -> str:
        """The call of this op on the given argument expressions, `torch` as named in the file."""
        head, _, rest = self.function.partition(".")
        assert head == "torch" and len(args) == self.arity
        if self.expression:
            return self.expression.format(*args, torch=torch)
        parts = args[: self.positional]
        parts += [f"{k}={quote.literal(v)}" for k, v in self.fixed]
        parts += [f"{k}={a}" for k, a in zip(self.keywords, args[self.positional :], strict=True)]
        return f"{torch}.{rest}({', '.join(parts)})"


_F = "torch.nn.functional."

NATIVE_OPS: dict[str, NativeOp] = {
    "abs": NativeOp("torch.abs", 1),
    "relu": NativeOp("torch.relu", 1),
    "maximum": NativeOp("torch.maximum", 2),
    "minimum": NativeOp("torch.minimum", 2),
    "clamp": NativeOp("torch.clamp", 3),
    "sign": NativeOp("torch.sign", 1),
    "round": NativeOp("torch.round", 1),
    "floor": NativeOp("torch.floor", 1),
    "ceil": NativeOp("torch.ceil", 1),
    "trunc": NativeOp("torch.trunc", 1),
    "remainder": NativeOp("torch.remainder", 2),
    "sqrt": NativeOp("torch.sqrt", 1),
    "sinc": NativeOp("torch.sinc", 1),
    "hardtanh": NativeOp(_F + "hardtanh", 3),
    "relu6": NativeOp(_F + "relu6", 1),
    "leaky_relu": NativeOp(_F + "leaky_relu", 2),
    "huber_loss": NativeOp(_F + "huber_loss", 2, ("delta",), (("reduction", "none"),)),
    "smooth_l1_loss": NativeOp(_F + "smooth_l1_loss", 2, ("beta",), (("reduction", "none"),)),
    "softshrink": NativeOp(_F + "softshrink", 2),
    "hardshrink": NativeOp(_F + "hardshrink", 2),
    "hardsigmoid": NativeOp(_F + "hardsigmoid", 1),
    "hardswish": NativeOp(_F + "hardswish", 1),
    "elu": NativeOp(_F + "elu", 2),
    "silu": NativeOp(_F + "silu", 1),
    "mish": NativeOp(_F + "mish", 1),
    "gelu": NativeOp(_F + "gelu", 1),
    "gelu_tanh": NativeOp(_F + "gelu", 1, fixed=(("approximate", "tanh"),)),
    "softplus": NativeOp(_F + "softplus", 1, ("beta",)),
    "logsigmoid": NativeOp(_F + "logsigmoid", 1),
    "sigmoid": NativeOp("torch.sigmoid", 1),
    "selu": NativeOp(_F + "selu", 1),
    "tanhshrink": NativeOp(_F + "tanhshrink", 1),
    "softsign": NativeOp(_F + "softsign", 1),
    "binary_cross_entropy_with_logits": NativeOp(
        _F + "binary_cross_entropy_with_logits", 2, fixed=(("reduction", "none"),)
    ),
    # Reductions over the last dimension and matrix ops (`Tensor[..., N]` specs).
    "softmax": NativeOp("torch.softmax", 1, fixed=(("dim", -1),), shape=""),
    "log_softmax": NativeOp("torch.log_softmax", 1, fixed=(("dim", -1),), shape=""),
    "logsumexp": NativeOp("torch.logsumexp", 1, fixed=(("dim", -1),), shape=LAST_REDUCED),
    "attention_softmax": NativeOp(
        "torch.softmax", 2, expression="{torch}.softmax({0} @ {1}.mT / {0}.shape[-1] ** 0.5, dim=-1)", shape=""
    ),
    "cosine_similarity": NativeOp(_F + "cosine_similarity", 2, ("eps",), (("dim", -1),), shape=LAST_REDUCED),
    "bilinear": NativeOp(_F + "bilinear", 4, shape=""),
    "rbf_kernel": NativeOp("torch.cdist", 3, expression="{torch}.exp(-{2} * {torch}.cdist({0}, {1}) ** 2)", shape=""),
}


def _names(tree: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


def _first_output_trees(spec: Spec) -> list[ast.Expression] | None:
    """The syntax trees of the first output's formula and of every let it reads, directly or not;
    None when a formula is not Python syntax (the formula stage reports that)."""
    lets = {let.name: let.formula.text for let in spec.lets}
    todo, trees, seen = [spec.outputs[0].formula.text], [], set[str]()
    while todo:
        try:
            tree = ast.parse(todo.pop().strip(), mode="eval")
        except SyntaxError:
            return None
        trees.append(tree)
        for name in _names(tree) & lets.keys() - seen:
            seen.add(name)
            todo.append(lets[name])
    return trees


def _reductions(trees: list[ast.Expression], reductions: tuple[str, ...]) -> list[ast.Call]:
    return [
        node
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in reductions
    ]


def _over_last(call: ast.Call) -> bool:
    dims = [k.value for k in call.keywords if k.arg == "dim"] + call.args[1:2]
    return any(ast.literal_eval(d) == -1 if isinstance(d, (ast.Constant, ast.UnaryOp)) else False for d in dims)


def shape_problem(spec: Spec, reductions: tuple[str, ...]) -> SpecError | None:
    """`tests.native` returning another shape than the spec's first output (Note [native output
    shapes]); `reductions`: the formula language's reduction functions."""
    if spec.tests.native is None or not spec.outputs:
        return None
    op = NATIVE_OPS[spec.tests.native]
    trees = _first_output_trees(spec)
    if trees is None or not op.shape:
        return None
    output, name = spec.outputs[0].name, spec.tests.native
    where = spec.tests.native_loc or spec.loc
    calls = _reductions(trees, reductions)
    matmul = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult) for t in trees for n in ast.walk(t))
    if op.shape == ELEMENTWISE and (calls or matmul):
        what = f"{calls[0].func.id}(...)" if calls else "@"  # type: ignore[attr-defined]
        fixed = ", ".join(f"{k}={quote.literal(v)}" for k, v in op.fixed)
        form = f" ({fixed})" if fixed else ""
        return SpecError(
            where,
            f"tests.native: {name}{form} returns one value per element, but output '{output}' uses {what}, "
            "so its shape differs; compare an elementwise formula with it, or drop tests.native",
        )
    if op.shape == LAST_REDUCED and not any(_over_last(call) for call in calls):
        return SpecError(
            where,
            f"tests.native: {name} reduces the last dimension (dim=-1), but output '{output}' does not; "
            "write the reduction with dim=-1, or drop tests.native",
        )
    return None
