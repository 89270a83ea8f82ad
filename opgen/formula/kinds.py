"""Which values of a formula are tensors and which are plain numbers.

Used by every stage that decides how a value is computed or kept: `derive` (the symbols
the lowering treats as numbers), `lower`, `save`, `plan` and the emitters' printer.

Note [numbers and tensors]
~~~~~~~~~~~~~~~~~~~~~~~~~~
Every subexpression of a formula is either number-valued or tensor-valued, by one rule:
it is tensor-valued when it uses a symbol that holds a tensor (a Tensor input, an output,
an incoming gradient, or a `let` or temporary defined by a tensor-valued expression), and
number-valued otherwise (non-tensor inputs, plain numbers, named dimension sizes, and what
is made of them only). A number-valued subexpression

- prints with `math` and Python operators, never as an argument a torch function needs
  as a tensor (a tensor-valued node with a number argument converts it with `new_tensor`,
  on the device and dtype of one of its tensors);
- is never lowered to a native kernel, never saved with `save_for_backward` and never
  returned as a hidden output; backward recomputes it from the non-tensor inputs kept as
  plain `ctx` attributes (Note [what backward may use]).

An output must be tensor-valued (`derive` refuses a formula that uses no Tensor input):
an autograd Function returns tensors, and a formula of numbers alone has no tensor to
take a dtype, device or shape from.
"""

from __future__ import annotations

from collections.abc import Iterable

import sympy


def is_tensor_valued(expr: sympy.Basic, tensors: frozenset[sympy.Symbol] | set[sympy.Symbol]) -> bool:
    """Whether `expr` holds a tensor at run time: it uses a symbol in `tensors`."""
    return bool(expr.free_symbols & tensors)


def with_definitions(
    tensors: frozenset[sympy.Symbol], definitions: Iterable[tuple[sympy.Symbol, sympy.Basic]]
) -> frozenset[sympy.Symbol]:
    """`tensors` and every defined symbol whose definition is tensor-valued.

    A symbol defined several times (a `let` in each variant of an op with `Tensor?` inputs)
    holds a tensor when any of its definitions does.
    """
    pending = list(definitions)
    found = set(tensors)
    while True:
        new = {symbol for symbol, expr in pending if symbol not in found and is_tensor_valued(expr, found)}
        if not new:
            return frozenset(found)
        found |= new


class Mask(sympy.Symbol):
    """A temporary that holds a comparison: a bool tensor, which gives no dtype to the numbers and
    indicators beside it; the printer takes theirs from the comparison (its `masks`, Note [conditions
    computed once] in opgen.plan.conditions)."""
