"""Derive stage: the derivatives of the parts of an op's outputs that forward computes anyway.

Receives a spec's one variant (with its gradients derived); returns a `Part` for each part of an
output that the save stage may make a residual, with the derivative every Tensor input gets through
it, as if it were one more output of the op. The save stage chooses among the parts and reads these
derivatives; it differentiates nothing itself.

Note [parts of the outputs]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
A residual is a part of an output that forward returns for backward (Note [hidden outputs] in
opgen.optimize.save): a call of an elementwise op (`tanh(x)` of `x - tanh(x)`), or a tensor
operation that costs a pass over its input (cross-entropy's `log_softmax(input)`, Note [saved
tensor operations] in opgen.optimize.save_tensors). Backward then adds the gradient through it:
for a call, its derivative times its own incoming gradient; for a tensor operation, the gradient
reverse mode gives from that incoming gradient (`opgen.derive.vjp`), here in a stand-in symbol
(`Part.grad`) that the save stage replaces by the residual's. Which parts pay for themselves is
the save stage's choice, made after the gradients are rewritten; so every part it may choose is
differentiated here: for specs with one variant and no gradient override (the only ones that get
residuals), each call in an elementwise spec's outputs (not a whole output), and each tensor
operation that costs a pass in the one differentiable output of a spec with tensor operations.
"""

from __future__ import annotations

import sympy
from sympy import Expr
from sympy.core.function import ArgumentIndexError

from opgen.derive.vjp import tensor_gradient
from opgen.formula.kinds import is_tensor_valued
from opgen.formula.read import Symbols
from opgen.formula.syntax import is_elementwise
from opgen.formula.tensor import (
    LogSoftmax,
    MatMul,
    ReductionBase,
    Shape,
    ShapeError,
    Softmax,
    has_tensor_ops,
    shape_of,
)
from opgen.records import Part
from opgen.spec.model import Spec

# The tensor operations that cost a pass over their input (`COST` in opgen.optimize.save_tensors).
PASSES: tuple[type, ...] = (Softmax, LogSoftmax, MatMul, ReductionBase)


def derive_parts(
    spec: Spec,
    symbols: Symbols,
    outputs: tuple[tuple[str, Expr], ...],
    inlined: tuple[tuple[str, Expr], ...],
    shapes: dict[sympy.Symbol, Shape],
) -> tuple[Part, ...]:
    """The parts of a spec's one variant (its `outputs`, and `inlined` in terms of the inputs) that
    the save stage may make residuals, each with its derivatives (Note [parts of the outputs])."""
    if spec.gradients:
        return ()
    inputs = [(i.name, symbols.inputs[i.name]) for i in spec.tensor_inputs]
    found: list[Part] = []
    if any(has_tensor_ops(e) for _, e in inlined):
        found += _tensor_parts(spec, inlined, inputs, shapes)
    if is_elementwise(spec) and all(o.differentiable for o in spec.outputs):
        lets = set(symbols.lets.values())
        calls = {
            call
            for _, expr in outputs
            for call in expr.atoms(sympy.Function)
            if call != expr and is_tensor_valued(call, symbols.tensors) and not call.free_symbols & lets
        }
        known: dict[tuple[Expr, sympy.Symbol], Expr] = {}
        for call in sorted(calls, key=lambda c: (sympy.count_ops(c, visual=False), sympy.default_sort_key(c))):
            for _, x in inputs:
                known[call, x] = _chained(call, x, known)
        for call in sorted(calls, key=sympy.default_sort_key):
            derivatives = tuple((name, known[call, x]) for name, x in inputs)
            found.append(Part(call, _stand_in(len(found)), derivatives, tensor_op=False))
    return tuple(found)


def _chained(call: Expr, x: sympy.Symbol, known: dict[tuple[Expr, sympy.Symbol], Expr]) -> Expr:
    """`sympy.diff(call, x)`, reading the derivatives of `call`'s arguments from `known` where they are
    there: the chain rule as SymPy's `Function._eval_derivative` applies it, without deriving a nested
    call again for each call around it (which made the parts of a nest of calls cubic in its depth)."""
    cheap = [sympy.diff(arg, x) if arg.is_Symbol or not arg.has(x) else None for arg in call.args]
    slopes = [known.get((arg, x), slope) for arg, slope in zip(call.args, cheap, strict=True)]
    if type(call)._eval_derivative is not sympy.Function._eval_derivative or any(d is None for d in slopes):
        return sympy.diff(call, x)
    terms = []
    for i, slope in enumerate(slopes, start=1):
        if slope is None or slope.is_zero:  # (None was sent to sympy.diff above)
            continue
        try:
            terms.append(call.fdiff(i) * slope)
        except ArgumentIndexError:
            return sympy.diff(call, x)
    derivative = sympy.Add(*terms)
    return sympy.diff(call, x) if derivative.has(sympy.Derivative) else derivative


def _stand_in(k: int) -> sympy.Symbol:
    return sympy.Symbol(f"grad:part{k}", real=True)


def _tensor_parts(
    spec: Spec,
    inlined: tuple[tuple[str, Expr], ...],
    inputs: list[tuple[str, sympy.Symbol]],
    shapes: dict[sympy.Symbol, Shape],
) -> list[Part]:
    """The tensor operations that cost a pass in the one differentiable output, with the gradient
    through each (`opgen.derive.vjp`, cleaned of nothing: as the op's own gradient term reads it)."""
    if len(spec.outputs) != 1 or not spec.outputs[0].differentiable:
        return []
    (_, output), *_ = inlined
    tensors = {x for _, x in inputs}
    nodes: set[Expr] = {n for n in sympy.preorder_traversal(output) if isinstance(n, PASSES) and n != output}
    found = []
    for k, node in enumerate(sorted((n for n in nodes if n.free_symbols & tensors), key=sympy.default_sort_key)):
        grad = _stand_in(k)
        try:
            table = {**shapes, grad: shape_of(node, shapes)}
            derivatives = tuple((name, tensor_gradient([(node, grad)], x, table, lambda e: e)) for name, x in inputs)
        except ShapeError:
            found.append(Part(node, grad, None))
            continue
        found.append(Part(node, grad, derivatives))
    return found
