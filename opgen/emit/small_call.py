"""Small calls: an op that is a short chain of PyTorch ops evaluates that chain for inputs of few elements.

Note [small calls]
~~~~~~~~~~~~~~~~~~
At a few thousand elements a kernel takes a few microseconds and the Python a custom
`torch.autograd.Function` runs per call does not: `apply`, `forward`, `setup_context` and, in
backward, the Python node with `backward` itself. Measured at 4096 float32 elements, forward
and backward (torch 2.13, one thread), even a Function whose forward and backward are one
kernel call each takes about 1.4x PyTorch's op with its C++ autograd node; a generated op
cannot get under that while it is a Function.

When the op's forward, as the Function prints it (after the optimizer's rewrites and
lowering), is a short chain of PyTorch ops whose own autograd gives the derivatives opgen
derived (Note [small chains]), the functional evaluates that chain directly under autograd,
after its call-time checks (which stay: every error is raised as before), for inputs of fewer
than `<Function>.native_below` elements (16384: above it the Function's in-place forms and
smaller saved tensors win, as for mish and gelu_tanh; below it the per-call cost dominates).
The chain is often one op (`silu(x)`, `softplus_beta(x, beta)`, `sigmoid(x)`), or a few
(`x / (abs(x) + 1)`, `x - tanh(x)`, `x * sigmoid(beta * x)`: what F.softsign and F.tanhshrink
themselves run). The Function is unchanged and is what `apply` and larger inputs use.

Under torch.compile the functional calls the Function as always (Dynamo cannot read the
Function's class attribute, and a compiled graph has no per-call cost to cut). Not for the
custom_op form (the op must stay one torch.library op), fused specs (the compiled loop is
their point), or ops under autocast casting. The generated tests run every check
through the Function (an autouse fixture sets `native_below` to 0) and check the small-call
path on its own: against the reference (values, gradients, second order, tangents, vmap) and
against the exact values at the extreme rows, and beside the Function at those rows.

Note [small chains]
~~~~~~~~~~~~~~~~~~~
Autograd of a chain multiplies, node by node, PyTorch's derivative of each op at its
argument; opgen's gradient is the chain rule over the same nodes, simplified. The two are the
same function wherever (1) each node's PyTorch derivative is opgen's derivative of that node,
at every point, and (2) every factor of the product is finite (a simplification may cancel an
infinite factor against a zero, `0 * inf`, which autograd evaluates as NaN). So a chain
qualifies when:

- its one output is differentiable, of the one Tensor input (not optional), with no variant,
  expansion (named dimensions cut or padded) or gradient override, and its derived gradient
  has no `where`: no guard of a removable singularity, no branch (opgen would compute
  something else at that point than autograd of the forward);
- every leaf is that input, a number, or a float/int input (a Python number at call time);
- every node is +, *, a power with an integer or negative number exponent, or a function of
  `CHAIN_FUNCTIONS` or a primitive PyTorch differentiates as opgen does, twice (`native_twice`);
  another primitive counts as its formula (mish as `x * tanh(softplus(x))`, which autograd
  differentiates twice where F.mish's second derivative is NaN past x = 100 in float32);
  Each of these is smooth wherever its value is finite, so its derivatives of every order are
  finite there: not `sqrt`, `asin` (finite at a point where their derivative is not), nor
  `u**1.5`, whose second derivative is infinite at 0 where the value and the first derivative
  are finite (autograd's second derivative of `x * abs(x)**1.5` is NaN at 0, the Function's 0);
  and each has PyTorch's convention
  where opgen's nodes have one: `abs` differentiates to `sgn` (0 at 0), `sign` to 0, as
  opgen's `Abs` and `sign` do; min/max, clamp and `where` (ties, branches) are left out.
  `exp`, `sinh` and `cosh` are left out too: at |u| > 89 they overflow float32 inside the
  generated tests' extreme rows, and a later node that maps inf to a finite value
  (`1 / (1 + exp(-x))`) leaves autograd a `0 * inf`;
- at most `MAX_NODES` nodes depend on the input: past that, autograd's saved tensors and one
  backward kernel per node cost more than the Function's per-call Python saves at 4K elements.

Residuals do not matter: they are what the Function returns for its own backward, and the
chain is the inlined forward (`x - tanh(x)`, whatever the Function saves of `tanh(x)`).
The chain's gradient is PyTorch's per-op formulas, rounded its way (F.tanhshrink's
`1 - (1 - tanh(x)**2)` where opgen prints `tanh(x)**2`): its error is at most a few float32
ulps of the largest local derivative, not of the result, which is what PyTorch's own ops of
the same chain give; the generated tests check it at the extreme rows against the exact
values with the Function's tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from opgen.emit.printer import TorchPrinter
from opgen.formula import functions as fn
from opgen.nodes.kernels import Primitive
from opgen.plan.backward import Plan
from opgen.plan.capture import autocast_policy

NATIVE_BELOW = 16384  # elements; Note [small calls]
MAX_NODES = 4  # operations a chain may have; Note [small chains]
# Functions PyTorch differentiates as opgen does, each finite with its derivative wherever its
# value is finite, and none growing past float32 at the tests' extreme rows (Note [small chains]).
CHAIN_FUNCTIONS: tuple[type, ...] = (
    fn.sigmoid,
    fn.softplus,  # F.softplus: linear past 20, where it and its slope are within float32's rounding
    sympy.tanh,
    sympy.sin,
    sympy.cos,
    sympy.atan,
    sympy.erf,
    sympy.log,
    fn.log1p,
    sympy.Abs,
    fn.sign,
)


@dataclass(frozen=True)
class SmallCall:
    tensor: str  # the Tensor input whose element count decides
    call: str  # PyTorch's ops evaluated on the functional's arguments
    below: int = NATIVE_BELOW


def _native_node(expr: sympy.Basic) -> bool:
    """One PyTorch op whose own autograd has every derivative opgen's has (not F.hardsigmoid's second)."""
    if isinstance(expr, Primitive):  # every primitive of the kernel families
        return bool(expr.native_twice)
    if isinstance(expr, sympy.Pow):
        return bool(expr.exp.is_number and (expr.exp.is_integer or expr.exp.is_negative))
    return isinstance(expr, (sympy.Add, sympy.Mul, *CHAIN_FUNCTIONS))


def _chain_nodes(expr: sympy.Basic, tensor: sympy.Symbol, numbers: set[sympy.Symbol]) -> int | None:
    """How many nodes of `expr` depend on `tensor`, if `expr` is a chain (Note [small chains]); else None."""
    if expr == tensor:
        return 0
    if tensor not in expr.free_symbols:  # a number at call time: printed as one (`math.exp(beta)`)
        return 0 if expr.free_symbols <= numbers else None
    if not _native_node(expr):
        return None
    count = 1
    for arg in expr.args:
        found = _chain_nodes(arg, tensor, numbers)
        if found is None:
            return None
        count += found
    return count


def _branches(plan: Plan) -> bool:
    """Whether a gradient guards a point or branches (a `where`, a piecewise form)."""
    factors = [c.factor for v in plan.derived.variants for g in v.gradients for c in g.contributions]
    return any(f.has(fn.where, sympy.Piecewise, sympy.DiracDelta, sympy.Heaviside) for f in factors)


def native_op(plan: Plan) -> tuple[str, sympy.Basic] | None:
    """The Tensor input and the chain of PyTorch ops the whole op is, if it is a short one (Note [small chains])."""
    derived = plan.derived
    spec = derived.spec
    if spec.custom_op or spec.optimize.fuse or autocast_policy(plan) or len(derived.variants) != 1:
        return None
    variant = derived.variants[0]
    if variant.expand or len(variant.inlined) != 1 or not spec.outputs[0].differentiable:
        return None
    if len(spec.tensor_inputs) != 1 or spec.tensor_inputs[0].type.optional:
        return None
    if any(g.overridden for bp in plan.backward for g in bp.grads) or _branches(plan):
        return None
    (_, expr), tensor = variant.inlined[0], spec.tensor_inputs[0]
    # A kernel whose own second derivative is PyTorch's to get wrong (F.mish's) is its formula here.
    expr = expr.replace(lambda e: isinstance(e, Primitive) and not e.native_twice, lambda e: e.elementary())
    numbers = {derived.symbols.inputs[i.name] for i in spec.inputs if not i.is_tensor and i.type.kind != "bool"}
    nodes = _chain_nodes(expr, derived.symbols.inputs[tensor.name], numbers)
    if nodes is None or not 0 < nodes <= MAX_NODES:
        return None
    return tensor.name, expr


def small_call(plan: Plan, printer: TorchPrinter) -> SmallCall | None:
    """PyTorch's ops the functional evaluates for small inputs, if the op is a short chain (Note [small calls])."""
    found = native_op(plan)
    return None if found is None else SmallCall(found[0], printer.doprint_expr(found[1]))
