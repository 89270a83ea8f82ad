"""Emit stage, type annotations: a spec's types -> the annotated signatures of the generated code.

Receives the spec's inputs and outputs and the names an op module uses for torch and its
annotation types; returns `def` lines (laid out as `ruff format` would, opgen.emit.layout) and
annotation texts for the Function's methods, the functional and the Module.

Note [typed generated code]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
Generated code passes `mypy --strict`, so a user's typed project can call it. The annotations
say what a caller passes and gets: `Tensor` inputs are `torch.Tensor`, `Tensor?` ones
`torch.Tensor | None`, `float`/`int`/`bool` inputs their Python type; one output is a
`torch.Tensor`, several a `tuple` of exactly that many. The Function's methods follow
`torch.autograd.Function`'s own: `ctx` is `Any` (torch types it so; the op keeps its own
attributes on it), `setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None`,
`backward` returns one gradient per input (`None` for a non-tensor one), `jvp` receives one
tangent per input (torch passes `None` for a non-tensor input and for an absent `Tensor?`).

Annotations are evaluated once, when the module is imported, never per call, and without
`from __future__ import annotations`, so what introspects them (torch.library's schema
inference, `typing.get_type_hints`) sees real types. `X | None` needs Python 3.10, the oldest
the generated package supports. An annotation is evaluated in the module's namespace, where an
op or Module may be named `float`, `tuple` or `Any`: then the builtin is written
`builtins.float` and `Any` imported under a free name (`TypeNames`).

What torch leaves untyped (`Function.apply`, `torch.broadcast_shapes`) is called under a
`# type: ignore[<code>, unused-ignore]` naming the exact error: `unused-ignore` keeps the line
clean on a torch release whose stubs do type it.

One relaxation, per op module: `# mypy: disable-error-code="no-any-return"`. torch types `ctx`
as `Any`, so what `backward` and `jvp` read from it (`ctx.saved_tensors`, the values kept on it)
is `Any`, and so is what `torch.ops.aten.*` returns; mypy can check nothing about such a value,
and `--strict`'s `warn_return_any` would only ask for a `cast` (a call, on every call of the op)
or a redeclared variable before each `return`. Every other `--strict` check stays on, and the
signatures are what callers are checked against. The generated tests and `harness.py` need none.
"""

from __future__ import annotations

from dataclasses import dataclass

from opgen.emit import layout
from opgen.spec.model import Input, InputType
from opgen.spec.names import Namer

BUILTIN_TYPES = ("bool", "float", "int", "str", "tuple")
# The builtins an op module calls or annotates with: an op, class or Module named like one shadows it.
BUILTIN_NAMES = (*BUILTIN_TYPES, "super")


@dataclass(frozen=True, kw_only=True)
class TypeNames:
    """How an op module writes the types of its annotations, none shadowed by a module-level name."""

    tensor: str  # `torch.Tensor`
    any: str  # `typing.Any`, imported under this name
    builtin: dict[str, str]  # `float`, `int`, `bool`, `str`, `tuple`, `super` -> how the module writes it
    imports: tuple[str, ...]  # the stdlib imports these need, sorted as ruff's isort sorts them


def type_names(torch: str, namer: Namer, module_level: set[str]) -> TypeNames:
    """`namer` avoids every name of the module; `module_level`: the names the module defines
    (the functional, the classes), which would shadow a builtin the module uses."""
    shadowed = sorted(set(BUILTIN_NAMES) & module_level)
    builtins = namer.fresh("builtins") if shadowed else ""
    any_ = namer.fresh("Any")
    imports = []
    if shadowed:
        imports.append("import builtins" if builtins == "builtins" else f"import builtins as {builtins}")
    imports.append("from typing import Any" if any_ == "Any" else f"from typing import Any as {any_}")
    return TypeNames(
        tensor=f"{torch}.Tensor",
        any=any_,
        builtin={t: f"{builtins}.{t}" if t in shadowed else t for t in BUILTIN_NAMES},
        imports=tuple(imports),
    )


def input_type(kind: InputType, types: TypeNames) -> str:
    """The annotation of an input: what a caller passes for it."""
    if kind.kind == "Tensor":
        return f"{types.tensor} | None" if kind.optional else types.tensor
    return types.builtin[kind.kind]


def tangent_type(kind: InputType, types: TypeNames) -> str:
    """The annotation of `jvp`'s tangent of an input: torch passes None for a non-tensor one."""
    return input_type(kind, types) if kind.kind == "Tensor" else "None"


def gradient_type(kind: InputType, types: TypeNames) -> str:
    """The annotation of `backward`'s gradient of an input: None when it needs none."""
    return f"{types.tensor} | None" if kind.kind == "Tensor" else "None"


def results(annotations: list[str], types: TypeNames) -> str:
    """One value as itself, several as a tuple of exactly that many."""
    if len(annotations) == 1:
        return annotations[0]
    return f"{types.builtin['tuple']}[{', '.join(annotations)}]"


def tensors(count: int, types: TypeNames) -> str:
    """`count` tensors returned: one `torch.Tensor`, or a tuple of `count`."""
    return results([types.tensor] * count, types)


def param(name: str, annotation: str, default: str | None = None) -> str:
    """`name: annotation`, with ` = default` when it has one."""
    return f"{name}: {annotation}" if default is None else f"{name}: {annotation} = {default}"


def trailing_defaults(has_default: list[bool]) -> int:
    """Where the trailing run of parameters with a default starts (`len(has_default)` when there is
    none): Python allows a default only when every later parameter has one, so a declared default
    before a parameter without one is left out (the caller passes that argument)."""
    start = len(has_default)
    while start and has_default[start - 1]:
        start -= 1
    return start


def keyword_only_from(has_default: list[bool]) -> int:
    """Where keyword-only parameters start so that every declared default is kept (`len(has_default)`
    when none need be): at the first parameter without a default that follows one with a default.
    Python allows a default only when every later positional parameter has one; a keyword-only
    parameter may go without (`def __init__(self, eps=1e-05, *, normalized_shape, bias=True)`)."""
    for k, default in enumerate(has_default):
        if not default and any(has_default[:k]):
            return k
    return len(has_default)


def typed_params(inputs: list[Input], types: TypeNames, defaults: dict[str, str] | None = None) -> list[str]:
    """Each input as an annotated parameter; `defaults`: input -> its default's source."""
    defaults = defaults or {}
    return [param(i.name, input_type(i.type, types), defaults.get(i.name)) for i in inputs]


def define(name: str, params: list[str], returns: str, indent: int) -> str:
    """`def name(params) -> returns:` as ruff formats it at column `indent`."""
    return layout.call(f"def {name}", params, indent, f" -> {returns}:")


def reference_param(kind: InputType, name: str, absent: set[str], types: TypeNames) -> str:
    """A parameter of a generated test's plain-torch reference: a tensor (None when the reference
    is the one without it), or a number the reference turns into a tensor itself."""
    if kind.kind == "Tensor":
        return param(name, "None" if name in absent else types.tensor)
    return param(name, f"{types.builtin[kind.kind]} | {types.tensor}")
