"""The records the stages hand on: what derive returns (`Derived`), forward mode's tangents, the
residuals the save stage chooses.

Frozen dataclasses of SymPy expressions, made by one stage and read by the later ones: derive
makes `Derived` and `Tangents` (opgen.derive.gradients, opgen.derive.jvp), the save stage chooses
`Residual`s (opgen.optimize.save), plan and emit read them. They live outside the stages so that a
later stage reads what an earlier one made without importing that stage: emit imports nothing
of derive or optimize (tests/test_pipeline.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
from sympy import Expr

from opgen.formula import tensor, written
from opgen.formula.read import Symbols
from opgen.spec.model import Spec

# -- derive: gradients (opgen.derive.gradients) --------------------------------------------------------


@dataclass(frozen=True)
class LeafFit:
    """What turns a gradient into the shape of its input beyond the static sums in the formula."""

    expand: bool  # some dimension of the input is 1 (or missing) in the gradient
    sum_to_size: bool  # batch dimensions may have been broadcast: sum back at run time


@dataclass(frozen=True)
class Contribution:
    """`grad_<output> * factor`, or with `output` None, a whole gradient override."""

    output: str | None
    factor: Expr


@dataclass(frozen=True)
class Gradient:
    input: str
    contributions: tuple[Contribution, ...]
    overridden: bool
    # Formulas with tensor operations: one contribution holding the whole gradient (`output`
    # None), already summed to the input's shape except for what `fit` leaves to run time.
    fit: LeafFit | None = None


@dataclass(frozen=True)
class Variant:
    absent: tuple[str, ...]  # the `Tensor?` inputs that are None
    lets: tuple[tuple[str, Expr], ...]  # in terms of inputs and earlier lets
    outputs: tuple[tuple[str, Expr], ...]  # in terms of inputs, lets and earlier outputs
    inlined: tuple[tuple[str, Expr], ...]  # outputs in terms of inputs only
    gradients: tuple[Gradient, ...]  # one per present Tensor input, in input order
    # Outputs whose simplified formula lost some of its shape as written, with the pieces it
    # lost: forward expands them (Note [shapes as written] in opgen.formula.written).
    expand: tuple[tuple[str, tuple[written.Piece, ...]], ...] = ()


@dataclass(frozen=True)
class Part:
    """A part of an output, differentiated as one more output of the op (Note [parts of the outputs] in
    opgen.derive.parts)."""

    expr: Expr  # in terms of the inputs
    grad: sympy.Symbol  # its incoming gradient: a stand-in, which the save stage replaces by a residual's
    # Per Tensor input, in input order: of an elementwise call, the factor of its incoming gradient
    # (`d expr / d input`); of a tensor operation, the whole gradient, in `grad`. None: a shape
    # rule refused one, and the part cannot be a residual.
    derivatives: tuple[tuple[str, Expr], ...] | None
    tensor_op: bool = True  # a tensor operation (else an elementwise call)

    def derivative(self, name: str) -> Expr:
        assert self.derivatives is not None
        return dict(self.derivatives)[name]


@dataclass(frozen=True)
class Derived:
    spec: Spec
    symbols: Symbols
    variants: tuple[Variant, ...]  # the all-present variant last
    shapes: dict[sympy.Symbol, tensor.Shape]  # static shape of every input, let, output and gradient
    parts: tuple[Part, ...] = ()  # what the save stage may make residuals, differentiated (opgen.derive.parts)

    @property
    def has_tensor_ops(self) -> bool:
        """Some formula uses `@`, `.T` or a reduction (gradients by `opgen.derive.vjp`)."""
        return any(g.fit is not None for v in self.variants for g in v.gradients)

    @property
    def full(self) -> Variant:
        return self.variants[-1]


# -- derive: tangents (opgen.derive.jvp) ---------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    """The directional derivative of one output along the tangent of `input`."""

    input: str
    value: Expr


@dataclass(frozen=True)
class OutputTangent:
    output: str  # a spec output or a residual
    terms: tuple[Term, ...]  # the nonzero ones, in input order


@dataclass(frozen=True)
class VariantTangents:
    absent: tuple[str, ...]
    outputs: tuple[OutputTangent | None, ...]  # one per returned output; None: not differentiable
    refused: tuple[tuple[str, str], ...] = ()  # input -> why forward mode along it is refused


@dataclass(frozen=True)
class Tangents:
    symbols: dict[str, sympy.Symbol]  # Tensor input -> its tangent symbol
    variants: tuple[VariantTangents, ...]  # same order as `Derived.variants`

    @property
    def full(self) -> VariantTangents:
        return self.variants[-1]


# -- optimize: residuals (opgen.optimize.save) ---------------------------------------------------------


@dataclass(frozen=True)
class Residual:
    """An intermediate forward returns for backward only (Note [hidden outputs] in opgen.optimize.save)."""

    name: str  # the Function's extra output; no spec name takes it
    expr: Expr  # what forward computes, in terms of the inputs
    symbol: sympy.Symbol  # how the gradients read it
    grad: sympy.Symbol  # its incoming gradient in backward
    differentiable: bool = True  # False: a statistic autograd does not differentiate (opgen.nodes.layer_norm)
    recompute: bool = False  # backward recomputes it where it is differentiated (Note [saved rstd] in ...layer_norm)
