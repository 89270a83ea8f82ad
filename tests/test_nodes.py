"""The node families (opgen/nodes/, Note [nodes] in opgen/nodes/base.py): stages ask a node through the
declared classes, never by looking a method up by name, and a node's spelling uses only what the
printer declares it gives."""

from __future__ import annotations

import ast
import inspect

import sympy
from conftest import ROOT

from opgen.emit.display import DisplayPrinter
from opgen.emit.printer import TorchPrinter
from opgen.nodes import activations, base, clips, losses
from opgen.nodes.kernels import PRIMITIVES, KernelBackward, Primitive

RULES = {
    name
    for cls in (base.Node, base.Shaped, base.Lowered, base.Spelled, base.Shown, base.UnderTransforms, Primitive)
    for name in vars(cls)
    if not name.startswith("__")
}


def test_no_module_looks_a_rule_of_a_node_up_by_name():
    found = []
    for path in sorted((ROOT / "opgen").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) > 1):
                continue
            name = node.args[1]
            if node.func.id in ("hasattr", "getattr") and isinstance(name, ast.Constant) and name.value in RULES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.func.id}(..., {name.value!r})")
    assert not found
    assert {"elementary", "shape_in", "vjp_pushes", "without", "stable_form", "detached", "_torch"} <= RULES


def test_the_printers_give_what_the_spellings_use():
    """mypy cannot tell (SymPy's printers are untyped): each member of the protocols is there."""
    x = sympy.Symbol("x", real=True)
    printer = TorchPrinter({x: "x"}, frozenset({x}))
    for protocol in (base.Printer, base.TorchCode):
        members = [*protocol.__annotations__, *(n for n, v in vars(protocol).items() if inspect.isfunction(v))]
        members += [n for n, v in vars(protocol).items() if isinstance(v, property)]
        assert all(hasattr(printer, m) for m in members if not m.startswith("__")), protocol
    assert TorchPrinter.printmethod == "_torch" and DisplayPrinter.printmethod == "_docstring"


def test_every_primitive_spells_its_call_and_its_backward_kernel():
    x, g = sympy.symbols("x g", real=True)
    params = sympy.symbols("p q", real=True)
    printer = TorchPrinter({x: "x", g: "g", params[0]: "p", params[1]: "q"}, frozenset({x, g}))
    families = {p.__module__ for p in PRIMITIVES.values()}
    assert {activations.__name__, clips.__name__, losses.__name__} <= families
    for name, primitive in PRIMITIVES.items():
        node = primitive(x, *params[: int(max(primitive.nargs)) - 1])
        assert printer.doprint_expr(node).lstrip("(").startswith("torch.")  # the loss kernels: `(kernel if ...)`
        assert issubclass(primitive.backward, KernelBackward) and primitive.backward.__name__ == f"{name}_backward"
        if not primitive.backward_in_place:
            assert "torch.ops.aten." in printer.doprint_expr(primitive.backward(g, *node.args))
