"""The torch printer: SymPy expressions -> Python source using torch.

`TorchPrinter` is a SymPy `CodePrinter` subclass: one `_print_<Class>` method or table
entry per function, and strict, so anything without a rule raises instead of printing
SymPy's own notation. It knows which symbols hold tensors (Note [numbers and tensors] in
`opgen.formula.kinds`): a function of tensors prints as `torch.f(...)`, a function of plain numbers
as `math.f(...)` (or a formula of `math` functions where `math` lacks it), a condition on
plain numbers as a Python conditional. The names it prints for `torch` and `math` are
chosen by the emitter so that no spec name can shadow them.
"""

from __future__ import annotations

from typing import Any

import sympy
from sympy import Expr, S
from sympy.core.mul import _keep_coeff
from sympy.printing.codeprinter import CodePrinter
from sympy.printing.precedence import PRECEDENCE, precedence

from opgen.emit.function_print import FunctionPrinting
from opgen.emit.number_print import NumberPrinting, common_factor, decimal, is_exact_constant, power
from opgen.emit.runtime_names import RuntimeNames
from opgen.emit.tensor_print import TensorPrinting
from opgen.formula import functions as fn
from opgen.formula.kinds import is_tensor_valued
from opgen.formula.tensor import ShapeError, shape_of
from opgen.spec.names import Namer
from opgen.spec.quote import float_literal

# SymPy class -> (torch function, math function or None: see `_number_function`)
_UNARY: dict[type, tuple[str, str | None]] = {
    sympy.exp: ("exp", "exp"),
    sympy.log: ("log", "log"),
    fn.log1p: ("log1p", "log1p"),
    fn.expm1: ("expm1", "expm1"),
    sympy.sin: ("sin", "sin"),
    sympy.cos: ("cos", "cos"),
    sympy.tan: ("tan", "tan"),
    sympy.asin: ("asin", "asin"),
    sympy.acos: ("acos", "acos"),
    sympy.atan: ("atan", "atan"),
    sympy.sinh: ("sinh", "sinh"),
    sympy.cosh: ("cosh", "cosh"),
    sympy.tanh: ("tanh", "tanh"),
    sympy.asinh: ("asinh", "asinh"),
    sympy.acosh: ("acosh", "acosh"),
    sympy.atanh: ("atanh", "atanh"),
    fn.sigmoid: ("sigmoid", None),
    sympy.erf: ("erf", "erf"),
    sympy.erfc: ("erfc", "erfc"),
    sympy.erfinv: ("erfinv", None),
    sympy.loggamma: ("lgamma", "lgamma"),
    sympy.Abs: ("abs", "fabs"),
    sympy.sign: ("sign", None),
    fn.sign: ("sign", None),
    fn.floor: ("floor", "floor"),
    fn.ceil: ("ceil", "ceil"),
    fn.round: ("round", None),
}


PREC_NEG = PRECEDENCE["Mul"] + 1  # an operand of unary minus: a power or an atom


class PrintError(Exception):
    """An expression the printer has no rule for."""


class TorchPrinter(NumberPrinting, FunctionPrinting, TensorPrinting, CodePrinter):
    """Every node prints through one dispatch, SymPy's: a node that brings its own spelling through its
    `_torch` method (`printmethod`, Note [nodes] in opgen/nodes/base.py), any other through the
    printer's `_print_<Class>` along the class's MRO.

    Settings (`_default_settings`): `no_grad` prints code autograd never records, where
    primitives may work in place (Note [forward in place] in opgen.emit.kernel_lines).
    """

    language = "Python"
    printmethod = "_torch"
    _default_settings = dict(
        CodePrinter._default_settings, strict=True, human=True, fully_qualified_modules=False, no_grad=False
    )

    def __init__(
        self,
        names: dict[sympy.Symbol, str],
        tensors: frozenset[sympy.Symbol],
        torch: str = "torch",
        math: str = "math",
        functional: str = "torch.nn.functional",
        settings: dict[str, Any] | None = None,
        runtime: RuntimeNames | None = None,
    ) -> None:
        super().__init__(settings)
        self.runtime = runtime if runtime is not None else RuntimeNames(Namer(set(names.values())))
        self.names = names
        self.tensors = tensors
        self.torch = torch
        self.math = math
        self.functional = functional
        self.tensor_shapes, self.masks = dict(self.tensor_shapes), dict[sympy.Basic, sympy.Basic]()

    def with_symbols(
        self, names: dict[sympy.Symbol, str], tensors: frozenset[sympy.Symbol], **settings: Any
    ) -> TorchPrinter:
        """This printer knowing more symbols (`tensors` of them hold tensors), with `settings` changed."""
        printer = TorchPrinter(
            self.names | names,
            self.tensors | tensors,
            torch=self.torch,
            math=self.math,
            functional=self.functional,
            settings={key: self._settings[key] for key in ("no_grad",)} | settings,
            runtime=self.runtime,
        )
        printer.tensor_shapes, printer.masks = dict(self.tensor_shapes), dict(self.masks)
        return printer

    # -- helpers ---------------------------------------------------------------------

    def is_tensor(self, expr: sympy.Basic) -> bool:
        return is_tensor_valued(expr, self.tensors)

    @property
    def no_grad(self) -> bool:
        return bool(self._settings["no_grad"])

    def untaken(self, *bases: str) -> list[str]:
        """A name from each of `bases`, all different, that no symbol this printer knows, nor torch or math, takes."""
        namer = Namer({*self.names.values(), self.torch, self.math})
        return [namer.fresh(base) for base in bases]

    def _dtype_source(self, expr: sympy.Basic) -> str:
        symbols = sorted(expr.xreplace(self.masks).free_symbols & self.tensors, key=lambda s: s.name)
        return self._print(symbols[0])

    def _call(self, name: str, *args: sympy.Basic) -> str:
        return f"{name}({', '.join(self._print(a) for a in args)})"

    def _print_not_supported(self, expr: Any) -> str:
        raise PrintError(f"cannot print {type(expr).__name__}: {expr}")

    def emptyPrinter(self, expr: Any) -> str:  # noqa: N802 - SymPy's name
        raise PrintError(f"cannot print {type(expr).__name__}: {expr}")

    # -- atoms -------------------------------------------------------------------------

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        try:
            return self.names[expr]
        except KeyError:
            raise PrintError(f"no name for symbol {expr}") from None

    def _print_BooleanTrue(self, expr: Expr) -> str:
        return "True"

    def _print_BooleanFalse(self, expr: Expr) -> str:
        return "False"

    def doprint_expr(self, expr: sympy.Basic) -> str:
        return str(self._print(expr))

    def _print(self, expr: Any, **kwargs: Any) -> str:
        if (
            isinstance(expr, Expr)
            and expr.is_number
            and not isinstance(expr, (sympy.Integer, sympy.Rational, sympy.Float, sympy.NumberSymbol))
            and not expr.has(S.Infinity, S.NegativeInfinity)
        ):
            if expr.is_Mul and any(isinstance(a, sympy.NumberSymbol) for a in expr.args) or not expr.is_Atom:
                return self._print_number(expr)
        return str(super()._print(expr, **kwargs))

    # -- arithmetic ------------------------------------------------------------------------

    def _print_Mul(self, expr: sympy.Mul) -> str:
        """Note [spacing]: `a * b / c`, spaced as `ruff format` writes Python (Black's rules)."""
        numeric = [a for a in expr.args if a.is_number]
        if numeric and len(numeric) < len(expr.args):
            coeff = sympy.Mul(*numeric)
            rest = sympy.Mul(*[a for a in expr.args if not a.is_number])
            sign = "-" if coeff.is_negative else ""
            coeff = -coeff if coeff.is_negative else coeff  # of unknown sign (`clamp(a, 0, 1)`): as it is
            # a product's precedence whatever its sign (SymPy ranks `-pi/4 * (x + y)` as a sum: unbracketed)
            body = self.parenthesize(rest, PRECEDENCE["Mul"], strict=True)
            if coeff == 1 and sign and (small := self._small_factor(rest)) is not None:
                others = self.parenthesize(rest / small, PRECEDENCE["Mul"], strict=True)
                return f"{self._negate(small)} * {others}"  # Note [negating the smallest factor]
            if coeff == 1:
                return self._negate(rest) if sign else body
            # torch takes Python ints as int64: a fraction of larger ones is its float (`1e-20 * x`)
            small = isinstance(coeff, sympy.Rational) and max(abs(coeff.p), coeff.q) < 2**53
            if isinstance(coeff, sympy.Rational) and not small:
                return f"{sign}{float_literal(float(coeff))} * {body}"
            if isinstance(coeff, sympy.Rational) and coeff.p == 1:
                return f"{self._negate(rest) if sign else body} / {coeff.q}"
            if isinstance(coeff, sympy.Rational) and len(self._print(coeff)) > 12:
                return f"{sign}{coeff.p} * {body} / {coeff.q}"
            if not coeff.is_Rational and not coeff.is_NumberSymbol and is_exact_constant(coeff):
                return f"{self._print_constant(-coeff if sign else coeff)} * {body}"  # Note [constants as written]
            text = self._print(coeff) if coeff.is_Rational or coeff.is_NumberSymbol else self._print_number(coeff)
            return f"{sign}{text} * {body}"
        return self._product(expr)

    def _small_factor(self, product: sympy.Basic) -> sympy.Basic | None:
        """Note [negating the smallest factor]
        ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
        `-(alpha * grad)` is a product then a negation, two passes over the tensor; `-alpha * grad`
        negates the number and makes one (PyTorch's own `neg` backward is the same product). A
        factor that is no tensor, or a tensor of one element where the product has more (a loss's
        incoming gradient over its count, `-(target * tmp0)`), or one that broadcasts along a dimension
        of the product (a row's gradient, `grad.unsqueeze(-1)`), takes the minus sign; otherwise the
        product is negated as before (negating either full-size factor is a pass as well)."""
        if not product.is_Mul or not self.is_tensor(product):
            return None
        # a divisor prints as one (`/ n**2`): negated it would be a power, `-(n**-2) * x`
        divisor = lambda f: f.is_Pow and f.exp.could_extract_minus_sign()  # noqa: E731
        factors = sorted(
            (f for f in product.args if not divisor(f)), key=lambda f: (not f.is_Atom, sympy.default_sort_key(f))
        )
        number = next((f for f in factors if not self.is_tensor(f)), None)
        if number is not None:
            return number
        try:
            whole = shape_of(product, self.tensor_shapes)
            shapes = [(f, shape_of(f, self.tensor_shapes)) for f in factors]
        except ShapeError:
            return None
        return next((f for f, shape in shapes if whole is not None and _smaller(shape, whole)), None)

    def _negate(self, expr: sympy.Basic) -> str:
        """`-expr`; a power in parentheses, `-(x**2)`, as ruff writes it (Note [spacing])."""
        text = self.parenthesize(expr, PREC_NEG)
        return f"-({text})" if self._prints_as_power(expr) else f"-{text}"

    def _prints_as_power(self, expr: sympy.Basic) -> bool:
        """Whether `expr` prints as `a**b` (not `sqrt`, `exp`, `math.pow` or a quotient)."""
        if not expr.is_Pow:
            return False
        base, exp = expr.args
        special = exp in (S.Half, -S.Half, S.NegativeOne) or base == S.Exp1
        return not special and (exp.is_Integer or self.is_tensor(expr))

    def _print_Add(self, expr: sympy.Add, order: Any = None) -> str:
        """`a - b - (c + d)`: SymPy's `StrPrinter._print_Add`, with `_negate`'s leading minus."""
        if (common := common_factor(expr, self.is_tensor)) is not None:  # Note [common factors]: `2 * (x - t)`
            return f"{self._print(common)} * ({self._print_Add(sympy.Add(*(t / common for t in expr.args)))})"
        prec = precedence(expr)
        text = ""
        for term in self._as_ordered_terms(expr, order=order):
            negative = term.could_extract_minus_sign()
            magnitude = -term if negative else term
            if not text:
                text = self.parenthesize(term, prec, strict=True)
            else:
                text += f" {'-' if negative else '+'} {self.parenthesize(magnitude, prec, strict=not negative)}"
        return text

    def _product(self, expr: sympy.Mul) -> str:
        """`a * b / (c * d)`: SymPy's `CodePrinter._print_Mul`, spaced."""
        prec = precedence(expr)
        c, e = expr.as_coeff_Mul()
        sign = ""
        if c < 0:
            expr, sign = _keep_coeff(-c, e), "-"
        numerator, denominator = [], []
        for item in expr.as_ordered_factors():
            if item.is_Pow and item.exp.is_Rational and item.exp.is_negative:
                denominator.append(sympy.Pow(item.base, -item.exp, evaluate=item.exp == -1))
            else:
                numerator.append(item)
        numerator = numerator or [S.One]
        if len(numerator) == 1 and sign:
            top = self._negate(numerator[0])
        else:
            top = sign + " * ".join(self.parenthesize(a, prec) for a in numerator)
        if not denominator:
            return top
        bottom = [self.parenthesize(b, prec) for b in denominator]
        return f"{top} / {bottom[0]}" if len(bottom) == 1 else f"{top} / ({' * '.join(bottom)})"

    def _print_Pow(self, expr: sympy.Pow, rational: bool = False) -> str:
        base, exp = expr.args
        if exp == S.Half:
            return self._unary("sqrt", "sqrt", base)
        if exp == -S.Half:
            if self.is_tensor(base):
                return f"{self.torch}.rsqrt({self._print(base)})"
            return f"1 / {self.math}.sqrt({self._print(base)})"
        if base == S.Exp1:
            return self._unary("exp", "exp", exp)
        if not self.is_tensor(expr) and not exp.is_Integer:
            # Python's `**` of a negative number and a fraction is complex; math.pow raises instead.
            return f"{self.math}.pow({self._print(base)}, {self._print(exp)})"
        prec = precedence(expr)
        if exp == -1:
            return f"1 / {self.parenthesize(base, prec)}"
        # A fraction as exponent is a quotient: `x**(1 / 3)`, never `x**1/3`.
        literal = exp.is_Integer or exp.is_Float or (exp.is_Rational and decimal(exp) is not None)
        exponent = self._print(exp) if literal else f"({self._print(exp)})"
        return power(self.parenthesize(base, prec), exponent)

    # -- functions ---------------------------------------------------------------------------

    def _unary(self, torch_name: str, math_name: str | None, arg: sympy.Basic) -> str:
        if self.is_tensor(arg):
            return f"{self.torch}.{torch_name}({self._print(arg)})"
        if math_name is None:
            return self._number_function(torch_name, arg)
        return f"{self.math}.{math_name}({self._print(arg)})"

    def _print_Function(self, expr: sympy.Basic) -> str:
        rule = _UNARY.get(type(expr))
        if rule is not None:
            return self._unary(*rule, expr.args[0])
        raise PrintError(f"no torch rule for {type(expr).__name__}")

    _print_exp = _print_log = _print_sin = _print_cos = _print_tan = _print_Function
    _print_asin = _print_acos = _print_atan = _print_sinh = _print_cosh = _print_Function
    _print_tanh = _print_asinh = _print_acosh = _print_atanh = _print_sign = _print_floor = _print_Function
    _print_erf = _print_erfc = _print_erfinv = _print_loggamma = _print_Abs = _print_ceil = _print_Function
    _print_round = _print_sigmoid = _print_log1p = _print_expm1 = _print_Function

    def _print_atan2(self, expr: sympy.atan2) -> str:
        y, x = expr.args
        if self.is_tensor(expr):
            if not self.is_tensor(y):
                return f"{self.torch}.atan2({self._as_tensor(y, x)}, {self._print(x)})"
            if not self.is_tensor(x):
                return f"{self.torch}.atan2({self._print(y)}, {self._as_tensor(x, y)})"
            return self._call(f"{self.torch}.atan2", y, x)
        return self._call(f"{self.math}.atan2", y, x)

    def _as_tensor(self, value: sympy.Basic, like: sympy.Basic) -> str:
        return f"{self._dtype_source(like)}.new_tensor({self._print(value)})"

    def _print_softplus(self, expr: fn.softplus) -> str:
        if not self.is_tensor(expr):
            return self._number_function("softplus", expr.args[0])
        return self._call(f"{self.functional}.softplus", expr.args[0])

    def _print_polygamma(self, expr: sympy.polygamma) -> str:
        order, arg = expr.args
        if self.is_tensor(order):
            raise PrintError("polygamma of a tensor order")
        if not self.is_tensor(arg):
            name = "digamma" if order == 0 else "polygamma"
            return self._number_function(name, *([arg] if order == 0 else expr.args))
        if order == 0:
            return self._call(f"{self.torch}.digamma", arg)
        return f"{self.torch}.polygamma({self._print(order)}, {self._print(arg)})"

    def _print_heaviside(self, expr: fn.heaviside) -> str:
        condition = sympy.GreaterThan(expr.args[0], 0)
        if condition in (S.true, S.false) and self.is_tensor(expr.args[0]):
            # SymPy knows the sign (`heaviside(softplus(x))`): still a tensor of the argument's shape.
            return f"{self.torch}.full_like({self._print(expr.args[0])}, {int(condition == S.true)})"
        return self._print(fn.indicator(condition))

    def _print_where(self, expr: fn.where) -> str:
        cond, a, b = expr.args
        if not self.is_tensor(expr):
            return f"({self._print(a)} if {self._print(cond)} else {self._print(b)})"
        if not self.is_tensor(cond):
            # Tensor branches under a number condition: the value broadcasts both, as torch.where.
            flag = f"{self._dtype_source(expr)}.new_tensor({self._print(cond)}, dtype={self.torch}.bool)"
            return f"{self.torch}.where({flag}, {self._print(a)}, {self._print(b)})"
        if a == 1 and b == 0:
            return f"({self._print(cond)}).to({self._dtype_source(cond)}.dtype)"
        if not self.is_tensor(a) and not self.is_tensor(b):
            # Two plain numbers would make a default-dtype tensor; take the dtype from the condition.
            return f"{self.torch}.where({self._print(cond)}, {self._as_tensor(a, cond)}, {self._print(b)})"
        return self._call(f"{self.torch}.where", cond, a, b)

    def _print_maximum(self, expr: fn.maximum) -> str:
        return self._extremum(expr, "maximum", ">")

    def _print_minimum(self, expr: fn.minimum) -> str:
        return self._extremum(expr, "minimum", "<")

    def _extremum(self, expr: sympy.Function, both: str, op: str) -> str:
        """Note [printed ties]: backward's own autograd (double backward) keeps the tie rule.

        Against a number the tie goes to the number (Note [kink conventions]): `torch.where(x > c,
        x, c)` (`relu` for 0), whose gradient is relu's, not `clamp_min`'s, which passes it; `min`
        the same with `<`. (`F.threshold(x, c, c)` is the same function, but the TorchScript-based
        ONNX exporter refuses a threshold other than 0.) A number that SymPy folded from a tensor
        (`0 * x`, flag 1) keeps `torch.maximum`'s split.
        """
        a, b, flag = expr.args
        ta, tb = self.is_tensor(a), self.is_tensor(b)
        if ta and tb:
            return self._call(f"{self.torch}.{both}", a, b)
        if not ta and not tb:
            pa, pb = self._print(a), self._print(b)
            return f"({pa} if {pa} {op} {pb} else {pb})"
        tensor, bound = (a, b) if ta else (b, a)
        if flag == 1:  # the number as a tensor of the formula's dtype (`(2.5 - x).new_tensor` needs parentheses)
            return f"{self.torch}.{both}({self._print(tensor)}, {self._as_tensor(bound, tensor)})"
        if bound == 0 and both == "maximum":
            return self._call(f"{self.torch}.relu", tensor)
        value, number = self._print(tensor), self._print(bound)
        condition = f"{self.parenthesize(tensor, PRECEDENCE['Relational'])} {op} {number}"
        return f"{self.torch}.where({condition}, {value}, {number})"

    def _print_clamp(self, expr: fn.clamp) -> str:
        x, lo, hi = expr.args
        if not self.is_tensor(expr):
            # min(max(x, lo), hi), as torch.clamp: `hi` wherever lo > hi.
            px, plo, phi = (self._print(a) for a in expr.args)
            return f"({phi} if {px} > {phi} or {plo} > {phi} else {plo} if {px} < {plo} else {px})"
        if not self.is_tensor(lo) and not self.is_tensor(hi):
            if hi == sympy.oo or lo == -sympy.oo:  # one bound: what ONNX's dynamo exporter decomposes
                side, bound = ("min", lo) if hi == sympy.oo else ("max", hi)
                return f"{self.torch}.clamp({self._print(x)}, {side}={self._print(bound)})"
            return self._call(f"{self.torch}.clamp", x, lo, hi)
        # torch.clamp takes its bounds both as numbers or both as tensors.
        args = [self._print(a) if self.is_tensor(a) else self._as_tensor(a, expr) for a in expr.args]
        if (lo.free_symbols | hi.free_symbols) & self.tensors - x.free_symbols:  # torch.clamp's backward fails
            return f"{self.torch}.clamp(*{self.torch}.broadcast_tensors({', '.join(args)}))"  # where x is smaller
        return f"{self.torch}.clamp({', '.join(args)})"

    # -- conditions ----------------------------------------------------------------------------

    def _print_Relational(self, expr: sympy.core.relational.Relational) -> str:
        op = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}[expr.rel_op]
        prec = precedence(expr)
        return f"{self.parenthesize(expr.lhs, prec)} {op} {self.parenthesize(expr.rhs, prec)}"

    def _print_And(self, expr: sympy.And) -> str:
        return self._logic(expr, "&", "and")

    def _print_Or(self, expr: sympy.Or) -> str:
        return self._logic(expr, "|", "or")

    def _logic(self, expr: sympy.Basic, tensor_op: str, python_op: str) -> str:
        args = sorted(expr.args, key=sympy.default_sort_key)
        if self.is_tensor(expr):
            return f" {tensor_op} ".join(f"({self._print(a)})" for a in args)
        return f" {python_op} ".join(f"({self._print(a)})" for a in args)

    def _print_Not(self, expr: sympy.Not) -> str:
        if self.is_tensor(expr):
            return f"~({self._print(expr.args[0])})"
        return f"not ({self._print(expr.args[0])})"


def _smaller(shape: tuple[sympy.Basic, ...] | None, whole: tuple[sympy.Basic, ...]) -> bool:
    """Whether a factor of `shape` broadcasts to `whole` along some dimension: fewer elements for certain."""
    if shape is None or len(shape) > len(whole):
        return False
    aligned = (1,) * (len(whole) - len(shape)) + tuple(shape)
    if any(d != 1 and d != w for d, w in zip(aligned, whole, strict=True)):
        return False
    return any(d == 1 and w != 1 for d, w in zip(aligned, whole, strict=True))
