"""Printing what a graph capture needs of a generated op: export's refusal, a plain forward.

Used by `opgen.emit.op` and its template (which also writes the functional's FX leaf); which
ops refuse export is decided in `opgen.plan.capture`.

Note [captured graphs keep the gradient]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A graph capture that traces through `Function.apply` inlines `forward` and drops `backward`:
training the captured graph then differentiates the forward formula, not the op's backward.
For a derived gradient that is the same function (up to rounding), but for a gradient
override (`sign_ste`, `grad_reverse`, ...) or a guarded `where` (`safe_sqrt`: autograd of the
inlined formula is NaN where the op's gradient is finite) it silently is not. So:

- `torch.fx.symbolic_trace`: the functional, called with a `Proxy` while FX traces, records
  itself as one `call_function` node (what `torch.fx.wrap` does, but wherever the functional
  is called from, and before the call-time checks that read shapes): the captured graph
  calls the functional, so its backward is the op's.
- `torch.export` (strict or not) has no leaf functions: the functional of an op whose
  gradient the inlined forward would lose raises while exporting with grad mode on, naming
  the op and what to do (export under `torch.no_grad()` for inference; FX or the
  `torch.library` form to train). Other ops export and train as their formula.
- A recorded forward must not work in place on tensors autograd saved (Note [forward in
  place]), nor combine a batched and an unbatched tensor in place under vmap: forward's
  in-place form is kept for eager calls, and the plain formula runs while exporting or
  under a functorch transform.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opgen.emit import layout
from opgen.spec import quote

if TYPE_CHECKING:
    from opgen.emit.names import RuntimeNames

Lines = list[str]


def recorded_forward(in_place: Lines, plain: Lines, torch: str, runtime: RuntimeNames) -> Lines:
    """Forward's body: the plain formula where it is recorded or vmapped, when it differs."""
    if in_place == plain:
        return in_place
    test = f"{runtime.recorded}() or {runtime.transforms_active}()"
    return [
        "# recorded (export, ONNX, jit.trace) or under a torch.func transform: no in-place work on saved tensors",
        f"if {test}:",
        *("    " + line if line else line for line in plain[:-1]),
        "else:",
        *("    " + line if line else line for line in in_place[:-1]),
        in_place[-1],
    ]


# Note [autocast]
# ~~~~~~~~~~~~~~~
# Under `torch.autocast` PyTorch's matrix ops (`matmul`, `linear`, `bilinear`, ...) cast their
# floating inputs to the autocast dtype and compute in it; a custom Function is not on
# autocast's lists, so `x @ w.T + b` made bf16 @ then a float32 add, and backward (which runs
# after the autocast region) multiplied a bf16 gradient by a float32 weight. A generated op
# whose formulas use `@` does what `torch.amp.custom_fwd(cast_inputs=...)` does, in the
# functional (Functions with `setup_context` have no ctx in forward): while autocast is on
# for the inputs' device it casts the floating tensor inputs, as recorded operations, and
# runs the Function with autocast off. Forward, the saved tensors and backward are then all
# in the autocast dtype, the outputs have nn.Linear's dtype, and autograd casts each gradient
# back to its input's dtype. Elementwise ops are left to type promotion, as PyTorch's are.
# That is the `lower` policy; a spec's `autocast:` may state `float32` (cast_inputs=torch.float32)
# or `inputs` (no cast, autocast off), and an op that multiplies tensors beside `@` (bilinear, a
# squared distance) is `float32` by default, as F.bilinear and torch.cdist are under CPU autocast
# (`opgen.plan.capture.autocast_policy`).


def float_checks(op: str, inputs: list[tuple[str, bool]], promote: bool, runtime: RuntimeNames) -> str:
    """The functional's check and cast of each (input, optional) a gradient flows to: `x, w =
    floating("op", {"x": x, "w": w})`, with `promote=False` where the op's forward keeps its own rule.

    Note [float inputs]
    ~~~~~~~~~~~~~~~~~~~
    A formula with a gradient is a real, floating-point function. An integer or bool tensor is
    cast to the floating dtype the other inputs promote to (the default dtype when none is
    floating), as PyTorch's floating ops promote one (`torch.tanh(torch.arange(3))` is float32):
    otherwise the formula would compute in integers or fail inside forward. A complex tensor is
    refused with a TypeError naming the argument: the derivation is over the reals, and its
    gradients would not be conjugated. Inputs no gradient flows to (a mask only compared) may have
    any dtype. float16 and bfloat16 compute in their own dtype, each operation rounding, as a
    composition of PyTorch ops does.

    Note [mixed dtypes]
    ~~~~~~~~~~~~~~~~~~~
    PyTorch's elementwise ops promote mixed floating inputs (float32 `x`, float64 `w`: float64),
    and so does the formula composed of them; the Function's backward kernels do not (
    `_log_softmax_backward_data` or `huber_loss_backward` given a float64 gradient and a float32
    saved tensor raise). When the dtypes of the Tensor inputs a gradient flows to differ, the
    functional casts them to the promoted dtype, as recorded operations: the Function sees one
    dtype, the outputs have the formula's, and autograd casts each gradient back to its input's
    dtype. Ops whose forward is a PyTorch op with its own rule (`@`, the native layer norm:
    `opgen.plan.capture.promotes`) keep it.
    """
    if not inputs:
        return ""
    required = [name for name, optional in inputs if not optional]
    optional = [name for name, optional in inputs if optional]
    keyword = [] if promote else ["promote=False"]
    targets = ", ".join(required + optional)
    args = [quote.string(op), _dict(required)] + ([_dict(optional)] if optional else []) + keyword
    text = layout.assign_call(targets, runtime.floating, args, 4)
    if all(len(line) + 4 <= layout.LINE_LENGTH for line in text.split("\n")):
        return text
    # one argument a line, a dict too long for its line one entry a line (as ruff formats a call)
    items = [quote.string(op), *(_dict_lines(names) for names in (required, optional) if names), *keyword]
    return f"{targets} = {runtime.floating}(\n" + "".join(f"        {item},\n" for item in items) + "    )"


def capture_lines(functional: str, args: list[str], proxy: str, runtime: RuntimeNames) -> Lines:
    """The functional's first lines: while torch.fx traces, the call recorded as one node (the runtime's
    `capture`), on one line where it fits, else its result named first."""
    call = f"{runtime.capture}({', '.join([functional, *args])})"
    line = f"if ({proxy} := {call}) is not None:  # torch.fx: one node"
    if 4 + len(line) <= layout.LINE_LENGTH:
        return [line, f"    return {proxy}"]
    named = layout.call(f"{proxy} = {runtime.capture}", [functional, *args], 4).split("\n")
    named = named[:1] + [line.removeprefix("    ") for line in named[1:]]  # the template indents every line
    return [*named, f"if {proxy} is not None:  # torch.fx: one node", f"    return {proxy}"]


def _dict(names: list[str]) -> str:
    return "{" + ", ".join(f"{quote.string(name)}: {name}" for name in names) + "}"


def _dict_lines(names: list[str]) -> str:
    """The dict of `names` as an argument at indentation 8: on its line, else one entry a line."""
    return layout.collection("", [f"{quote.string(name)}: {name}" for name in names], "{}", 8)
