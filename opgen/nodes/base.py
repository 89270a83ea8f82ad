"""What a node opgen defines declares, with the defaults: every question a stage may ask of a node.

Note [nodes]
~~~~~~~~~~~~
A node is a SymPy function class opgen defines: a function of the formula language that SymPy
lacks (`sigmoid`, opgen.formula.functions), a stable form the optimizer writes (`logcosh`), a
PyTorch kernel a formula was lowered to (`silu`, `LayerNorm`, `Glu`), or a backward kernel
(`silu_backward`, `LayerNormGrads`). Earlier stages meet the nodes of later ones in the formulas
they are handed (derive differentiates a `LayerNorm`, `shape_of` sizes it) and ask them through
the classes below, by `isinstance`, never by looking for a method by name:

- every `Node` has `elementary()`, the formula it computes, of elementary functions and earlier
  nodes (its value at many digits, opgen.plan.digits; docstrings; derivatives where it has no rule
  of its own): the one spelling of a node's formula; `stable_form()`, what forward computes in its
  place where PyTorch has no kernel (Note [printed stable forms] in opgen.plan.blocks);
  `detached`, a statistic autograd does not differentiate; `guard_domain`, arguments a
  `where` branch must guard (Note [double where] in opgen.derive.guard);
- a `Shaped` node is not shaped as its arguments broadcast: it gives its shape (`shape_in`); a
  `OneOperand` one (a diagonal, a cumprod) also gives its operand's gradient and its own tangent;
- a `Lowered` node stands for a formula the optimizer replaced by one kernel: forward mode, and a
  gradient narrower than the node (Note [narrow gradients] in opgen.derive.vjp), go through its
  `elementary()` form; it gives its own gradient (`vjp_pushes`) and its value where some
  `Tensor?` inputs are None (`without`);
- a `Spelled` node prints itself as torch code, and a `Shown` node in docstrings: SymPy's printers
  call the method their `printmethod` names, `_torch(printer)` for the torch printer
  (opgen.emit.printer) and `_docstring(printer)` for the docstring printer (opgen.emit.display),
  before any `_print_<Class>` method of theirs. `printer` is typed by what a spelling may use of
  it (`TorchCode`, `Printer`);
- an `UnderTransforms` node is a backward kernel that torch.func transforms do not take as they
  should: backward calls the kernel (`kernel_call`), and under the transforms computes the
  formulas (`transform_formulas`) instead, inline or as an `if` statement (opgen.emit.statements).

A family module (layer norm, the gated linear unit, the native kernels) holds its node classes
with all these rules side by side, as JAX's `lax.py` defines a primitive with its shape rule, its
derivatives and its lowering; adding a node touches its family module alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import sympy
from sympy import Expr

if TYPE_CHECKING:
    from opgen.formula.dims import Shape

Domain = tuple[tuple[int, ...], Expr]  # positions of restricted arguments, a safe value for them
Drop = Callable[[Expr, frozenset[sympy.Symbol]], Expr | None]  # opgen.derive.gradients.drop_terms


class Printer(Protocol):
    """What a spelling may use of any SymPy printer: `_print`, as SymPy's own print methods do."""

    def _print(self, expr: Any, **kwargs: Any) -> str: ...


class TorchCode(Printer, Protocol):
    """What a torch spelling may use of the torch printer (opgen.emit.printer.TorchPrinter)."""

    torch: str  # how the generated file names torch, `math` and `torch.nn.functional`
    math: str
    functional: str
    runtime: Any  # the functions of the package's runtime, by the names the file imports them as

    @property
    def no_grad(self) -> bool:
        """Printing code autograd never records (Note [forward in place] in opgen.emit.kernel_lines)."""
        ...

    def _postfix(self, expr: sympy.Basic) -> str:
        """`expr` printed so that a method call may follow it: in parentheses unless it is a name or call."""
        ...

    def is_tensor(self, expr: sympy.Basic) -> bool: ...

    def _as_tensor(self, value: sympy.Basic, like: sympy.Basic) -> str:
        """A number printed as a tensor of the dtype of `like`."""
        ...

    def untaken(self, *bases: str) -> list[str]:
        """A name from each of `bases`, all different, that no symbol the printer knows, nor torch or math, takes."""
        ...


class Node:
    """A SymPy function class opgen defines (Note [nodes]); mixed into `sympy.Function` subclasses."""

    __slots__ = ()

    guard_domain: ClassVar[Domain | None] = None  # Note [double where] in opgen.derive.guard

    def elementary(self) -> Expr:
        """The formula the node computes, of elementary functions and earlier nodes; none by default."""
        raise NotImplementedError(f"{type(self).__name__} has no elementary form")

    def stable_form(self) -> Expr | None:
        """What forward computes in the node's place (Note [printed stable forms] in opgen.plan.blocks);
        None by default: the node prints as itself."""
        return None

    @property
    def detached(self) -> bool:
        """A statistic autograd does not differentiate (Note [layer norm statistics] in opgen.nodes.layer_norm)."""
        return False


class Shaped(Node):
    """A node not shaped as its arguments broadcast (`opgen.formula.tensor.shape_of` asks it)."""

    __slots__ = ()

    def shape_in(self, table: dict[sympy.Symbol, Shape]) -> Shape:
        """The node's static shape, given those of the symbols (`table`)."""
        raise NotImplementedError


class Lowered(Shaped):
    """A formula the optimizer replaced by one kernel: its `elementary()` form is that formula."""

    __slots__ = ()

    def vjp_pushes(self, grad: Expr) -> list[tuple[Expr, Expr]]:
        """(part, its gradient) for the incoming gradient `grad` of the node's full shape; by default
        through its formula."""
        return [(self.elementary(), grad)]

    def without(self, absent: frozenset[sympy.Symbol], drop: Drop) -> Expr | None:
        """The node where the `Tensor?` inputs `absent` are None, `drop` dropping them from a term
        (opgen.derive.gradients.drop_terms); by default gone when an argument is."""
        args = [drop(arg, absent) for arg in self.args]  # type: ignore[attr-defined]
        return None if any(arg is None for arg in args) else self.func(*args)  # type: ignore[attr-defined]


class OneOperand(Shaped):
    """A tensor node of one tensor operand that gives its shape, the gradient of its operand and its tangent,
    by the shapes of the symbols (`table`); reverse and forward mode (opgen.derive.vjp, opgen.derive.jvp) ask
    it (a cumulative product, Note [cumprod] in opgen.nodes.scan, whose formula has no zero-safe elementary form)."""

    __slots__ = ()

    @property
    def operand(self) -> Expr:
        """The tensor the node moves the entries of: its first argument."""
        return self.args[0]  # type: ignore[attr-defined]

    def vjp_operand(self, grad: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        """The gradient of the operand, for the incoming gradient `grad` (fitted to the node, perhaps narrower)."""
        raise NotImplementedError

    def tangent_of(self, tangent: Expr, table: dict[sympy.Symbol, Shape]) -> Expr:
        """The node's tangent, for the tangent of its operand (perhaps narrower than the operand)."""
        raise NotImplementedError


class Rearranging(OneOperand):
    """A `OneOperand` node linear in its operand, whose entries it moves (a diagonal, Note [diagonals] in
    opgen.nodes.diagonal)."""

    __slots__ = ()


class Spelled(Node):
    """A node that prints itself as torch code, through the torch printer's `printmethod` (Note [nodes])."""

    __slots__ = ()

    def _torch(self, printer: TorchCode) -> str:
        """The node as torch code."""
        raise NotImplementedError


class Shown(Node):
    """A node that prints itself in docstrings, through the docstring printer's `printmethod` (Note [nodes])."""

    __slots__ = ()

    def _docstring(self, printer: Printer) -> str:
        """The node as docstrings show it: by default as the formula it computes."""
        return printer._print(self.elementary())


class Tupled(Node):
    """A node that returns a tuple of tensors, read one at a time (`Item` in opgen.nodes.layer_norm)."""

    __slots__ = ()

    def part_formula(self, index: int) -> Expr | None:
        """What the tuple's entry `index` computes, as a formula; None: a None entry."""
        raise NotImplementedError


class UnderTransforms(Spelled):
    """A backward kernel torch.func transforms, or autograd's higher derivatives, do not take as they should
    (Note [layer norm under torch.func] in opgen.nodes.layer_norm, Note [glu under torch.func] in
    opgen.nodes.glu): backward calls the kernel, and under the transforms or in double backward computes
    its formulas instead."""

    __slots__ = ()

    def kernel_call(self, printer: TorchCode) -> tuple[str, list[str]]:
        """The kernel and its arguments, printed."""
        raise NotImplementedError

    def transform_formulas(self) -> list[tuple[Expr | None, Expr | None]]:
        """What the kernel computes, as formulas: one, its value; several, the tuple it returns, each
        (formula, the input whose shape it is summed to, or None), or (None, None) for a None."""
        raise NotImplementedError

    def _torch(self, printer: TorchCode) -> str:
        """The kernel, or under torch.func transforms and in double backward the formulas; opgen.emit.statements
        writes the two as an `if` statement instead where the node is a statement's whole value."""
        function, args = self.kernel_call(printer)
        parts = [_part(printer, part, into) for part, into in self.transform_formulas()]
        formula = parts[0] if len(parts) == 1 else f"({', '.join(parts)})"
        return f"({function}({', '.join(args)}) if {printer.runtime.backward_kernels}() else {formula})"


def _part(printer: TorchCode, part: Expr | None, into: Expr | None) -> str:
    if part is None:
        return "None"
    return (
        printer._print(part) if into is None else f"{printer._postfix(part)}.sum_to_size({printer._print(into)}.shape)"
    )
