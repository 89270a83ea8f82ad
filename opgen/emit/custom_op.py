"""The `custom_op` form of an op module: what `op.py.j2` needs to register it with torch.library.

Used by `opgen.emit.op` for specs whose form is `custom_op` (`form:` in the spec, else the run's
`--form`); `namespace_problem` is also used by the command line and the pipeline.

Note [custom_op form]
~~~~~~~~~~~~~~~~~~~~~
The module of a `custom_op`-form op holds the same `torch.autograd.Function` as the default form
and registers, at import, the custom op `NAMESPACE::name` built from it by the package's
`_custom_ops.define` (copied from `opgen/runtime/custom_ops.py`): kernel and fake implementation
are the Function's `forward` (torch ops, so fake tensors get the outputs' shapes and dtypes as
the formulas broadcast them), the autograd formula its `setup_context` and `backward` (made of
differentiable torch ops, so double backward works), and a vmap rule (one call for an op that
only broadcasts elementwise, one call per sample otherwise, so that a transform above vmap still
sees the op and its gradient). The functional calls the custom op, so torch.compile, export and
FX keep it as one node with its own backward (Note [captured graphs keep the gradient]).

The op's schema lists the spec's outputs alone. Where the Function also returns residuals (what
its backward reads: tanhshrink's `tanh(x)`, layer_norm's mean and rstd), those come from a
companion op `NAMESPACE::name_for_backward`, the one the functional calls when a gradient will be
needed (grad mode on and an input requiring grad); an inference graph (ONNX, torch.export under
`no_grad`) holds `NAMESPACE::name` as the spec declares it, as PyTorch's `layer_norm` sits above
`native_layer_norm`.

torch 2.13 has no forward-mode rule for a custom op (under `torch.func.jvp` or `forward_ad` it
gives a zero or no tangent), and a custom op's registered autograd refuses torch.func's `grad`,
`jacrev`, `hessian` ("it must override the setup_context staticmethod"). The functional
therefore calls the Function (with its derived `jvp` and `generate_vmap_rule`) under any
torch.func transform and whenever a tensor argument carries a forward-mode tangent: the same
formulas, so the same values. `torch.ops.NAMESPACE.name` called directly is torch's custom op:
plain vmap works through the rule, forward mode gives a zero tangent, torch.func.grad raises.

The schema names the inputs as the spec does, except those torch's schema parser refuses
(non-ASCII: `α`), which are named by position. The op takes every input positionally and has no
defaults: the functional fills them in.
"""

from __future__ import annotations

import hashlib
import keyword
import re
from typing import TYPE_CHECKING

from opgen.emit import layout
from opgen.emit.runtime_names import from_imports
from opgen.spec import quote
from opgen.spec.names import Namer

if TYPE_CHECKING:  # the command line imports `namespace_problem`, SymPy not yet (Note [stages imported on use])
    from opgen.plan.backward import Plan

# torch owns these namespaces, or `torch.ops.NAME` is an attribute of its own.
RESERVED_NAMESPACES = frozenset(
    {"aten", "prim", "prims", "torch", "quantized", "higher_order", "load_library", "loaded_libraries", "import_module"}
)
_ASCII_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FINGERPRINT = "@opgen-fingerprint@"


def namespace_problem(name: str) -> str | None:
    """Why `name` cannot be a torch.library namespace, or None."""
    if not _ASCII_IDENTIFIER.match(name) or keyword.iskeyword(name):
        return "is not a torch.library namespace (an ASCII Python identifier, not a keyword)"
    if name in RESERVED_NAMESPACES:
        return "is a namespace of torch itself"
    return None


def _schema_type(kind: str, optional: bool) -> str:
    return {"Tensor": "Tensor?" if optional else "Tensor", "float": "float", "int": "SymInt", "bool": "bool"}[kind]


def schema(plan: Plan, residuals: bool = False) -> str:
    """The op's schema: `(Tensor x, float beta) -> Tensor`, several outputs a tuple; with `residuals`, the
    schema of its companion that also returns the residuals (`_custom_ops.define`'s `saving`)."""
    spec = plan.derived.spec
    namer = Namer({i.name for i in spec.inputs})
    params = []
    for k, inp in enumerate(spec.inputs):
        name = inp.name if _ASCII_IDENTIFIER.match(inp.name) else namer.fresh(f"arg{k}")
        params.append(f"{_schema_type(inp.type.kind, inp.type.optional)} {name}")
    returned = len(plan.returned) if residuals else len(spec.outputs)
    outputs = "Tensor" if returned == 1 else "(" + ", ".join(["Tensor"] * returned) + ")"
    return f"({', '.join(params)}) -> {outputs}"


def broadcasts(plan: Plan) -> bool:
    """The op only broadcasts its tensor inputs elementwise: no declared dimensions, no `@`,
    transposes or reductions, so a batch dimension in front passes through (the vmap rule)."""
    from opgen.formula.tensor import has_tensor_ops  # SymPy: Note [stages imported on use]

    derived = plan.derived
    if any(i.type.dims is not None for i in derived.spec.tensor_inputs):
        return False
    return not any(has_tensor_ops(e) for v in derived.variants for _, e in (*v.lets, *v.outputs))


def custom_op_context(plan: Plan, namespace: str, function_ref: str, chosen: str, taken: set[str]) -> dict[str, str]:
    """The names and text `op.py.j2` writes for the custom op; `chosen`: the functional's name for what
    it calls (the custom op, or the Function under torch.func and forward mode)."""
    spec = plan.derived.spec
    namer = Namer(taken)
    define, choose = namer.fresh("define"), namer.fresh("op_or_function")
    imports = from_imports(".._custom_ops", [("define", define), ("op_or_function", choose)])
    ref = namer.fresh(f"_{spec.name}_op")
    return {
        "ref": ref,
        "define": define,
        "choose": choose,
        "imports": imports,
        "chosen": layout.assign_call(chosen, choose, [ref, function_ref, *(i.name for i in spec.inputs)], 4),
        "qualname": quote.string(f"{namespace}::{spec.name}"),
        "schema": quote.string(schema(plan)),
        "saving": quote.string(schema(plan, residuals=True)) if plan.residuals else "",
        "fingerprint": quote.string(FINGERPRINT),
        "broadcasts": str(broadcasts(plan)),
        "function": function_ref,
    }


def exported_context(plan: Plan, chosen: str, taken: set[str]) -> dict[str, str]:
    """What `op.py.j2` writes for a `function`-form op whose backward its forward formula would lose:
    the import of the package's `exported` and the line that swaps `chosen` (what the functional
    applies) for the op's custom op while torch.export records for training (Note [custom_op form])."""
    name = Namer(taken).fresh("exported")
    return {
        "imports": from_imports(".._custom_ops", [("exported", name)]),
        "line": layout.assign_call(chosen, name, [chosen, quote.string(plan.derived.spec.name)], 4)
        + "  # torch.export, training: a custom op",
    }


def with_fingerprint(text: str) -> str:
    """`text` with its fingerprint: the SHA-256 of the text as rendered, before it is filled in."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
    line = f"    fingerprint={quote.string(FINGERPRINT)},\n"
    assert line in text
    return text.replace(line, f"    fingerprint={quote.string(digest)},\n", 1)  # the first: `define`'s call
