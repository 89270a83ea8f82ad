"""Random legal specs: inputs of every type, lets, several outputs, overrides, `tests:`.

`cases()` is a Hypothesis strategy of `Case`s: the formula trees of one spec plus how to
call the op (values of the non-tensor inputs, shapes, which inputs need a gradient), and
`spec_text(case)` its YAML. Every formula is finite with finite derivatives on the
declared domains (`fuzz_grammar`), so a generated op must equal plain autograd of the
same trees (`fuzz_check`) or be refused with a located message.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import fuzz_combos
from fuzz_ast import Node, render
from fuzz_grammar import Builder, binop, call, make, num
from hypothesis import strategies as st

PLAIN_SHAPES = ((3, 4), (4,), (3, 1), (1, 4), (), (2, 3, 4))
WHOLE_OF_P = ("sum", "amax", "norm")  # reductions of a `Tensor?` term (no count: p may be batched)


@dataclass(frozen=True)
class InputDecl:
    name: str
    kind: str  # Tensor, Tensor?, float, int, bool
    dims: tuple[str, ...] | None = None  # Tensor[...]: "..." for batch dimensions
    default: Any = None  # a non-tensor's declared default (None: none declared)
    value: Any = None  # a non-tensor's value in the call
    domain: tuple[float, float] = (-3.0, 3.0)

    @property
    def tensor(self) -> bool:
        return self.kind.startswith("Tensor")

    def type_text(self) -> str:
        if not self.tensor:
            if self.default is None:
                return self.kind
            default = str(self.default).lower() if isinstance(self.default, bool) else repr(self.default)
            return f"{self.kind} = {default}"
        dims = "" if self.dims is None else "[" + ", ".join(self.dims) + "]"
        return "Tensor" + dims + ("?" if self.kind == "Tensor?" else "")


@dataclass(frozen=True)
class OutputDecl:
    name: str
    node: Node
    differentiable: bool = True
    optional_terms: tuple[tuple[str, Node], ...] = ()  # (Tensor? input, term) added at the top level

    def full(self) -> Node:
        node = self.node
        for _, term in self.optional_terms:
            node = binop("+", node, term)
        return node


@dataclass(frozen=True)
class Case:
    op: str
    inputs: tuple[InputDecl, ...]
    lets: tuple[tuple[str, Node], ...]
    outputs: tuple[OutputDecl, ...]
    overrides: tuple[tuple[str, Node], ...] = ()
    gradgrad: bool = True
    sizes: tuple[tuple[str, int], ...] = ()  # named dimension -> size in the call
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # plain Tensor input -> shape in the call
    batch: tuple[int, ...] = ()  # the shape `...` stands for in the call
    requires: tuple[str, ...] = ()  # Tensor inputs that need a gradient
    seed: int = 0
    quoted: bool = False
    doc: str | None = None
    extra: dict[str, str] = field(default_factory=dict)  # more top-level YAML, key -> text


def _yaml_scalar(text: str, quoted: bool) -> str:
    special = not text or text[0] in "-?:,[]{}#&*!|>'\"%@`~ " or ": " in text or " #" in text or text[-1] in " :"
    return json.dumps(text, ensure_ascii=False) if quoted or special else text


def spec_text(case: Case) -> str:
    """The spec's YAML, as a person would write it."""
    lines = [f"name: {case.op}"]
    if case.doc is not None:
        lines.append(f"doc: {json.dumps(case.doc)}")
    lines.append("inputs:")
    lines += [f"  {i.name}: {i.type_text()}" for i in case.inputs]
    if case.lets:
        lines.append("let:")
        lines += [f"  {name}: {_yaml_scalar(render(node), case.quoted)}" for name, node in case.lets]
    lines.append("outputs:")
    for out in case.outputs:
        text = render(out.full())
        if out.differentiable:
            lines.append(f"  {out.name}: {_yaml_scalar(text, case.quoted)}")
        else:
            lines.append(f"  {out.name}: {{formula: {json.dumps(text)}, differentiable: false}}")
    if case.overrides:
        lines.append("gradients:")
        lines += [f"  {name}: {_yaml_scalar(render(node), case.quoted)}" for name, node in case.overrides]
    domains = [f"{i.name}: [{i.domain[0]}, {i.domain[1]}]" for i in case.inputs if i.tensor]
    lines.append("tests:")
    lines.append("  domain: {" + ", ".join(domains) + "}" if domains else "  gradgrad: true")
    if not case.gradgrad:
        lines.append("  gradgrad: false")
    for key, value in case.extra.items():
        lines.append(f"{key}: {value}")
    return "\n".join(lines) + "\n"


PLAIN_NAMES = {"tensor": "x", "float": "a", "int": "n", "bool": "b", "Tensor?": "p", "let": "l", "output": "o"}


class Names:
    """Fresh names for the spec's inputs, lets and outputs; `pool` makes them hostile (`fuzz_hostile`)."""

    def __init__(self, draw: Any, pool: tuple[str, ...] | None) -> None:
        self.draw, self.pool, self.used = draw, pool, set[str]()

    def fresh(self, role: str) -> str:
        if self.pool is not None:
            options = [n for n in self.pool if n not in self.used]
            if options and self.draw(st.integers(0, 99)) < 70:
                name: str = self.draw(st.sampled_from(options))
                self.used.add(name)
                return name
        index = 0
        while f"{PLAIN_NAMES[role]}{index}" in self.used:
            index += 1
        name = f"{PLAIN_NAMES[role]}{index}"
        self.used.add(name)
        return name


def _var(decl: InputDecl, shape: Any) -> Node:
    if decl.tensor:
        return Node("var", value=decl.name, lo=decl.domain[0], hi=decl.domain[1], shape=shape, tensor=True)
    value = float(decl.value)
    return Node("var", value=decl.name, lo=value, hi=value, shape=())


@st.composite
def _domains(draw: Any) -> tuple[float, float]:
    lo = draw(st.sampled_from([-3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0]))
    return (lo, lo + draw(st.sampled_from([0.5, 1.0, 2.0, 4.0, 6.0])))


def _scalar_inputs(draw: Any, names: Names) -> list[InputDecl]:
    decls = []
    for kind in draw(st.lists(st.sampled_from(["float", "int", "bool"]), max_size=2)):
        value: Any = {
            "float": draw(st.sampled_from([0.5, -1.5, 2.0, 0.25, 3.0])),
            "int": draw(st.integers(1, 3)),
            "bool": draw(st.booleans()),
        }[kind]
        default = value if draw(st.booleans()) else None
        decls.append(InputDecl(names.fresh(kind), kind, default=default, value=value))
    return decls


@st.composite
def cases(draw: Any, pool: tuple[str, ...] | None = None, depth: int = 3, dims: bool | None = None) -> Case:
    """A random legal spec; `dims` chooses named dimensions (None: either), `pool` hostile names."""
    names = Names(draw, pool)
    use_dims = draw(st.booleans()) if dims is None else dims
    inputs: list[InputDecl] = []
    batch: tuple[int, ...] = ()
    sizes: tuple[tuple[str, int], ...] = ()
    if use_dims:
        batched = draw(st.integers(0, 3)) == 0
        batch = (2,) if batched else ()
        families = [("N", "M"), ("M", "K")] + ([] if batched else [("K",), ("M",)])
        chosen = [("N", "K"), ("K", "M")] + draw(st.lists(st.sampled_from(families), max_size=2, unique=True))
        for shape in chosen:
            decl_dims = ("...",) + shape if batched else shape
            inputs.append(InputDecl(names.fresh("tensor"), "Tensor", decl_dims, domain=draw(_domains())))
        sizes = tuple(zip(("N", "K", "M"), draw(st.permutations([2, 3, 4])), strict=True))
    else:
        for _ in range(draw(st.integers(1, 3))):
            inputs.append(InputDecl(names.fresh("tensor"), "Tensor", domain=draw(_domains())))
    inputs += _scalar_inputs(draw, names)
    if draw(st.integers(0, 4)) == 0:  # a tensor of no dimensions, `Tensor[]`
        inputs.append(InputDecl(names.fresh("tensor"), "Tensor", (), domain=draw(_domains())))
    optional = None
    if draw(st.integers(0, 4)) == 0:
        bias_dims = None if not use_dims else ("M",)
        optional = InputDecl(names.fresh("Tensor?"), "Tensor?", bias_dims, domain=draw(_domains()))
        inputs.insert(draw(st.integers(0, len(inputs))), optional)
    order = draw(st.permutations(range(len(inputs))))
    inputs = [inputs[i] for i in order]

    def shape_of(decl: InputDecl) -> Any:
        return None if decl.dims is None else tuple(d for d in decl.dims if d != "...")

    leaves = [_var(i, shape_of(i) if i.tensor else ()) for i in inputs if i.kind != "Tensor?"]
    size_nodes = [Node("var", value=d, lo=2.0, hi=4.0, shape=()) for d, _ in sizes] if draw(st.booleans()) else []
    builder = Builder(draw, leaves, size_nodes, batched=bool(batch))
    builder.cuts = {d: tuple(k for k in (2, 3, 4) if size % k == 0) for d, size in sizes}
    targets = _targets(builder) if use_dims else [None]

    lets = []
    for _ in range(draw(st.integers(0, 3))):
        node = builder.expr(draw(st.integers(0, depth)), draw(st.sampled_from(targets)))
        name = names.fresh("let")
        lets.append((name, node))
        leaves.append(Node("var", value=name, lo=node.lo, hi=node.hi, shape=node.shape, tensor=node.tensor))
    outputs = _outputs(draw, builder, names, targets, depth, optional, bool(lets))
    overrides = _overrides(draw, builder, inputs, outputs)
    tensors = [i.name for i in inputs if i.tensor]
    requires = draw(st.lists(st.sampled_from(tensors), min_size=1, unique=True))
    shapes = () if use_dims else tuple((i.name, draw(st.sampled_from(PLAIN_SHAPES))) for i in inputs if i.tensor)
    if overrides:
        shapes = tuple((n, (3, 4)) for n, _ in shapes)
    return Case(
        op=names.fresh("output") if pool is not None and draw(st.booleans()) else "op",
        inputs=tuple(inputs),
        lets=tuple(lets),
        outputs=tuple(outputs),
        overrides=overrides,
        gradgrad=draw(st.integers(0, 9)) > 0,
        sizes=sizes,
        shapes=shapes,
        batch=batch,
        requires=tuple(requires),
        seed=draw(st.integers(0, 2**31 - 1)),
        quoted=draw(st.booleans()),
        extra=dict(draw(st.sampled_from(fuzz_combos.EXTRA))),
    )


def _targets(builder: Builder) -> list[Any]:
    return sorted(builder.reachable(), key=lambda s: (-len(s), s))


def _tensor_leaf(builder: Builder, target: Any) -> Node:
    from fuzz_grammar import fits

    options = [n for n in builder.leaves if n.tensor and fits(n.shape, target, False)]
    return builder.pick(options) if options else builder.shaped(0, target, True)  # type: ignore[no-any-return]


def _outputs(
    draw: Any,
    builder: Builder,
    names: Names,
    targets: list[Any],
    depth: int,
    optional: InputDecl | None,
    lets: bool = False,
) -> list[OutputDecl]:
    outputs: list[OutputDecl] = []
    count = draw(st.integers(1, 3))
    reductions: list[str] = []  # of a shared let, one per output (fuzz_combos.shared_let_outputs)
    for index in range(count):
        target = draw(st.sampled_from(targets))
        node = builder.expr(draw(st.integers(1, depth + 1)), target)
        shared = fuzz_combos.shared_let_outputs(builder, target, reductions) if lets and draw(st.booleans()) else None
        if shared is not None:
            node = binop(draw(st.sampled_from(["+", "*"])), builder.capped(shared), node)
        if not node.tensor:  # an output depends on a Tensor input
            node = binop(draw(st.sampled_from(["+", "*"])), node, _tensor_leaf(builder, target))
        differentiable = index == 0 or draw(st.integers(0, 3)) > 0
        if not differentiable and draw(st.booleans()):
            node = make("ind", (builder.condition(1, target),))
            if not node.tensor:
                node = binop("*", node, _tensor_leaf(builder, target))
        name = names.fresh("output")
        terms: tuple[tuple[str, Node], ...] = ()
        if optional is not None and index == count - 1 and differentiable:
            terms = ((optional.name, _optional_term(draw, builder, optional, node)),)
        outputs.append(OutputDecl(name, node, differentiable, terms))
        if index < count - 1:  # later formulas may use earlier outputs (never the one with optional terms)
            builder.leaves.append(Node("var", value=name, lo=node.lo, hi=node.hi, shape=node.shape, tensor=True))
    return outputs


def _optional_term(draw: Any, builder: Builder, optional: InputDecl, main: Node) -> Node:
    from fuzz_grammar import fits

    p = Node("var", value=optional.name, lo=optional.domain[0], hi=optional.domain[1], shape=optional.dims, tensor=True)
    forms = [
        lambda: p,
        lambda: binop("*", num(2), p),
        # inside a reduction, with no sum inside (opgen drops the innermost term that uses p: `x * (1 + p)` is x)
        lambda: make(
            "whole", (binop("*", p, _tensor_leaf(builder, p.shape)),), (draw(st.sampled_from(WHOLE_OF_P)), None)
        ),
        lambda: make("whole", (call("tanh", binop("*", p, builder.pick(builder.leaves))),), ("amax", None)),
        lambda: call("tanh", p),
        lambda: make("neg", (p,)),
        lambda: binop("*", p, builder.pick(builder.leaves)),
    ]
    try:
        term = draw(st.sampled_from(forms))()
    except (ValueError, AssertionError):  # shapes that do not broadcast, or no tree of the shape
        term = p
    if main.shape is not None and not fits(term.shape, main.shape, False):
        term = p if fits(p.shape, main.shape, False) else binop("*", num(0.5), _sum_all(p))
    return builder.capped(term)


def _sum_all(p: Node) -> Node:
    if p.shape is None:  # a plain Tensor: `sum(p)` (a `dim` needs declared dimensions, a refused spec)
        return make("whole", (p,), ("sum", None))
    return make("reduce", (p,), ("sum", -1, None))


def _overrides(
    draw: Any, builder: Builder, inputs: list[InputDecl], outputs: list[OutputDecl]
) -> tuple[tuple[str, Node], ...]:
    if draw(st.integers(0, 4)) != 0 or any(i.name.startswith("grad") for i in inputs):
        return ()
    differentiable = [o for o in outputs if o.differentiable]
    candidates = [i for i in inputs if i.kind == "Tensor"]
    chosen = draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=2, unique=True))
    result = []
    for decl in chosen:
        shape = None if decl.dims is None else tuple(d for d in decl.dims if d != "...")
        usable = [o for o in differentiable if shape is None or o.node.shape == shape]
        if not usable:
            continue
        out = draw(st.sampled_from(usable))
        grad_name = "grad" if len(differentiable) == 1 and draw(st.booleans()) else "grad_" + out.name
        grad = Node("var", value=grad_name, lo=-3.0, hi=3.0, shape=out.node.shape, tensor=True)
        factor = builder.expr(draw(st.integers(0, 2)), shape, exact=False)
        result.append((decl.name, binop("*", grad, factor)))
    return tuple(result)


IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
