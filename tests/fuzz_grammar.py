"""Random formula trees over the whole formula language, kept inside their domains.

`Builder` draws `fuzz_ast.Node` trees with Hypothesis: numbers, `pi`, `inf`, the inputs of
every type, lets, outputs, named dimensions used as numbers, `+ - * / **`, unary minus,
comparisons (also chained) with `& | ~`, conditions used as numbers, `where`, `max`,
`min`, `clamp`, `heaviside`, every function of spec-format section 3, reductions with
`dim`/`keepdim`, `@` and `.T`, and the newer forms of `fuzz_newforms` (PyTorch's names of
functions, whole and multi-dim reductions, var/std/norm, softmax, parts of a dimension). Each
node carries a bound on its values (`fuzz_intervals`); an argument that could leave a function's
safe domain is wrapped in a random squashing formula (`within`), so every drawn formula is finite with finite
derivatives on its inputs' domains, and an op that disagrees with plain autograd there is
wrong. With `target` shapes (named dimensions) the tree is shape-correct by construction.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import fuzz_combos
import fuzz_newforms
from fuzz_ast import Node, Shape
from fuzz_intervals import SAFE_ARG, Interval, within
from fuzz_nodes import _broadcast, binop, call, const, fits, make, num
from hypothesis import strategies as st

__all__ = ["Builder", "_broadcast", "binop", "call", "const", "fits", "make", "num"]

CAP = 1e4  # every node's values stay within +-CAP
FREE_FUNCTIONS = ("sin", "cos", "tanh", "atan", "asinh", "sigmoid", "softplus", "erf", "erfc", "abs")
STEP_FUNCTIONS = ("sign", "floor", "ceil", "round", "heaviside")
DOMAIN_FUNCTIONS = tuple(SAFE_ARG)
NUMBERS = (0.5, 1, 2, 3, 0.25, 1.5, 0.1, 10, 1e-3, 2.5, 0.75, 4, 7, 100, 0)


class Builder:
    """Draws formula trees. `leaves` are the names a formula may use, as `var` nodes with bounds and shapes."""

    def __init__(
        self,
        draw: Callable[[st.SearchStrategy[Any]], Any],
        leaves: list[Node],
        sizes: list[Node],
        batched: bool = False,
    ) -> None:
        self.draw = draw
        self.leaves = leaves
        self.sizes = sizes  # named dimensions as numbers (their sizes are 2..4)
        # Inputs `Tensor[..., A, B]`: reductions count from the end and keep their dimension, so that
        # every tensor keeps the batch dimensions in front of two named ones.
        self.batched = batched
        self.cuts: dict[str, tuple[int, ...]] = {}  # named dimension -> the part counts its size divides into

    def pick(self, options: list[Any] | tuple[Any, ...]) -> Any:
        return self.draw(st.sampled_from(options))

    def chance(self, p: float) -> bool:
        return bool(self.draw(st.integers(0, 99)) < p * 100)

    # ---- keeping values in range -------------------------------------------------------

    def within(self, u: Node, box: Interval) -> Node:
        """`u`, or a random formula of `u` whose values lie in `box` when `u`'s might not."""
        if within((u.lo, u.hi), box):
            return u
        lo, hi = box
        u = self.capped(u)
        forms: list[Callable[[], Node]]
        if hi == math.inf:
            base = lo + 0.05 if lo > 0 else 0.05
            forms = [
                lambda: binop("+", num(round(base + 1, 3)), binop("**", u, num(2))),
                lambda: binop("+", num(round(base, 3)), binop("*", num(0.5), call("exp", call("tanh", u)))),
                lambda: binop("+", call("softplus", u), num(round(base + 0.5, 3))),
                lambda: binop("+", call("abs", u), num(round(base + 0.5, 3))),
                lambda: binop("+", call("sigmoid", u), num(round(base + 0.1, 3))),
                lambda: binop("+", num(round(base, 3)), call("cosh", call("sin", u))),
                lambda: binop("-", u, num(round(lo - 1, 3))),  # a shift, when u is bounded below
            ]
        else:
            mid, half = round((lo + hi) / 2, 3), round((hi - lo) / 2 * 0.9, 3)
            squashed: list[Callable[[], Node]] = [
                lambda: binop("*", num(half), call("tanh", u)),
                lambda: binop("*", num(half), call("sin", u)),
                lambda: binop("*", num(half), call("erf", u)),
                lambda: binop("*", num(half), binop("/", u, binop("+", num(1), call("abs", u)))),
                lambda: call("clamp", u, num(-half), num(half)),
            ]
            forms = [(lambda f=f: binop("+", f(), num(mid)) if mid else f()) for f in squashed]
        wrapped: Node = self.pick(forms)()
        if not within((wrapped.lo, wrapped.hi), box):  # the bounds do not prove this one: the safe form
            wrapped = forms[0]()
        assert within((wrapped.lo, wrapped.hi), box), (wrapped, box)
        return wrapped

    def squash(self, u: Node) -> Node:
        forms: list[Callable[[], Node]] = [
            lambda: call("tanh", u),
            lambda: call("atan", u),
            lambda: binop("/", u, binop("+", num(1), call("abs", u))),
            lambda: call("clamp", u, num(-10), num(10)),
            lambda: call("erf", u),
        ]
        if max(-u.lo, u.hi) <= 1e6:  # sin of a huge value is all rounding (sin(expm1(27))): not for those
            forms.append(lambda: call("sin", u))
        return self.pick(forms)()  # type: ignore[no-any-return]

    def capped(self, node: Node) -> Node:
        return node if -CAP <= node.lo and node.hi <= CAP else self.squash(node)

    # ---- leaves ----------------------------------------------------------------------

    def number(self) -> Node:
        if self.chance(0.05):
            return const("pi")
        value = self.pick(NUMBERS)
        return num(-value if self.chance(0.3) else value)

    def leaf(self, target: Shape, exact: bool) -> Node:
        options = [n for n in self.leaves if fits(n.shape, target, exact)]
        scalar_ok = fits((), target, exact)
        if scalar_ok:
            options += self.sizes
        if options and (not scalar_ok or self.chance(0.75)):
            return self.pick(options)  # type: ignore[no-any-return]
        if not scalar_ok:
            raise _NoWay()
        return self.number()

    # ---- numeric formulas ------------------------------------------------------------

    def expr(self, depth: int, target: Shape = None, exact: bool = False) -> Node:
        """A numeric formula whose shape fits `target` (exactly, or by broadcasting)."""
        if depth <= 0 or self.chance(0.2):
            try:
                return self.leaf(target, exact)
            except _NoWay:
                return self.shaped(depth, target, exact)  # type: ignore[arg-type]
        kinds = ["unary", "unary", "domain", "binary", "binary", "binary", "pow", "where", "extremum"]
        kinds += ["clamp", "step", "atan2", "indicator"] + (["tensor", "tensor"] if target is not None else [])
        kinds += ["alias", "alias"] + (["whole"] if fits((), target, exact) else [])
        kinds += ["softmax", "normalized"] if target else []
        kinds += ["stable", "stable", "pclamp"]
        kind = self.pick(kinds)
        if kind == "tensor":
            return self.capped(self.shaped(depth - 1, target, exact))  # type: ignore[arg-type]
        if kind in ("alias", "whole", "softmax", "stable", "pclamp", "normalized"):
            return self.capped(self._newer(kind, depth - 1, target, exact))
        return self.capped(getattr(self, "_" + kind)(depth - 1, target, exact))

    def _newer(self, kind: str, depth: int, target: Shape, exact: bool) -> Node:
        if kind == "stable":
            return fuzz_combos.stable(self, depth, target, exact)
        if kind == "pclamp":
            return fuzz_combos.bounded_clamp(self, depth, target, exact)
        if kind == "normalized":
            return fuzz_combos.normalized(self, depth, target) or self.expr(depth, target, exact)
        if kind == "alias":
            return fuzz_newforms.alias(self, depth, target, exact)
        if kind == "whole":
            return fuzz_newforms.whole(self, depth)
        return fuzz_newforms.softmax(self, depth, target)  # type: ignore[arg-type]

    def _unary(self, depth: int, target: Shape, exact: bool) -> Node:
        u = self.expr(depth, target, exact)
        if self.chance(0.3):
            return make("neg", (u,))
        return call(self.pick(FREE_FUNCTIONS), u)

    def _domain(self, depth: int, target: Shape, exact: bool) -> Node:
        name = self.pick(DOMAIN_FUNCTIONS)
        return call(name, self.within(self.expr(depth, target, exact), SAFE_ARG[name]))

    def _step(self, depth: int, target: Shape, exact: bool) -> Node:
        return call(self.pick(STEP_FUNCTIONS), self.expr(depth, target, exact))

    def _sides(self, depth: int, target: Shape, exact: bool) -> tuple[Node, Node]:
        a = self.expr(depth, target, exact)
        b = self.expr(depth, target, False)
        return (a, b) if self.chance(0.5) else (b, a)

    def _binary(self, depth: int, target: Shape, exact: bool) -> Node:
        a, b = self._sides(depth, target, exact)
        op = self.pick(["+", "-", "*", "/"])
        if op == "/":
            b = self.within(b, (0.2, math.inf))
            if self.chance(0.3):
                b = make("neg", (b,))
        return binop(op, a, b)

    def _pow(self, depth: int, target: Shape, exact: bool) -> Node:
        base = self.expr(depth, target, exact)
        exponent = self.pick([2, 3, -1, -2, 0.5, 1.5, "int", "tensor", "base"])
        ints = [n for n in self.leaves if n.shape in ((), None) and not n.tensor and n.lo == n.hi and n.lo in (1, 2, 3)]
        if exponent == "int" and ints:
            return binop("**", self.within(base, (-30.0, 30.0)), self.pick(ints))
        if exponent == "base":  # a positive number to a formula's power
            return binop("**", num(self.pick([2, 0.5, 3])), self.within(base, (-20.0, 20.0)))
        if exponent in ("tensor", "int"):
            power_of = self.within(self.expr(depth, target, False), (-3.0, 3.0))
            return binop("**", self.within(base, (0.1, 50.0)), power_of)
        if exponent < 0 or not float(exponent).is_integer():
            base = self.within(base, (0.1, math.inf))
        else:
            base = self.within(base, (-100.0, 100.0))
        return binop("**", base, num(exponent))

    def condition(self, depth: int, target: Shape) -> Node:
        kind = self.pick(["cmp", "cmp", "cmp", "chain", "and", "or", "not", "literal"])
        if kind in ("and", "or") and depth > 0:
            sides = (self.condition(depth - 1, target), self.condition(depth - 1, target))
            return make("bin", sides, "&" if kind == "and" else "|")
        if kind == "not" and depth > 0:
            return make("not", (self.condition(depth - 1, target),))
        if kind == "literal":
            return const(self.pick(["true", "false", "True", "False"]))
        count = 3 if kind == "chain" else 2
        sides = tuple(self.expr(max(depth - 1, 0), target) for _ in range(count))
        ops = tuple(self.pick(["<", "<=", ">", ">=", "==", "!="]) for _ in range(count - 1))
        return make("cmp", sides, ops)

    def _where(self, depth: int, target: Shape, exact: bool) -> Node:
        a, b = self._sides(depth, target, exact)
        return call("where", self.condition(depth, target), a, b)

    def _indicator(self, depth: int, target: Shape, exact: bool) -> Node:
        cond = make("ind", (self.condition(depth, target),))
        return binop(self.pick(["*", "+", "-"]), cond, self.expr(depth, target, exact))

    def _extremum(self, depth: int, target: Shape, exact: bool) -> Node:
        a, b = self._sides(depth, target, exact)
        if self.chance(0.25):  # ties that hold on whole regions: max(min(s, a), min(s, b)), max(a, a)
            shared = self.leaf(target, False) if self.chance(0.5) else self.expr(depth, target, False)
            if self.chance(0.3):
                return call(self.pick(["max", "min"]), a, a)
            inner = self.pick(["max", "min"])
            return call(self.pick(["max", "min"]), call(inner, shared, a), call(inner, b, shared))
        if self.chance(0.15):  # against an infinite bound
            if self.chance(0.5):
                return call("max", a, make("neg", (const("inf"),)))
            return call("min", const("inf"), a)
        return call(self.pick(["max", "min"]), a, b)

    def _clamp(self, depth: int, target: Shape, exact: bool) -> Node:
        x = self.expr(depth, target, exact)
        lo, hi = sorted([self.pick([-2, -1, -0.5, 0, 0.5, 1]), self.pick([-1, 0, 0.5, 1, 2, 3])])
        low: Node = num(lo)
        if self.chance(0.2):
            low = make("neg", (const("inf"),))
        return call("clamp", x, low, num(hi if hi > lo else lo + 1))

    def _atan2(self, depth: int, target: Shape, exact: bool) -> Node:
        a, b = self._sides(depth, target, exact)
        return call("atan2", a, self.within(b, (0.2, math.inf)))

    # ---- tensor formulas -------------------------------------------------------------

    def dims(self) -> list[str]:
        return sorted({d for n in self.leaves if n.shape for d in n.shape if d != "1"})

    def reachable(self) -> dict[tuple[str, ...], Callable[[], Node]]:
        """The exact shapes some tree of `@`, `.T` and reductions over the leaves has, each with one such tree."""
        found: dict[tuple[str, ...], Callable[[], Node]] = {}
        for n in self.leaves:
            if n.tensor and n.shape is not None and "1" not in n.shape and n.shape not in found:
                found[n.shape] = lambda n=n: n
        for _ in range(3):
            for shape, build in list(found.items()):
                options: list[tuple[tuple[str, ...], Callable[[], Node]]] = []
                if len(shape) == 2:
                    options.append((shape[::-1], lambda b=build: make("T", (b(),))))
                    for other, build2 in list(found.items()):
                        if len(other) == 2 and other[0] == shape[1]:
                            options.append(((shape[0], other[1]), lambda b=build, c=build2: binop("@", b(), c())))
                for axis in range(len(shape) if not self.batched else 0):
                    rest = shape[:axis] + shape[axis + 1 :]
                    options.append((rest, lambda b=build, a=axis: make("reduce", (b(),), ("sum", a, None))))
                for new, make_it in options:
                    found.setdefault(new, make_it)
        return found

    def shaped(self, depth: int, target: tuple[str, ...], exact: bool) -> Node:
        """`@`, `.T` or a reduction producing `target` (or, not `exact`, a keepdim shape that broadcasts to it)."""
        known = self.reachable()
        if depth <= 0:
            if target not in known:
                raise AssertionError(f"no tree has the shape {target}")
            return known[target]()
        rank, dims = len(target), self.dims()
        options: list[tuple[str, Any]] = []
        if rank == 2:
            options += [("matmul", d) for d in dims if target[:1] + (d,) in known and (d,) + target[1:] in known]
            options += [("transpose", None)] if target[::-1] in known else []
        for axis in range(rank + 1 if not self.batched else 0):
            for d in dims:
                if rank <= 1 and target[:axis] + (d,) + target[axis:] in known:
                    options.append(("reduce", (axis, d)))
        if rank == 0 and not self.batched:
            options += [("reduce2", s) for s in known if len(s) == 2]
        if not exact:
            for axis in range(rank):
                for d in dims:
                    if target[:axis] + (d,) + target[axis + 1 :] in known:
                        options.append(("keepdim", (axis, d)))
        if not options:
            return self.shaped(0, target, exact)
        kind, arg = self.pick(options)
        if kind == "matmul":
            return binop("@", self.sub(depth, target[:1] + (arg,)), self.sub(depth, (arg,) + target[1:]))
        if kind == "transpose":
            return make("T", (self.sub(depth, target[::-1]),))
        if kind == "reduce2":
            return fuzz_newforms.reduce_two(self, depth, arg)
        axis, d = arg
        keep = kind == "keepdim"
        full = target[:axis] + (d,) + (target[axis + 1 :] if keep else target[axis:])
        keepdim = True if keep else self.pick([None, False])
        return fuzz_newforms.reduction(self, self.sub(depth, full), axis, keepdim)

    def sub(self, depth: int, target: tuple[str, ...]) -> Node:
        return self.expr(depth - 1, target, exact=True)


class _NoWay(Exception):
    """No leaf of the wanted shape exists; the caller builds one from `@`, `.T` or a reduction."""
