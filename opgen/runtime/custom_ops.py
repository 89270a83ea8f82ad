"""Registration of the package's ops as `torch.library` custom ops (the `custom_op` form).

Each op module of that form calls `define` once, at import, with its autograd Function: the
custom op's kernel and fake (meta) implementation are the Function's `forward`, its autograd
formula the Function's `setup_context` and `backward`, its vmap rule below. Note [custom_op
form] in opgen's `opgen/emit/custom_op.py` says why.
"""

import torch
import torch._library.custom_ops

FINGERPRINT = "_opgen_fingerprint"  # the CustomOpDef attribute naming the generated module's text


def define(qualname, schema, function, fingerprint, broadcasts):
    """The custom op `qualname` computing `function.forward`, with its backward and a vmap rule.

    `broadcasts`: the op only broadcasts its tensor inputs elementwise, so a batched call is one
    call with the batch dimension in front; otherwise the vmap rule calls the op per sample.
    Defining an op twice from the same generated text (a re-import, the package imported under
    two names) replaces the first definition; an op of that name from other text is refused.
    """
    _refuse_other(qualname, fingerprint)

    def kernel(*args):
        return _fresh(function.forward(*args), args)

    def setup_context(ctx, inputs, output):
        function.setup_context(ctx, inputs, output)

    try:
        op = torch.library.custom_op(qualname, kernel, mutates_args=(), schema=schema)
    except RuntimeError as error:
        raise RuntimeError(
            f"cannot define the custom op {qualname!r}: {error}; another library defines this name: "
            "generate the package with `opgen generate --namespace NAME` to give it a namespace of its own"
        ) from None
    setattr(op, FINGERPRINT, fingerprint)
    op.register_fake(kernel)
    op.register_autograd(function.backward, setup_context=setup_context)
    op.register_vmap(_broadcast_rule(op) if broadcasts else _loop_rule(op))
    return op


def op_or_function(op, function, *args):
    """What the functional calls: the custom op, or the autograd Function it was built from under a
    torch.func transform or where an argument carries a forward-mode tangent (torch has no
    forward-mode rule for a custom op, and its registered autograd refuses torch.func's `grad`).
    Compiled, always the custom op: torch.compile keeps it as one node."""
    if torch.compiler.is_compiling():
        return op
    active = torch._C._are_functorch_transforms_active
    if active() or any(
        torch.is_tensor(a) and torch.autograd.forward_ad.unpack_dual(a).tangent is not None for a in args
    ):
        return function.apply  # noqa: E501
    return op


def _refuse_other(qualname, fingerprint):
    existing = torch._library.custom_ops.OPDEFS.get(qualname)
    if existing is None or getattr(existing, FINGERPRINT, None) == fingerprint:
        return
    owner = getattr(existing, FINGERPRINT, None)
    what = "another opgen package (generated from other specs or options)" if owner else "code other than opgen's"
    raise RuntimeError(
        f"the custom op {qualname!r} is already defined by {what}; two packages share the namespace "
        f"{qualname.split('::')[0]!r}: generate one of them with `opgen generate --namespace NAME`"
    )


def _fresh(result, args):
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


def _out_dims(result):
    return tuple(0 for _ in result) if isinstance(result, tuple) else 0


def _broadcast_rule(op):
    """vmap of an elementwise op: one call with the batch dimension first, every batched input
    padded to the rank of the others so that it broadcasts in front of all of them. An output has
    the shape of one call on a single sample (found on the meta device): the padding taken out,
    or the batch put in front where the output does not depend on a batched input."""

    def rule(info, in_dims, *args):
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


def _loop_rule(op):
    """vmap of any op: one call per sample, stacked (a shape-changing op is not batch-agnostic)."""

    def rule(info, in_dims, *args):
        results = []
        for b in range(info.batch_size):
            sample = [a.select(d, b) if d is not None else a for a, d in zip(args, in_dims, strict=True)]
            result = op(*sample)
            results.append(result if isinstance(result, tuple) else (result,))
        stacked = tuple(torch.stack(column) for column in zip(*results, strict=True))
        return (stacked if len(stacked) > 1 or isinstance(result, tuple) else stacked[0]), _out_dims(result)

    return rule
