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

from opgen.spec import quote

Lines = list[str]


def recorded_forward(in_place: Lines, plain: Lines, torch: str) -> Lines:
    """Forward's body: the plain formula where it is recorded or vmapped, when it differs."""
    if in_place == plain:
        return in_place
    test = f"{torch}.compiler.is_exporting() or {torch}._C._are_functorch_transforms_active()"
    return [
        "# recorded (export) or vmapped: Note [captured graphs keep the gradient]",
        f"if {test}:",
        *("    " + line if line else line for line in plain[:-1]),
        "else:",
        *("    " + line if line else line for line in in_place[:-1]),
        in_place[-1],
    ]


def export_refusal(name: str, loss: str) -> Lines:
    """The message the functional raises while exporting, as string literals of one line each."""
    words = (
        f"{name}(): torch.export inlines this op's forward and would drop {loss}; export under "
        "torch.no_grad() for inference, or capture with torch.fx.symbolic_trace (the op stays one node) to train"
    ).split(" ")
    lines, line = [], ""
    for word in words:
        if line and len(line) + len(word) > 80:
            lines.append(line)
            line = ""
        line += word + " "
    return [quote.string(text) for text in [*lines, line.rstrip()]]


def call_tuple(args: list[str]) -> str:
    return f"({args[0]},)" if len(args) == 1 else f"({', '.join(args)})"


def autocast_helper(name: str, torch: str, any_: str, call: str = "function.apply") -> Lines:
    """The module-level function a matrix op's functional calls under autocast (Note [autocast]).

    Note [autocast]
    ~~~~~~~~~~~~~~~
    Under `torch.autocast` PyTorch's matrix ops (`matmul`, `linear`, `bilinear`, ...) cast their
    floating inputs to the autocast dtype and compute in it; a custom Function is not on
    autocast's lists, so `x @ w.T + b` made bf16 @ then a float32 add, and backward (which runs
    after the autocast region) multiplied a bf16 gradient by a float32 weight. A generated op
    whose formulas use `@` does what `torch.amp.custom_fwd(cast_inputs=...)` does, in the
    functional (Functions with `setup_context` have no ctx in forward): while autocast is on
    for the inputs' device it casts the floating tensor inputs, as recorded operations, and
    runs the Function with autocast off. Forward, the saved tensors and backward are then all
    in the autocast dtype, the outputs have nn.Linear's dtype, and autograd casts each gradient
    back to its input's dtype. Elementwise ops are left to type promotion, as PyTorch's are.
    """
    return [
        f"def {name}(function: {any_}, *args: {any_}) -> {any_}:",
        f'    """`{call}(*args)` as torch.matmul runs under autocast (Note [autocast], opgen.emit)."""',
        f"    tensors = [a for a in args if {torch}.is_tensor(a)]  # no builtins: an op may be named `isinstance`",
        "    device = tensors[0].device.type",
        f"    if not {torch}.is_autocast_enabled(device):",
        f"        return {call}(*args)",
        f"    dtype = {torch}.get_autocast_dtype(device)",
        f"    args = tuple(a.to(dtype) if {torch}.is_tensor(a) and a.is_floating_point() else a for a in args)",
        f"    with {torch}.autocast(device, enabled=False):",
        f"        return {call}(*args)",
    ]


def float_checks(op: str, inputs: list[tuple[str, bool]], torch: str) -> Lines:
    """The functional's checks that each (input, optional) is a real floating-point tensor.

    Note [float inputs]
    ~~~~~~~~~~~~~~~~~~~
    A formula with a gradient is a real, floating-point function: an integer tensor would
    compute in integers or fail inside forward, and a complex one would get gradients that are
    not conjugated (the derivation is over the reals). The functional refuses both with a
    TypeError naming the argument, as PyTorch's float ops do. Inputs no gradient flows to (a
    mask only compared) may have any dtype. float16 and bfloat16 compute in their own dtype,
    each operation rounding, as a composition of PyTorch ops does.
    """
    lines = []
    for name, optional in inputs:
        test = f"not {torch}.is_tensor({name}) or not {name}.is_floating_point()"  # no builtins: spec names
        lines += [
            f"if {name} is not None and ({test}):" if optional else f"if {test}:",
            "    raise TypeError(",
            *_message(f"{op}(): argument {name!r} must be a real floating-point Tensor, got ", name, torch),
            "    )",
        ]
    return lines


def promotion(inputs: list[tuple[str, bool]], torch: str, dtype: str) -> Lines:
    """The functional's cast of mixed floating inputs (input, optional) to their promoted dtype.

    Note [mixed dtypes]
    ~~~~~~~~~~~~~~~~~~~
    PyTorch's elementwise ops promote mixed floating inputs (float32 `x`, float64 `w`: float64),
    and so does the formula composed of them; the Function's backward kernels do not (
    `_log_softmax_backward_data` or `huber_loss_backward` given a float64 gradient and a float32
    saved tensor raise). When the dtypes of the Tensor inputs a gradient flows to differ, the
    functional casts them to the promoted dtype, as recorded operations: the Function sees one
    dtype, the outputs have the formula's, and autograd casts each gradient back to its input's
    dtype. Equal dtypes, the common case, cost one comparison. Ops whose forward is a PyTorch op
    with its own rule (`@`, the native layer norm: `opgen.plan.capture.promoted_inputs`) keep it.
    """
    required = [name for name, optional in inputs if not optional]
    optional = [name for name, optional in inputs if optional]
    if not required or len(inputs) < 2:
        return []
    first = required[0]
    differs = [f"{name}.dtype != {first}.dtype" for name in required[1:]]
    differs += [f"({name} is not None and {name}.dtype != {first}.dtype)" for name in optional]
    lines = ["# mixed floating dtypes: promoted, as PyTorch's elementwise ops do (Note [mixed dtypes])"]
    test = f"if {' or '.join(differs)}:"
    if len(test) + 4 <= 120:  # the functional's body is indented once
        lines.append(test)
    else:  # as ruff format splits it
        lines += ["if (", f"    {differs[0]}", *(f"    or {d}" for d in differs[1:]), "):"]
    start = f"{torch}.promote_types({first}.dtype, {required[1]}.dtype)" if len(required) > 1 else f"{first}.dtype"
    lines.append(f"    {dtype} = {start}")
    for name in required[2:]:
        lines.append(f"    {dtype} = {torch}.promote_types({dtype}, {name}.dtype)")
    for name in optional:
        lines.append(f"    {dtype} = {dtype} if {name} is None else {torch}.promote_types({dtype}, {name}.dtype)")
    for name in required:
        lines.append(f"    {name} = {name}.to({dtype})")
    for name in optional:
        lines.append(f"    {name} = None if {name} is None else {name}.to({dtype})")
    return lines


def _message(text: str, name: str, torch: str) -> Lines:
    """`text` then the argument's dtype (or type), as ruff format leaves it: one f-string when it fits."""
    got = f"{{{name}.dtype if {torch}.is_tensor({name}) else {name}.__class__.__name__}}"
    one = f'        f{quote.string(text + "{")[:-2]}{got}"'
    if len(one) + 4 <= 120:  # the functional's body is indented once more
        return [one]
    return [f"        {quote.string(text)}", f'        f"{got}"']
