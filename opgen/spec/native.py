"""PyTorch's own ops that a spec's generated tests may compare with (`tests: {native: NAME}`).

A whitelist, read by `opgen.spec.parse` (to check the name and the number of inputs) and by
`opgen.emit.tests` (to write the call). The spec's inputs are passed in spec order: first
positionally, then as the keywords listed, with `fixed` keyword arguments added. Nothing
from the spec text is ever evaluated: it only selects an entry of this table.
"""

from __future__ import annotations

from dataclasses import dataclass

from opgen.spec import quote


@dataclass(frozen=True)
class NativeOp:
    function: str  # dotted path, starting with `torch`
    positional: int  # how many spec inputs are passed positionally
    keywords: tuple[str, ...] = ()  # the keyword of each further spec input
    fixed: tuple[tuple[str, str | int], ...] = ()  # keyword -> value, written as `quote.literal` writes it
    # For a reference that is not one call (`exp(-gamma * cdist(x, y) ** 2)`): Python source
    # with `{torch}` and `{0}`, `{1}`, ... for the spec's inputs; written here, never by a spec.
    expression: str = ""

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
    "softmax": NativeOp("torch.softmax", 1, fixed=(("dim", -1),)),
    "log_softmax": NativeOp("torch.log_softmax", 1, fixed=(("dim", -1),)),
    "logsumexp": NativeOp("torch.logsumexp", 1, fixed=(("dim", -1),)),
    "attention_softmax": NativeOp(
        "torch.softmax", 2, expression="{torch}.softmax({0} @ {1}.mT / {0}.shape[-1] ** 0.5, dim=-1)"
    ),
    "cosine_similarity": NativeOp(_F + "cosine_similarity", 2, ("eps",), (("dim", -1),)),
    "bilinear": NativeOp(_F + "bilinear", 4),
    "rbf_kernel": NativeOp("torch.cdist", 3, expression="{torch}.exp(-{2} * {torch}.cdist({0}, {1}) ** 2)"),
}
