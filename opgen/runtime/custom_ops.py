"""Registration of the package's ops as `torch.library` custom ops.

Each op module of the `custom_op` form calls `define` once, at import, with its autograd Function:
the custom op's kernel and fake (meta) implementation are the Function's `forward`, its autograd
formula the Function's `setup_context` and `backward`, its vmap rule below. Note [custom_op form]
in opgen's `opgen/emit/custom_op.py` says why. A `function`-form op whose backward the forward
formula would lose (a gradient override, a guarded branch) calls `exported`, which defines its
custom op when torch.export first records it for training.
"""

from collections.abc import Callable
from typing import Any

import torch

FINGERPRINT = "_opgen_fingerprint"  # the CustomOpDef attribute naming the generated module's text


TRAINING = "_opgen_training"  # the CustomOpDef attribute holding its companion that returns residuals
PADDED = "_opgen_padded"  # ... and the op called as the Function is, its residuals None


def define(
    qualname: str, schema: str, function: Any, fingerprint: str, broadcasts: bool, saving: str | None = None
) -> Any:
    """The custom op `qualname` computing `function.forward`, with its backward and a vmap rule.

    `broadcasts`: the op only broadcasts its tensor inputs elementwise, so a batched call is one
    call with the batch dimension in front; otherwise the vmap rule calls the op per sample.
    `saving`: where the Function also returns tensors its backward reads (residuals), the schema of
    the companion op `qualname_for_backward`, which returns them after the outputs. `qualname` itself
    returns the outputs alone, as the spec declares them: the functional calls it where no gradient
    will be needed, so an inference graph holds the op with its own schema, and the companion where
    one will be. Called directly with inputs that require grad, `qualname` computes the residuals
    again for its backward.
    Defining an op twice from the same generated text (a re-import, the package imported under
    two names) replaces the first definition; an op of that name from other text is refused.
    """
    companion = f"{qualname}_for_backward"
    _refuse_other(qualname, fingerprint)
    if saving is not None:
        _refuse_other(companion, fingerprint)

    def kernel(*args: Any) -> Any:
        return _fresh(function.forward(*args), args)

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        function.setup_context(ctx, inputs, output)

    if saving is None:
        return _define(qualname, schema, fingerprint, kernel, function.backward, setup_context, broadcasts)
    shown = schema.rsplit("->", 1)[1].count("Tensor")
    hidden = (None,) * (saving.rsplit("->", 1)[1].count("Tensor") - shown)

    def outputs(*args: Any) -> Any:
        full = kernel(*args)
        return full[0] if shown == 1 else full[:shown]

    def setup_again(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.save_for_backward(*(a for a in inputs if isinstance(a, torch.Tensor)))
        ctx.inputs = tuple(_SAVED if isinstance(a, torch.Tensor) else a for a in inputs)

    def backward(ctx: Any, *grads: Any) -> Any:
        # The residuals again, from the saved inputs and recorded where backward is (double backward)
        saved = iter(ctx.saved_tensors)
        inputs = tuple(next(saved) if a is _SAVED else a for a in ctx.inputs)
        again = _Context(ctx.needs_input_grad)
        function.setup_context(again, inputs, function.forward(*inputs))
        return function.backward(again, *grads, *hidden)

    training = _define(companion, saving, fingerprint, kernel, function.backward, setup_context, broadcasts)
    op = _define(qualname, schema, fingerprint, outputs, backward, setup_again, broadcasts)
    setattr(op, TRAINING, training)

    def padded(*args: Any) -> tuple[Any, ...]:
        return (op(*args), *hidden) if shown == 1 else (*op(*args), *hidden)

    setattr(op, PADDED, padded)
    return op


_SAVED = object()  # in `ctx.inputs`: a tensor input, saved with `save_for_backward`


class _Context:
    """What a Function's `setup_context` and `backward` use of `ctx`, for a backward that calls them
    outside autograd's own (`define`'s op called directly where it has residuals)."""

    def __init__(self, needs_input_grad: tuple[bool, ...]) -> None:
        self.needs_input_grad = needs_input_grad
        self.saved_tensors: tuple[Any, ...] = ()

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors: Any) -> None:
        pass

    def mark_non_differentiable(self, *tensors: Any) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass


def _define(
    qualname: str,
    schema: str,
    fingerprint: str,
    kernel: Callable[..., Any],
    backward: Callable[..., Any],
    setup_context: Callable[..., None],
    broadcasts: bool,
) -> Any:
    try:
        op = torch.library.custom_op(qualname, kernel, mutates_args=(), schema=schema)
    except RuntimeError as error:
        raise RuntimeError(
            f"cannot define the custom op {qualname!r}: {error}; another library defines this name: "
            "generate the package with `opgen generate --namespace NAME` to give it a namespace of its own"
        ) from None
    setattr(op, FINGERPRINT, fingerprint)
    op.register_fake(kernel)
    op.register_autograd(backward, setup_context=setup_context)
    op.register_vmap(_broadcast_rule(op) if broadcasts else _loop_rule(op))
    return op


_EXPORTED: dict[type, Any] = {}  # Function -> its custom op, defined by `exported`


def exported(function: Any, name: str) -> Any:
    """`function` (an op's autograd Function, or its twin without jvp), or while torch.export records for
    training (grad mode on) a stand-in whose `apply` is the custom op `PACKAGE::name` built from it.
    Export inlines a Function's forward, and training the graph would differentiate the forward formula
    and lose the op's backward (a gradient override, a guarded branch's finite gradient); a custom op
    stays one node with its registered backward. It is defined when non-strict export (torch's default)
    first records the op; strict export (Dynamo) cannot define one while it traces, and raises."""
    if not (torch.compiler.is_exporting() and torch.is_grad_enabled()) or torch.onnx.is_in_onnx_export():
        return function
    if torch.compiler.is_dynamo_compiling():
        raise RuntimeError(
            f"{name}(): strict torch.export inlines this op's forward and would drop its backward (a gradient"
            " override or a guarded branch); export with strict=False (torch's default) to train, or under"
            " torch.no_grad() for inference, or generate the op with `form: custom_op`"
        )
    op = _EXPORTED.get(function)
    if op is None:
        package = function.__module__.rsplit(".ops.", 1)[0].replace(".", "_")
        schema = torch.library.infer_schema(function.forward, mutates_args=())
        qualname = f"{package}::{name}"
        op = _EXPORTED[function] = define(qualname, schema, function, f"{function.__module__}:export", False)
    return _Applied(op)


class _Applied:
    """A custom op called as an autograd Function is: `.apply(*args)`."""

    def __init__(self, op: Any) -> None:
        self.apply = op


def op_or_function(op: Any, function: Any, *args: Any) -> Any:
    """What the functional calls, returning what the Function returns: the custom op, or the autograd
    Function it was built from under a torch.func transform or where an argument carries a
    forward-mode tangent (torch has no forward-mode rule for a custom op, and its registered autograd
    refuses torch.func's `grad`). Compiled, always a custom op: torch.compile keeps it as one node.
    An op with residuals (`define`'s `saving`) is its companion where a gradient will be needed."""
    if not torch.compiler.is_compiling():
        active = torch._C._are_functorch_transforms_active
        if active() or any(torch.is_tensor(a) and _tangent(a) is not None for a in args):
            return function.apply
    training = getattr(op, TRAINING, None)
    if training is None:
        return op
    if torch.is_grad_enabled() and any(torch.is_tensor(a) and a.requires_grad for a in args):
        return training
    return getattr(op, PADDED)


def _refuse_other(qualname: str, fingerprint: str) -> None:
    existing = torch._library.custom_ops.OPDEFS.get(qualname)
    if existing is None or getattr(existing, FINGERPRINT, None) == fingerprint:
        return
    owner = getattr(existing, FINGERPRINT, None)
    what = "another opgen package (generated from other specs or options)" if owner else "code other than opgen's"
    raise RuntimeError(
        f"the custom op {qualname!r} is already defined by {what}; two packages share the namespace "
        f"{qualname.split('::')[0]!r}: generate one of them with `opgen generate --namespace NAME`"
    )


def _fresh(result: Any, args: tuple[Any, ...]) -> Any:
    """`result` with no output aliasing an input or another output (a custom op's outputs are new
    tensors): an output sharing storage with an input or an earlier output (an input as it is, a
    view: `x.view_as(x)`, `x.T`) is copied. Storage, not `_is_view`: below autograd no view is
    recorded as one."""
    outputs = result if isinstance(result, tuple) else (result,)
    seen = {a.untyped_storage()._cdata for a in args if isinstance(a, torch.Tensor)}
    fresh = []
    for out in outputs:
        if out.untyped_storage()._cdata in seen:
            out = out.clone()
        seen.add(out.untyped_storage()._cdata)
        fresh.append(out)
    return tuple(fresh) if isinstance(result, tuple) else fresh[0]


def _out_dims(result: Any) -> Any:
    return tuple(0 for _ in result) if isinstance(result, tuple) else 0


def _broadcast_rule(op: Any) -> Callable[..., Any]:
    """vmap of an elementwise op: one call with the batch dimension first, every batched input
    padded to the rank of the others so that it broadcasts in front of all of them. An output has
    the shape of one call on a single sample (found on the meta device): the padding taken out,
    or the batch put in front where the output does not depend on a batched input."""

    def rule(info: Any, in_dims: tuple[int | None, ...], *args: Any) -> Any:
        pairs = list(zip(args, in_dims, strict=True))
        rank = max(a.dim() - (d is not None) for a, d in pairs if isinstance(a, torch.Tensor))
        moved = []
        for a, d in pairs:
            if d is not None:
                a = a.movedim(d, 0)
                a = a.reshape(a.shape[:1] + (1,) * (rank - a.dim() + 1) + a.shape[1:])
            moved.append(a)
        one = [a.select(d, 0) if d is not None else a for a, d in pairs]
        shapes = op(*(torch.empty_like(a, device="meta") if isinstance(a, torch.Tensor) else a for a in one))
        result = op(*moved)
        batch = info.batch_size
        outputs = []
        for out, meta in zip(*(r if isinstance(r, tuple) else (r,) for r in (result, shapes)), strict=True):
            if out.dim() == meta.dim():  # independent of every batched input
                outputs.append(out.expand(batch, *meta.shape).clone())
            else:
                outputs.append(out.reshape(batch, *meta.shape))
        return (tuple(outputs) if isinstance(result, tuple) else outputs[0]), _out_dims(result)

    return rule


def _loop_rule(op: Any) -> Callable[..., Any]:
    """vmap of any op: one call per sample, stacked (a shape-changing op is not batch-agnostic)."""

    def rule(info: Any, in_dims: tuple[int | None, ...], *args: Any) -> Any:
        results = []
        for b in range(info.batch_size):
            sample = [a.select(d, b) if d is not None else a for a, d in zip(args, in_dims, strict=True)]
            result = op(*sample)
            results.append(result if isinstance(result, tuple) else (result,))
        stacked = tuple(torch.stack(column) for column in zip(*results, strict=True))
        return (stacked if len(stacked) > 1 or isinstance(result, tuple) else stacked[0]), _out_dims(result)

    return rule


def _tangent(tensor: torch.Tensor) -> Any:
    return torch.autograd.forward_ad.unpack_dual(tensor).tangent  # type: ignore[no-untyped-call, unused-ignore]
