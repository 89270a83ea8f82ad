"""Formula parser: formula text -> SymPy expression, through an explicit whitelist.

Receives a `Formula` and a `Scope` (what each name means); returns a SymPy expression.
The text is parsed with Python's `ast` (opgen.formula.syntax) and only the nodes and the
functions of the spec format (section 3, opgen.formula.vocabulary) are turned into SymPy
objects; anything else is a located error. Spec text is never `eval`-ed, `sympify`-ed or
passed to `parse_expr`.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from dataclasses import dataclass

import sympy
from sympy import Expr, S

from opgen import limits
from opgen.errors import Loc, SpecError
from opgen.formula import functions as fn
from opgen.formula import hints, slicing, tensor, written
from opgen.formula.syntax import BAD_DIMS, int_literal, node_loc, parse_ast, reduction_dims, short
from opgen.formula.vocabulary import (
    ALL_FUNCTIONS,
    BOOL,
    CONSTANTS,
    FUNCTIONS,
    MAX_POLYGAMMA,
    NUM,
    REDUCTIONS,
    SPECIAL_FUNCTIONS,
    Value,
    polygamma_of_number,
)
from opgen.nodes import concat, diagonal, index, scan
from opgen.nodes.integer_parts import REMAINDERS, remainder
from opgen.spec.model import Formula
from opgen.spec.parse_common import plausible


@dataclass(frozen=True)
class Scope:
    """What each name of a formula means: a SymPy symbol and whether it is a condition."""

    names: dict[str, Value]
    tensors: frozenset[sympy.Symbol]  # symbols that hold tensors (max/min tie rule)
    extra_hint: str = ""  # appended to the message for an unknown `grad...` name
    unavailable: tuple[tuple[str, str], ...] = ()  # names that cannot be used here, and why
    # The static shape of each tensor symbol (`opgen.formula.tensor`); None: shapes are not checked
    # yet and reduction dims stay as written (a first reading, only to order the formulas).
    shapes: dict[sympy.Symbol, tensor.Shape] | None = None
    # Names that hold a condition as 1/0: `bool` inputs, lets and outputs whose formula is a
    # condition (Note [named conditions]).
    conditions: frozenset[str] = frozenset()
    # The pieces a part of the formula broadcasts with as written (Note [shapes as written]); None: SymPy's.
    written: Callable[[ast.expr], written.Pieces] | None = None
    values: dict[sympy.Symbol, Expr] | None = None  # the lets read so far, in terms of the inputs
    inputs: tuple[sympy.Symbol, ...] = ()  # the Tensor inputs, in spec order (`eye(N)` takes one's dtype)


_COMPARE = {
    ast.Lt: sympy.StrictLessThan,
    ast.LtE: sympy.LessThan,
    ast.Gt: sympy.StrictGreaterThan,
    ast.GtE: sympy.GreaterThan,
    ast.Eq: sympy.Eq,
    ast.NotEq: sympy.Ne,
}


class _Reader:
    def __init__(self, formula: Formula, scope: Scope) -> None:
        self.formula = formula
        self.scope = scope

    def loc(self, node: ast.AST) -> Loc:
        return node_loc(self.formula, node)

    def fail(self, node: ast.AST, message: str) -> SpecError:
        return SpecError(self.loc(node), f"in `{self.formula.text}`: {message}")

    def shape(self, node: ast.AST, expr: sympy.Basic) -> tensor.Shape:
        """The shape of what `node` built; shapes that do not fit are an error at `node`."""
        if self.scope.shapes is None:
            return None
        try:
            return tensor.shape_of(expr, self.scope.shapes)
        except tensor.ShapeError as error:
            raise self.fail(node, str(error)) from None

    def narrowed(self, *operands: tuple[ast.expr, Expr]) -> tuple[tensor.Shape, ...]:
        """Each operand's shape, then each one's shape as written; () on a first reading."""
        if self.scope.shapes is None or self.scope.written is None:
            return ()
        own = [self.shape(node, expr) for node, expr in operands]
        return (*own, *(written.widened(s, self.scope.written, n) for s, (n, _) in zip(own, operands, strict=True)))

    def checked(self, node: ast.AST, value: Value) -> Value:
        self.shape(node, value.expr)
        expr = limits.evaluated(value.expr)
        value = value if expr is value.expr else Value(expr, value.kind)
        if limits.beyond_float64(expr):
            what = "the constant" if expr.is_number else "a number SymPy multiplies out of"
            raise self.fail(node, f"{what} `{short(ast.unparse(node))}` is outside float64 ({_SIZE_HINT})")
        if expr.is_number and (expr.has(S.NaN, S.ComplexInfinity) or expr.is_extended_real is False):
            # Formulas compute over the reals: SymPy would carry `sqrt(-1)` on as `I`, `log(0)` as `zoo`.
            what = "not a real number"
            if expr.has(S.ComplexInfinity, S.NaN):
                what = "undefined (a division by zero, log(0) or inf * 0)"
            text = short(ast.unparse(node))
            raise self.fail(node, f"the constant `{text}` is {what}; formulas compute over the reals")
        return value

    def number(self, node: ast.expr) -> Expr:
        value = self.read(node)
        if value.kind == BOOL:
            return fn.indicator(value.expr)  # a condition used as a number is 1 or 0
        return value.expr

    def condition(self, node: ast.expr, what: str) -> sympy.Basic:
        value = self.read(node)
        if value.kind == BOOL:
            return value.expr
        if isinstance(node, ast.Name) and node.id in self.scope.conditions:
            # Note [named conditions]: `flag == true`, as that would read.
            return sympy.Eq(value.expr, S.One, evaluate=False)
        hint = ""
        if isinstance(node, ast.Name) and node.id in self.scope.names:
            hint = f" ('{node.id}' holds a number; a `bool` input or a let that is a condition can stand here)"
        raise self.fail(node, f"{what} must be a condition such as `x > 0`, not a number{hint}")

    def read(self, node: ast.expr) -> Value:
        method = getattr(self, "read_" + type(node).__name__, None)
        if method is None:
            raise self.fail(node, f"{hints.describe(node)} is not allowed in a formula")
        return method(node)

    def read_Constant(self, node: ast.Constant) -> Value:  # noqa: N802
        value = node.value
        if isinstance(value, bool):
            return Value(S.true if value else S.false, BOOL)
        if isinstance(value, int):
            return Value(sympy.Integer(value), NUM)
        if isinstance(value, float):
            if math.isinf(value):  # only a literal beyond float64 reads as inf: `inf` is a name
                raise self.fail(node, "this number is beyond float64's range (about 1.8e308); write `inf` for infinity")
            return Value(_float(value), NUM)
        raise self.fail(node, f"the constant {value!r} is not a number")

    def read_Name(self, node: ast.Name) -> Value:  # noqa: N802
        if node.id in self.scope.names:
            return self.scope.names[node.id]
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id in ALL_FUNCTIONS:
            raise self.fail(node, f"'{node.id}' is a function; call it as {node.id}(...)")
        why = dict(self.scope.unavailable).get(node.id)
        if why is not None:
            raise self.fail(node, why)
        close = plausible(node.id, sorted([*self.scope.names, *CONSTANTS]))
        hint = f"; did you mean '{close}'?" if close else ""
        if not close and node.id.startswith("grad"):
            hint = self.scope.extra_hint
        elif not close:
            hint = "; a formula can use the inputs, `let` names and outputs of its spec"
        raise self.fail(node, f"unknown name '{node.id}'{hint}")

    def read_UnaryOp(self, node: ast.UnaryOp) -> Value:  # noqa: N802
        if isinstance(node.op, ast.USub):
            return Value(-self.number(node.operand), NUM)
        if isinstance(node.op, ast.UAdd):
            return Value(self.number(node.operand), NUM)
        if isinstance(node.op, ast.Invert):
            return Value(sympy.Not(self.condition(node.operand, "the operand of `~`")), BOOL)
        raise self.fail(node, "`not` is not allowed; use `~` on a condition")

    def read_BinOp(self, node: ast.BinOp) -> Value:  # noqa: N802
        op = node.op
        if isinstance(op, (ast.BitAnd, ast.BitOr)):
            left = self.condition(node.left, "each side of `&` and `|`")
            right = self.condition(node.right, "each side of `&` and `|`")
            return Value(sympy.And(left, right) if isinstance(op, ast.BitAnd) else sympy.Or(left, right), BOOL)
        a, b = self.number(node.left), self.number(node.right)
        if isinstance(op, ast.BitXor):
            raise self.fail(node, hints.power(node, self.formula.text))
        if isinstance(op, ast.MatMult):
            # Note [products along a constant inner dimension] in opgen.formula.written
            narrow = self.narrowed((node.left, a), (node.right, b))
            product = written.constant_matmul(a, b, narrow) if narrow else None
            return self.checked(node, Value(tensor.MatMul(a, b) if product is None else product, NUM))
        if isinstance(op, ast.Add):
            return self.checked(node, Value(a + b, NUM))
        if isinstance(op, ast.Sub):
            return self.checked(node, Value(a - b, NUM))
        if isinstance(op, ast.Mult):
            return self.checked(node, Value(a * b, NUM))
        if isinstance(op, ast.Div):
            if b == 0:
                raise self.fail(node, "division by the constant zero")
            return self.checked(node, Value(a / b, NUM))
        if isinstance(op, ast.Pow):
            bits = limits.power_bits(a, b) if a.is_number and b.is_number else 0.0
            if abs(bits) > limits.FLOAT64_BITS:
                text = f"`{short(ast.unparse(node))}` is about 2 ** {bits:.3g}"
                raise self.fail(node, f"the constant {text}, outside float64 ({_SIZE_HINT})")
            return self.checked(node, Value(a**b, NUM))
        if isinstance(op, ast.Mod):  # Note [integer parts] in opgen.nodes.integer_parts
            if b == 0:
                raise self.fail(node, "remainder by the constant zero")
            return self.checked(node, Value(remainder(a, b), NUM))
        raise self.fail(node, f"the operator {_OPERATOR_TEXT.get(type(op), type(op).__name__)} is not allowed")

    def read_Compare(self, node: ast.Compare) -> Value:  # noqa: N802
        parts = []
        left = self.number(node.left)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            relation = _COMPARE.get(type(op))
            if relation is None:
                raise self.fail(node, "only < <= > >= == != compare numbers")
            right = self.number(right_node)
            parts.append(relation(left, right, evaluate=False))
            left = right
        return Value(sympy.And(*parts) if len(parts) > 1 else parts[0], BOOL)

    def read_BoolOp(self, node: ast.BoolOp) -> Value:  # noqa: N802
        word = "and" if isinstance(node.op, ast.And) else "or"
        symbol = "&" if word == "and" else "|"
        raise self.fail(node, f"`{word}` is not allowed; combine conditions with `{symbol}` and parentheses")

    def read_Attribute(self, node: ast.Attribute) -> Value:  # noqa: N802
        if node.attr == "T":
            a = self.number(node.value)
            narrow = self.narrowed((node.value, a))  # Note [products along a constant inner dimension]
            flipped = written.constant_transpose(a, *narrow) if narrow else None
            return self.checked(node, Value(tensor.Transpose(a) if flipped is None else flipped, NUM))
        if constant := hints.qualified_constant(node):
            raise self.fail(node, constant)
        raise self.fail(node, f"attribute `.{node.attr}` is not allowed; only `.T` is")

    def read_Call(self, node: ast.Call) -> Value:  # noqa: N802
        if isinstance(node.func, ast.Attribute):
            raise self.fail(node, hints.qualified_call(node, set(self.scope.names)))
        if not isinstance(node.func, ast.Name):
            raise self.fail(node, "only the functions of the formula language can be called")
        name = node.func.id
        if name in self.scope.names and name not in ALL_FUNCTIONS:  # called, a name is the function: `var: var(x)`
            raise self.fail(node, f"'{name}' is an input or intermediate, not a function")
        if name in REDUCTIONS:
            return self.read_reduction(node, name)
        if name == "unsqueeze":
            return self.read_unsqueeze(node)
        if name in ("cat", "stack"):
            return self.read_joined(node, name)
        if name == "eye":
            return self.read_eye(node)
        if name in diagonal.DIAGONALS:
            return self.read_diagonal(node, name)
        if name in scan.SCANS:
            return self.read_scan(node, name)
        if name == scan.PRODUCT:
            return self.read_prod(node)
        if name == "chunk":
            raise self.fail(node, "chunk() gives several parts; pick one with [i], e.g. chunk(x, 2, dim=-1)[0]")
        if name not in FUNCTIONS and name not in SPECIAL_FUNCTIONS:
            raise self.fail(node, f"unknown function '{name}'{hints.unknown_function(name, node.args)}")
        if name in ("max", "min") and (node.keywords or len(node.args) == 1):
            along = "amax(x, dim=-1)" if name == "max" else "-amax(-x, dim=-1)"
            raise self.fail(
                node, f"{name}(a, b) is the elementwise {name} of two values; along a dimension write {along}"
            )
        if node.keywords:
            raise self.fail(node, f"{name}() takes no keyword arguments")
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise self.fail(node, "`*` arguments are not allowed")
        if name == "where":
            self._arity(node, name, 3)
            cond = self.condition(node.args[0], "the first argument of where()")
            return self.checked(node, Value(fn.where(cond, self.number(node.args[1]), self.number(node.args[2])), NUM))
        if name == "polygamma":
            return self.read_polygamma(node)
        if name in ("max", "min"):
            self._arity(node, name, 2)
            a, b = self.number(node.args[0]), self.number(node.args[1])
            self.shape(node, a + b)
            both = int(all(self._holds_tensor(arg) for arg in node.args))
            cls = fn.maximum if name == "max" else fn.minimum
            if a.is_number and b.is_number:
                return Value(sympy.Max(a, b) if name == "max" else sympy.Min(a, b), NUM)
            return Value(cls(a, b, sympy.Integer(both)), NUM)
        arity, build = FUNCTIONS[name]
        self._arity(node, name, arity)
        args = [self.number(a) for a in node.args]
        if name in REMAINDERS and args[1] == 0:
            raise self.fail(node, f"{name}() by the constant zero")
        return self.checked(node, Value(build(*args), NUM))

    def read_polygamma(self, node: ast.Call) -> Value:
        """`polygamma(n, x)`: the n-th derivative of digamma, `n` a whole-number literal (torch.polygamma's `int n`)."""
        self._arity(node, "polygamma", 2)
        order = node.args[0]
        if not (isinstance(order, ast.Constant) and type(order.value) is int and 0 <= order.value <= MAX_POLYGAMMA):
            raise self.fail(
                order,
                f"the order of polygamma(n, x) must be a whole-number literal from 0 to {MAX_POLYGAMMA}, "
                f"not `{short(ast.unparse(order))}`; polygamma(0, x) is digamma(x), polygamma(1, x) trigamma",
            )
        x = self.number(node.args[1])
        built = polygamma_of_number(order.value, x)
        return self.checked(node, Value(built, NUM))

    def _holds_tensor(self, node: ast.expr) -> bool:
        """The formula text names a tensor (Note [tensor-valued lets])."""
        names = (n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in self.scope.names)
        return any(self.scope.names[n].expr in self.scope.tensors for n in names)

    def read_reduction(self, node: ast.Call, name: str) -> Value:
        """`sum(x, dim=-1, keepdim=true)`: `dim` one whole number, a tuple of them, or left out (every
        dimension); keepdim defaults to false; `var` and `std` also take `correction=` (default 1)."""
        allowed = ("dim", "keepdim", "correction") if name in ("var", "std") else ("dim", "keepdim")
        if len(node.args) != 1:
            keywords = " and ".join(f"`{k}=`" for k in allowed)
            raise self.fail(node, f"{name}() takes one tensor argument and {keywords}, got {len(node.args)} arguments")
        options = {}
        for kw in node.keywords:
            if kw.arg not in allowed:
                words = ", ".join(f"`{k}`" for k in allowed)
                unbiased = kw.arg == "unbiased" and name in ("var", "std")
                hint = "; write correction=0 for unbiased=false" if unbiased else ""
                raise self.fail(node, f"{name}() takes the keywords {words}, not `{kw.arg}`{hint}")
            options[kw.arg] = kw.value
        dims = reduction_dims(options.get("dim"))
        if dims is BAD_DIMS:
            raise self.fail(options["dim"], f"`dim` of {name}() must be a whole number such as -1, or a tuple (-2, -1)")
        if name == "logsumexp" and dims is None:
            raise self.fail(node, f"{name}() needs `dim=`, e.g. {name}(x, dim=-1)")
        keepdim = False
        if "keepdim" in options:
            flag = self.read(options["keepdim"])
            if flag.expr not in (S.true, S.false):
                raise self.fail(options["keepdim"], f"`keepdim` of {name}() must be true or false")
            keepdim = flag.expr is S.true
        correction = int_literal(options["correction"]) if "correction" in options else 1
        if correction is None or not 0 <= correction < 2**63:  # torch takes an int64
            raise self.fail(options["correction"], f"`correction` of {name}() must be a whole number >= 0, e.g. 0 or 1")
        operand = self.number(node.args[0])
        found: tuple[int, ...] = () if dims is None else dims  # type: ignore[assignment]
        kind = "var" if name == "std" else name
        if self.scope.shapes is not None:
            shape = self.shape(node.args[0], operand)
            full = written.widened(shape, self.scope.written, node.args[0])
            # Note [numbers and tensors]; over plain Tensors (None), Note [reductions of a number].
            if not operand.free_symbols & self.scope.tensors and full == ():
                text = short(ast.unparse(node.args[0]))
                what = f"the number {operand} once simplified" if operand.is_number else "a number"
                raise self.fail(node, f"{name}() of `{text}`, {what}: a reduction takes a tensor; use the number")
            try:
                found = tensor.reduce_dims(full, dims, keepdim, f"{name}()")  # type: ignore[arg-type]
                if name in ("mean", "var", "std") and found:  # they divide by how many entries they reduce
                    tensor.dims_count(full, found, f"{name}()")
                operand, shape = written.number_or_operand(operand, shape, full, self.scope)
                if full is not None and full != shape:  # Note [reductions of constant dimensions]
                    how, batch = (found, keepdim, correction), written.batch_names(self.scope.written, node.args[0])
                    reduced = written.constant_reduction(kind, operand, (shape, full), how, batch)
                    return self.checked(node, Value(fn.std_of(reduced) if name == "std" else reduced, NUM))
            except tensor.ShapeError as error:
                raise self.fail(node, str(error)) from None
        try:  # Note [reductions of a number] in opgen.formula.written
            reduced = written.reduce_or_number(kind, operand, (found, keepdim, correction), self.scope)
        except tensor.ShapeError as error:
            raise self.fail(node, f"{name}() of `{short(ast.unparse(node.args[0]))}`: {error}") from None
        return self.checked(node, Value(fn.std_of(reduced) if name == "std" else reduced, NUM))

    def read_unsqueeze(self, node: ast.Call) -> Value:
        """`unsqueeze(x, dim=-3)`: `x` with a new dimension of size 1 at `dim`, as torch.unsqueeze."""
        if len(node.args) != 1 or [kw.arg for kw in node.keywords] != ["dim"]:
            raise self.fail(node, "unsqueeze() takes one tensor argument and `dim=`, e.g. unsqueeze(x, dim=-3)")
        dim = int_literal(node.keywords[0].value)
        if dim is None:
            raise self.fail(node.keywords[0].value, "`dim` of unsqueeze() must be a whole number such as -1")
        operand = self.number(node.args[0])
        if self.scope.shapes is None:  # a first reading, only to order the formulas
            return Value(tensor.Unsqueeze(operand, sympy.Integer(dim)), NUM)
        try:
            dim = tensor.unsqueeze_dim(self.shape(node.args[0], operand), dim)
        except tensor.ShapeError as error:
            raise self.fail(node, str(error)) from None
        return self.checked(node, Value(tensor.Unsqueeze(operand, sympy.Integer(dim)), NUM))

    def read_joined(self, node: ast.Call, name: str) -> Value:
        """`cat([a, b, ...], dim=d)`: parts of one named dimension joined along it; `stack([a, b, ...], dim=d)`:
        pieces of one shape along a new dimension (Note [concatenation] in opgen.nodes.concat)."""
        listed = node.args[0] if len(node.args) == 1 else None
        keywords = [k.arg for k in node.keywords]
        if not isinstance(listed, (ast.List, ast.Tuple)) or not listed.elts or keywords not in ([], ["dim"]):
            raise self.fail(node, concat.USAGE.format(name=name))
        dim = int_literal(node.keywords[0].value) if node.keywords else 0
        if dim is None:
            raise self.fail(node.keywords[0].value, f"`dim` of {name}() must be a whole number such as -1")
        pieces = [self.number(element) for element in listed.elts]
        for element, piece in zip(listed.elts, pieces, strict=True):
            if not piece.free_symbols & self.scope.tensors:
                raise self.fail(element, f"{name}() joins tensors; `{short(ast.unparse(element))}` is a number")
        if self.scope.shapes is None:  # a first reading, only to order the formulas
            return Value(sympy.Add(*pieces), NUM)
        shapes = [self.shape(element, piece) for element, piece in zip(listed.elts, pieces, strict=True)]
        try:
            if name == "stack":
                place = concat.stack_shape(shapes, dim)[1]
                return self.checked(node, Value(concat.Stack(sympy.Integer(place), *pieces), NUM))
            _, cuts = concat.cat_cuts(shapes, dim)
        except tensor.ShapeError as error:
            raise self.fail(node, str(error)) from None
        return self.checked(node, Value(concat.Cat.of(pieces, cuts), NUM))

    def read_eye(self, node: ast.Call) -> Value:
        """`eye(N)`: the identity of the named dimension `N`, in the dtype and on the device of an input that has it."""
        arg = node.args[0] if len(node.args) == 1 and not node.keywords else None
        value = self.scope.names.get(arg.id) if isinstance(arg, ast.Name) else None
        if value is None or not tensor.is_dim_size(value.expr):
            dims = sorted(n for n, v in self.scope.names.items() if tensor.is_dim_size(v.expr))
            known = f" ({', '.join(dims)} here)" if dims else "; this spec declares none"
            raise self.fail(node, f"eye() takes one named dimension of a Tensor input, e.g. eye(D){known}")
        assert isinstance(arg, ast.Name)
        if self.scope.shapes is None:  # a first reading, only to order the formulas
            return Value(value.expr, NUM)
        like = next(s for s in self.scope.inputs if arg.id in (self.scope.shapes.get(s) or ()))
        return self.checked(node, Value(diagonal.Eye(like, value.expr), NUM))

    def read_diagonal(self, node: ast.Call, name: str) -> Value:
        """`diagonal(c)`, `diag_embed(v)`, `diag(x)` (Note [diagonals] in opgen.nodes.diagonal)."""
        if len(node.args) != 1 or node.keywords or isinstance(node.args[0], ast.Starred):
            example = "diagonal(c) of c: [..., N, N]" if name == "diagonal" else f"{name}(v) of v: [..., N]"
            raise self.fail(node, f"{name}() takes one tensor and no keywords, e.g. {example}")
        operand = self.number(node.args[0])
        if self.scope.shapes is None:  # a first reading, only to order the formulas
            return Value(diagonal.DiagEmbed(operand), NUM)
        try:
            cls = diagonal.node_for(name, self.shape(node.args[0], operand))
        except tensor.ShapeError as error:
            raise self.fail(node, str(error)) from None
        return self.checked(node, Value(cls(operand), NUM))

    def read_scan(self, node: ast.Call, name: str) -> Value:
        """`cumsum(x, dim)` or `cumsum(x, dim=-1)`, `dim` a whole-number literal (Note [scans] in opgen.nodes.scan)."""
        given = [*node.args[1:], *(kw.value for kw in node.keywords if kw.arg == "dim")]
        if len(node.args) not in (1, 2) or any(kw.arg != "dim" for kw in node.keywords) or len(given) != 1:
            raise self.fail(node, f"{name}() takes a tensor and one dim, e.g. {name}(x, dim=-1)")
        dim = int_literal(given[0])
        if dim is None:
            raise self.fail(given[0], f"the dim of {name}() must be a whole-number literal such as -1")
        operand = self.number(node.args[0])
        if self.scope.shapes is not None:  # else a first reading, only to order the formulas
            try:
                dim = scan.scan_dim(name, self.shape(node.args[0], operand), dim)
            except tensor.ShapeError as error:
                raise self.fail(given[0], str(error)) from None
        if name == "cumprod":
            return self.checked(node, Value(scan.Cumprod(operand, sympy.Integer(dim)), NUM))
        node_class = scan.LogCumsumExp if name == "logcumsumexp" else scan.Cumsum
        return self.checked(node, Value(node_class(operand, sympy.Integer(dim), S.Zero), NUM))

    def read_prod(self, node: ast.Call) -> Value:
        """`prod(x, dim=-1)` or `prod(x, -1, keepdim=true)`: one whole-number literal dim (Note [cumprod] in
        opgen.nodes.scan)."""
        given = [*node.args[1:2], *(kw.value for kw in node.keywords if kw.arg == "dim")]
        keep = [kw.value for kw in node.keywords if kw.arg == "keepdim"]
        other = any(kw.arg not in ("dim", "keepdim") for kw in node.keywords)
        if len(node.args) not in (1, 2) or other or len(given) != 1 or len(keep) > 1:
            raise self.fail(node, "prod() takes a tensor, one dim and `keepdim=`, e.g. prod(x, dim=-1)")
        dim = int_literal(given[0])
        if dim is None:
            raise self.fail(given[0], "the dim of prod() must be a whole-number literal such as -1")
        keepdim = self.read(keep[0]).expr if keep else S.false
        if keepdim not in (S.true, S.false):
            raise self.fail(keep[0], "`keepdim` of prod() must be true or false")
        operand = self.number(node.args[0])
        if self.scope.shapes is not None:  # else a first reading, only to order the formulas
            try:
                dim = scan.scan_dim("prod", self.shape(node.args[0], operand), dim)
            except tensor.ShapeError as error:
                raise self.fail(given[0], str(error)) from None
        flag = S.One if keepdim is S.true else S.Zero
        return self.checked(node, Value(scan.Prod(operand, sympy.Integer(dim), flag), NUM))

    def read_Subscript(self, node: ast.Subscript) -> Value:  # noqa: N802
        """`x[..., :D // 2]` and `chunk(x, 2, dim=-1)[1]`: a part of a named dimension (opgen.formula.slicing)."""
        value = node.value
        called = value.func.id if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) else ""
        chunk = value if isinstance(value, ast.Call) and called == "chunk" and called not in self.scope.names else None
        if chunk is not None and not chunk.args:
            return self.read(chunk)  # the call's own error
        operand_node = chunk.args[0] if chunk is not None else value
        operand = self.number(operand_node)
        if self.scope.shapes is None:  # a first reading, only to order the formulas
            return Value(operand, NUM)
        shape = self.shape(operand_node, operand)
        dims = frozenset(n for n, v in self.scope.names.items() if tensor.is_dim_size(v.expr))
        try:  # `b[..., 0]` of a literal size (Note [integer indexing] in opgen.nodes.index)
            picked = index.pick_dim(node, shape) if chunk is None else None
        except tensor.ShapeError as error:
            raise self.fail(node, str(error)) from None
        if picked is not None:
            return self.checked(node, Value(index.Pick(operand, *(sympy.Integer(n) for n in picked[:2])), NUM))
        try:
            cut = slicing.chunk_cut(chunk, node.slice, shape) if chunk else slicing.index_cut(node, shape, dims)
        except slicing.CutError as error:
            raise self.fail(error.node, str(error)) from None
        return self.checked(node, Value(slicing.make(slicing.Slice, operand, cut), NUM))

    def _arity(self, node: ast.Call, name: str, count: int) -> None:
        if len(node.args) != count:
            plural = "s" if count != 1 else ""
            raise self.fail(node, f"{name}() takes {count} argument{plural}, got {len(node.args)}")


_SIZE_HINT = "the 'constant size' limit: numbers below 2 ** 1024, about 1.8e308"
_OPERATOR_TEXT = {ast.FloorDiv: "`//`", ast.LShift: "`<<`", ast.RShift: "`>>`", ast.BitXor: "`^`"}


def _float(value: float) -> Expr:
    """A spec's float literal, kept exact when it is a short decimal (0.5 -> 1/2)."""
    return sympy.Rational(repr(value)) if len(repr(value)) <= 12 else sympy.Float(value, 17)


def read_formula(formula: Formula, scope: Scope, want: str = NUM) -> sympy.Basic:
    """Turn formula text into SymPy; a condition where a number is wanted becomes 1/0."""
    reader = _Reader(formula, scope)
    node = parse_ast(formula)
    if want == NUM:
        return reader.number(node)
    return reader.read(node).expr
