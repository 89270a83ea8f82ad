"""`opgen new NAME`: the text of a commented spec that generates as it is.

Receives an op name (checked as the parser checks `name:`) and whether to add a `module:`
section; returns the spec's YAML text. Every line that is not a comment is a working
spec: `opgen generate` makes an op whose generated tests pass, so a new op starts from
something that works and changes one line at a time.
"""

from __future__ import annotations

from opgen.spec.model import camel_case

_HEAD = """\
# {name}: a custom autograd op. `opgen generate` writes its torch.autograd.Function,
# functional{module_note} and tests; `opgen show` prints the derived gradients.
# The spec format: docs/spec-format.md in opgen's repository.
name: {name}
doc: "What {name} computes, in one line (the docstrings add the formulas)."
inputs:                 # in call order: Tensor, Tensor?, Tensor[N, K], float, int, bool; `= default`
  x: Tensor
"""

_FUNCTION = """\
  alpha: float = 1.0
let:                    # named intermediates, each may use the ones before it
  gate: sigmoid(alpha * x)
outputs:                # name: formula; functions: exp, log, tanh, sigmoid, softplus, where, max, ...
  y: x * gate           # powers are x**2; a condition is where(x > 0, x, 0)
# gradients:            # opgen derives every gradient; to replace one (a straight-through estimator):
#   x: grad_y
tests:
  domain: {x: [-3, 3]}  # where the generated tests draw each Tensor input
"""

_MODULE = """\
  alpha: Tensor         # a parameter of the module below
let:                    # named intermediates, each may use the ones before it
  gate: sigmoid(alpha * x)
outputs:                # name: formula; functions: exp, log, tanh, sigmoid, softplus, where, max, ...
  y: x * gate           # powers are x**2; a condition is where(x > 0, x, 0)
# gradients:            # opgen derives every gradient; to replace one (a straight-through estimator):
#   x: grad_y
module:                 # an nn.Module holding `alpha` as a learned parameter, one per feature
  args:
    features: int
  parameters:
    alpha: {shape: [features], init: ones}
tests:
  domain: {x: [-3, 3]}  # where the generated tests draw each Tensor input
"""


def skeleton(name: str, module: bool) -> str:
    """The commented spec of a new op `name` (already a valid op name)."""
    head = _HEAD.format(name=name, module_note=f", the nn.Module {camel_case(name)}" if module else "")
    return head + (_MODULE if module else _FUNCTION)
