"""Model: the parsed spec as frozen dataclasses.

Built by `opgen.spec.parse` from the raw YAML tree; consumed by `derive` and `emit`. Formulas
stay text here (with their location); `opgen.formula.reader` turns them into SymPy. Invariants
that involve one node live in `__post_init__`; those across nodes are checked by the parser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from opgen.errors import Loc

Scalar = bool | int | float

TENSOR = "Tensor"
NON_TENSOR_KINDS = ("float", "int", "bool")
SAMPLE_VALUES: dict[str, Scalar] = {"float": 0.75, "int": 2, "bool": True}  # see Spec.test_value


@dataclass(frozen=True)
class InputType:
    kind: str  # "Tensor", "float", "int" or "bool"
    optional: bool = False  # `Tensor?`: may be None
    dims: tuple[str, ...] | None = None  # `Tensor[N, K]`
    default: Scalar | None = None
    has_default: bool = False

    def __post_init__(self) -> None:
        assert self.kind == TENSOR or self.kind in NON_TENSOR_KINDS, self.kind
        assert not (self.optional and self.kind != TENSOR)
        assert not (self.has_default and self.kind == TENSOR)

    @property
    def is_tensor(self) -> bool:
        return self.kind == TENSOR

    def __str__(self) -> str:
        text = self.kind
        if self.dims is not None:
            text += "[" + ", ".join(self.dims) + "]"
        if self.optional:
            text += "?"
        if self.has_default:
            text += " = " + python_literal(self.default)
        return text


def python_literal(value: Scalar | None) -> str:
    return repr(value)


@dataclass(frozen=True)
class Input:
    name: str
    type: InputType
    loc: Loc

    @property
    def is_tensor(self) -> bool:
        return self.type.is_tensor


@dataclass(frozen=True)
class Formula:
    """Formula text as written, and where its first character is."""

    text: str
    loc: Loc

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Let:
    name: str
    formula: Formula
    loc: Loc


@dataclass(frozen=True)
class Output:
    name: str
    formula: Formula
    differentiable: bool
    loc: Loc


@dataclass(frozen=True)
class GradientOverride:
    input: str
    formula: Formula
    loc: Loc


@dataclass(frozen=True)
class Init:
    kind: str  # uniform normal zeros ones constant kaiming_uniform xavier_uniform
    # numbers, or arithmetic on the module's args as checked text (Note [init from constructor args])
    args: tuple[float | str, ...]

    def __str__(self) -> str:
        if not self.args and self.kind in ("zeros", "ones"):
            return self.kind
        return f"{self.kind}({', '.join(a if isinstance(a, str) else repr(a) for a in self.args)})"


INIT_ARITY: dict[str, tuple[int, ...]] = {
    "uniform": (2,),
    "normal": (2,),
    "zeros": (0,),
    "ones": (0,),
    "constant": (1,),
    "kaiming_uniform": (0, 1),
    "xavier_uniform": (0, 1),
}


@dataclass(frozen=True)
class Parameter:
    name: str  # the input it fills
    shape: tuple[int | str, ...]  # ints or names of int module args
    init: Init
    when: str | None  # a bool module arg: registered as None when false
    loc: Loc


@dataclass(frozen=True)
class Module:
    name: str
    args: tuple[Input, ...]
    parameters: tuple[Parameter, ...]
    attributes: tuple[tuple[str, str], ...]  # (input name, arg name)
    loc: Loc

    def parameter(self, name: str) -> Parameter | None:
        return next((p for p in self.parameters if p.name == name), None)

    def attribute_arg(self, name: str) -> str | None:
        return next((arg for inp, arg in self.attributes if inp == name), None)


@dataclass(frozen=True)
class TestConfig:
    domain: tuple[tuple[str, float, float], ...] = ()
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # dim names and input names
    values: tuple[tuple[str, Scalar], ...] = ()  # sample values of non-tensor inputs
    gradgrad: bool = True
    points: tuple[tuple[str, tuple[float, ...]], ...] = ()  # input -> values at kinks and edges
    native: str | None = None  # a key of `opgen.spec.native.NATIVE_OPS`
    extremes: bool = True  # the float32 accuracy test at extreme inputs (`opgen.plan.extremes`)
    native_loc: Loc | None = field(default=None, compare=False)  # where `tests.native` is written

    # input -> its domain kind (Note [domain kinds]); an input not named here is drawn from its interval
    kinds: tuple[tuple[str, str], ...] = ()

    def domain_of(self, name: str) -> tuple[float, float]:
        """Where the samples of `name` are drawn: its interval, or its kind's (Note [domain kinds])."""
        return next(((lo, hi) for n, lo, hi in self.domain if n == name), (-3.0, 3.0))

    def kind_of(self, name: str) -> str:
        return dict(self.kinds).get(name, "interval")

    def declared(self, name: str) -> bool:
        return any(n == name for n, _, _ in self.domain)

    def meant_range(self, name: str) -> tuple[float, float]:
        """Where the op is meant to be evaluated at `name`, which the tests at extreme inputs keep to:
        the declared interval (or the kind's), everywhere when no domain is declared or it is `real`."""
        if not self.declared(name) or self.kind_of(name) == "real":
            return (-math.inf, math.inf)
        kind = self.kind_of(name)
        return (0.0, math.inf) if kind == "positive" else self.domain_of(name)

    def middle_of(self, name: str) -> float:
        """A typical value of `name`: mid-domain, a whole number for a discrete kind."""
        low, high = self.domain_of(name)
        middle = (low + high) / 2
        return float(math.ceil(middle)) if self.kind_of(name) in DISCRETE_KINDS else middle


# Note [domain kinds]
# ~~~~~~~~~~~~~~~~~~~
# An extension of `tests: domain` (docs/spec-format.md): besides `[low, high]`, an input may be
# `binary` (0/1 masks), `integer` or `{integer: [low, high]}` (whole numbers, 0 to 10 by default),
# `positive` (drawn from [0.1, 3]; the tests at extreme inputs sweep every positive point),
# `probability` (rows on the simplex along the last dimension) or `spd` (symmetric
# positive-definite matrices over the last two dimensions), or `{real: [low, high]}` (drawn from the
# interval, but the op is meant for every real number: the tests at extreme inputs sweep all their
# points, where a plain interval keeps them inside it). A discrete input (binary, integer) is
# checked against the reference's autograd but not by gradcheck, whose finite differences would
# leave the whole numbers; gradcheck perturbs an spd input symmetrically (it sees `(A + A.mT) / 2`).
DOMAIN_KINDS: dict[str, tuple[float, float]] = {
    "binary": (0.0, 1.0),
    "integer": (0.0, 10.0),
    "positive": (0.1, 3.0),
    "probability": (0.0, 1.0),
    "spd": (-3.0, 3.0),
}
DISCRETE_KINDS = ("binary", "integer")


FORMS = ("function", "custom_op")  # Note [custom_op form] in opgen/emit/custom_op.py
# `autocast:` (Note [autocast] in opgen/emit/capture.py): cast the floating inputs to autocast's
# dtype (torch.matmul), to float32 (torch.amp.custom_fwd(cast_inputs=torch.float32)), or not at all.
AUTOCAST_POLICIES = ("lower", "float32", "inputs")
POLICIES = ("balanced", "memory", "speed")  # Note [save policies] in opgen/optimize/save.py


@dataclass(frozen=True)
class Optimize:
    """The spec's `optimize:` section: which optimizations apply (all by default)."""

    rewrite: bool = True  # stable rewrites (opgen.optimize.rewrite)
    lower: bool = True  # native kernels for known primitives (opgen.optimize.lower)
    policy: str = "balanced"  # what backward saves (opgen.optimize.save)
    fuse: bool = False  # forward and backward math in torch.compile (opgen.emit.fuse)

    def __post_init__(self) -> None:
        assert self.policy in POLICIES, self.policy


@dataclass(frozen=True)
class Spec:
    name: str
    doc: str
    inputs: tuple[Input, ...]
    lets: tuple[Let, ...]
    outputs: tuple[Output, ...]
    gradients: tuple[GradientOverride, ...]
    module: Module | None
    tests: TestConfig
    source: str  # how the generated header names the spec file, e.g. specs/swish.yaml
    loc: Loc
    optimize: Optimize = Optimize()
    form: str | None = None  # `form:` as written (None: not said; the run's --form decides)
    namespace: str = ""  # the torch.library namespace of a custom_op-form op, set by the run
    autocast: str | None = None  # `autocast:` as written (None: opgen.plan.capture decides)

    def __post_init__(self) -> None:
        assert self.form is None or self.form in FORMS, self.form
        assert self.autocast is None or self.autocast in AUTOCAST_POLICIES, self.autocast

    @property
    def custom_op(self) -> bool:
        return self.form == "custom_op"

    @property
    def class_name(self) -> str:
        return camel_case(self.name)

    @property
    def function_class_name(self) -> str:
        return camel_case(self.name) + "Function"

    @property
    def public_names(self) -> tuple[str, ...]:
        """What the package exports for this op: its functional, its Function class and its Module class."""
        return (self.name, self.function_class_name) + ((self.module.name,) if self.module else ())

    @property
    def tensor_inputs(self) -> tuple[Input, ...]:
        return tuple(i for i in self.inputs if i.is_tensor)

    def input(self, name: str) -> Input | None:
        return next((i for i in self.inputs if i.name == name), None)

    def override(self, name: str) -> GradientOverride | None:
        return next((g for g in self.gradients if g.input == name), None)

    def test_value(self, inp: Input) -> Scalar:
        """The value a non-tensor input takes in tests and benchmarks: `tests.values`, else its
        default when finite (a NaN or infinite default would make every compared value one),
        else a fixed choice per kind."""
        values = dict(self.tests.values)
        if inp.name in values:
            return values[inp.name]
        if inp.type.default is not None and math.isfinite(inp.type.default):
            return inp.type.default
        return SAMPLE_VALUES[inp.type.kind]


def camel_case(name: str) -> str:
    """`mul_constant` -> `MulConstant`; digits and existing capitals are kept."""
    parts = [p for p in name.split("_") if p]
    return "".join(p[0].upper() + p[1:] for p in parts) or "Op"
