"""Rewrite stage: SymPy formulas -> the same values, computed without overflow or cancellation.

Receives a SymPy expression (a forward formula, before it is differentiated, or a derived
gradient); returns an expression equal to it wherever the original is defined, built from
functions PyTorch evaluates stably: `log(1 + u)` becomes `log1p(u)`, `1 / (1 + exp(-u))`
becomes `sigmoid(u)`, and so on (Note [stable rewrites]). `derive` applies it to every formula
before differentiating, so the gradients come from the stable functions' own derivatives
(d softplus = sigmoid, never `exp(u) / (1 + exp(u))`), and again to every gradient.

Note [stable rewrites]
~~~~~~~~~~~~~~~~~~~~~~
Each rule is an exact identity over the reals (tests/test_rewrite.py checks every one at
50 significant digits, and its derivative too), never an approximation:

    log(1 + u)              -> log1p(u)
    exp(u) - 1              -> expm1(u)
    log(1 + exp(u))         -> softplus(u)
    (1 + exp(-u))**-k       -> sigmoid(u)**k
    exp(u) * sigmoid(-u)    -> sigmoid(u)              (exp(u) / (1 + exp(u)))
    log(1 / u)              -> -log(u)
    log(a * b**k)           -> log(a) + k log(b)       (a, b > 0; where log(a) or log(b) has a stable form)
    log(c * exp(u))         -> log(c) + u              (and log(c**u) -> u log(c): Note [logs of exponentials])
    log(sigmoid(u))         -> logsigmoid(u)
    log(1 - sigmoid(u))     -> logsigmoid(-u)          (1 - sigmoid(u) = sigmoid(-u): BCE's log(1 - p))
    log(cosh(u))            -> logcosh(u)              (|u| + softplus(-2|u|) - log 2, derivative tanh(u))
    u**a - 1                -> expm1(a log(u))         (u > 0 by its form: Note [powers less one])
    log(1 - exp(u))         -> log1mexp(u)             (log(-expm1(u)) or log1p(-exp(u)), as Mächler;
                                                        also log1p(-exp(u)) as written)
    r + c * sqrt(w)         -> where(r < 0, ...)       (the conjugate form where they cancel: Note
                                                        [conjugate form] in opgen/optimize/cancellation.py)
    -c * softplus(-u)       -> c * logsigmoid(u)       (c > 0)
    log(exp(a) + exp(b))    -> logaddexp(a, b)          (c exp(a) + c exp(b): log(c) + logaddexp(a, b),
                                                        c1 exp(a) + c2 exp(b): logaddexp(a + log c1, b + log c2),
                                                        c exp(u) + c exp(-u): log(2c) + logcosh(u), cosh written out;
                                                        a positive constant is c exp(0): log(c exp(u) + c) is
                                                        log(c) + softplus(u); 2**a is exp(a log 2))
    k (exp(a) - exp(b)) / (c exp(a) + c exp(b)) -> k/c tanh((a - b) / 2)   (exp(a) alone: sigmoid(a - b) / c;
    exp(u) (r + exp(v))     -> r exp(u) + exp(u + v)   Note [ratios of exponentials])
    sqrt(a**2 + b**2)       -> hypot(a, b)
    exp(v) erfc(u), log(erfc(u)), erfinv(2p - 1)  -> erfcx, log_ndtr, ndtri   (Note [normal distribution
                                                        functions] in opgen/nodes/special.py)
    log(u + sqrt(u**2 + 1)) -> asinh(u)                (and `- 1`: acosh(u); no u**2 to overflow)
    k N / (N + c)           -> k where(|N| > |c|, 1 - c / (N + c), N / (N + c))   (Note [shares of a sum])
    sin(a) / a * q          -> sinc(a / pi) * q        (sinc(t) = sin(pi t) / (pi t); undone in a gradient
                                                        where it buys nothing: Note [sinc that buys nothing])
    2 sin(u) cos(u) q       -> sin(2u) q
    u * log(u)              -> xlogy(u, u)             (0 at u = 0, the limit; unless u > 0; also
                                                        u log(u w) -> xlogy(u, u w); u**g log(u) is 0 at
                                                        u = 0, g >= 0: Note [powers at a zero base])
    q * where(c, 1, 0)      -> where(c, q, 0)           (Note [masked products])
    max(0, s) + min(0, f(s)) -> where(s > 0, s, f(s))  (f(0) = 0, f' > 0: Note [branches that join])
    u * sign(u)             -> abs(u)
    u**a * u**b             -> u**(a + b)              (Note [power rule] in opgen/derive/powers.py;
                                                        also with one base negated)
    where(c, u, s) == k     -> false (or true)          (both branches agree: Note
                                                        [conditions of guarded values])

The rules of products with sines and logarithms (double angle, xlogy, sinc) are in
opgen/optimize/product_rules.py. Over reductions (`log(sum(exp(u)))`, the textbook softmax)
the rules need the static shapes: Note [stable rewrites over reductions] in
opgen/optimize/reductions.py.

Gradients are also put over a common denominator (`sympy.together`) where that makes them
shorter: `1/(1 + |x|) - |x|/(1 + |x|)**2` is `1/(1 + |x|)**2`.

The results only widen where a formula is finite: `sinc(0)` is 1 where `sin(0)/0` was
undefined; elsewhere the values agree.
"""

from __future__ import annotations

from dataclasses import replace

import sympy
from sympy import Expr, S

from opgen.derive.gradients import Derived
from opgen.derive.guard import guard_branches
from opgen.derive.powers import same_base
from opgen.formula import functions as fn
from opgen.formula.tensor import ReduceLogSumExp, ReduceSum, Softmax, TensorOp
from opgen.nodes.special import erfc_times_exp, log_erfc, quantile
from opgen.nodes.stable import hypot, log1mexp, logaddexp, logcosh, logsigmoid
from opgen.optimize import reductions, scales
from opgen.optimize.cancellation import conjugate, is_conjugate_form
from opgen.optimize.joins import joined_branches
from opgen.optimize.product_rules import double_angle, exp_decaying, sinh_over_cosh, to_sinc, unsinc, x_log_x
from opgen.optimize.reductions import Shapes

MAX_PASSES = 8  # each pass rewrites bottom-up; a fixpoint is reached in two or three


def _is_exp(expr: sympy.Basic) -> bool:
    return isinstance(expr, sympy.exp) or (isinstance(expr, sympy.Pow) and expr.base == S.Exp1)


def _exp_arg(expr: sympy.Basic) -> Expr:
    return expr.args[0] if isinstance(expr, sympy.exp) else expr.exp


def _one_plus(expr: sympy.Basic) -> Expr | None:
    """`u` when `expr` is `1 + u`, else None."""
    if isinstance(expr, sympy.Add) and S.One in expr.args:
        return sympy.Add(*[a for a in expr.args if a != S.One] or [S.Zero])
    return None


def _squared(expr: sympy.Basic) -> Expr | None:
    if isinstance(expr, sympy.Pow) and expr.exp == 2:
        return expr.base
    return None


def _log(node: sympy.log) -> Expr | None:
    arg = node.args[0]
    if isinstance(arg, fn.where) and is_conjugate_form(arg):  # the sum as written, in its last branch
        inverse = _inverse_hyperbolic(arg.args[2])
        if inverse is not None:
            return inverse
    if isinstance(arg, sympy.Pow) and arg.exp == -1:
        return -sympy.log(arg.base)
    if isinstance(arg, fn.sigmoid):
        return logsigmoid(arg.args[0])
    if isinstance(arg, sympy.cosh):
        return logcosh(arg.args[0])
    normal = log_erfc(arg)  # Note [normal distribution functions] in opgen/nodes/special.py
    if normal is not None:
        return normal
    if isinstance(-arg, fn.expm1):  # log(1 - exp(u)), its sum already `-expm1(u)`
        return log1mexp((-arg).args[0])
    scaled = _scaled_exps(arg)
    if scaled is not None:
        (ca, a), (cb, b) = scaled
        if ca == cb and a == -b:  # cosh written out: (e**x + e**-x) / 2
            return sympy.log(2 * ca) + logcosh(b)
        if ca == cb:
            return sympy.log(ca) + _log_add_exp(a, b)
        return _log_add_exp(a + sympy.log(ca), b + sympy.log(cb))
    rest = _one_plus(arg)
    if rest is not None and isinstance(-rest, fn.sigmoid):  # 1 - sigmoid(u) = sigmoid(-u)
        return logsigmoid(-(-rest).args[0])
    if rest is not None:
        return fn.softplus(_exp_arg(rest)) if _is_exp(rest) else fn.log1p(rest)
    return _log_of_product(arg)


def _inverse_hyperbolic(total: Expr) -> Expr | None:
    """`log(u + sqrt(u**2 + 1))` -> `asinh(u)`, `log(u + sqrt(u**2 - 1))` -> `acosh(u)` (for u >= 1, where it is
    real): `u**2` overflows float32 past u = 1.8e19, and the sum cancels at u < 0 (asinh's
    conjugate form keeps that but not the overflow)."""
    if not isinstance(total, sympy.Add) or len(total.args) != 2:
        return None
    for root in total.args:
        if isinstance(root, sympy.Pow) and root.exp == S.Half:
            u = total - root
            rest = sympy.expand(root.base - u**2)
            if rest == 1:
                return sympy.asinh(u)
            if rest == -1:
                return sympy.acosh(u)
    return None


def _log_of_product(arg: Expr) -> Expr | None:
    """`log(a * b**k)` -> `log(a) + k * log(b)` for positive factors, one of whose logs has a stable form:
    soft clipping's `log((1 + exp(a x)) / (1 + exp(a (x - 1))))` is a difference of softplus, where the
    quotient is inf / inf past x = 88 / a in float32; `log(2 exp(s))` is `log(2) + s`, where `exp(s)`
    overflows past s = 88 (an exponential's log is its exponent: Note [logs of exponentials])."""
    if not isinstance(arg, sympy.Mul):
        base, power = _as_power(arg)
        return power if base == S.Exp1 and arg.is_Pow else None  # log(2**u) = u log(2)
    parts = []
    for factor in arg.args:
        base, power = _as_power(factor)
        if base == S.Exp1 or ((isinstance(base, fn.sigmoid) or base.is_positive) and power.is_number):
            parts.append((base, power))
        elif _nonnegative(factor) and any(map(_is_exp, arg.args)):  # log(0) is -inf either way
            parts.append((factor, S.One))
        else:
            return None
    if not any(_has_stable_log(b) for b, _ in parts):
        return None
    return sympy.Add(*[k * sympy.log(b) for b, k in parts])


def _has_stable_log(base: Expr) -> bool:
    if base == S.Exp1:
        return True
    return isinstance(base, (sympy.Add, fn.sigmoid, sympy.cosh)) and _log(sympy.log(base)) is not None


def _as_power(factor: Expr) -> tuple[Expr, Expr]:
    """(b, k) with `factor = b**k`; an exponential's base is e, a number's power `c**u` one of e too
    (`2**a = exp(a log 2)`)."""
    if _is_exp(factor):
        return S.Exp1, _exp_arg(factor)
    base, power = factor.as_base_exp()
    if base.is_number and base.is_positive and base != 1 and not power.is_number:
        return S.Exp1, power * sympy.log(base)
    return base, power


# Note [logs of exponentials]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# SymPy keeps `log(2 * exp(s))` as written (it expands a log only of positive symbols), and its
# derivative `1` is simplified where its value is not: inf at s = 100 in float32, -inf at s = -1e4.
# A sum of a few exponentials and a positive constant under a log is a logaddexp (`log(0.5 exp(x) + 0.5)`
# is `log(0.5) + softplus(x)`); a number's power `c**u` is the exponential `exp(u log c)` there
# (`log2(2**a + 2**b)` is `logaddexp(a log 2, b log 2) / log 2`, torch.logaddexp2's value).


def _log_add_exp(a: Expr, b: Expr) -> Expr:
    """logaddexp(a, b), softplus of the other where one is 0."""
    if a == 0 or b == 0:
        return fn.softplus(a + b)
    return logaddexp(a, b)


def _scaled_exps(expr: sympy.Basic) -> tuple[tuple[Expr, Expr], tuple[Expr, Expr]] | None:
    """`((c1, a), (c2, b))` when `expr` is `c1 e**a + c2 e**b` with positive numbers c1, c2 (sorted); a
    positive constant is `c e**0`, a power of a number `c**u` is `e**(u log c)` (Note [logs of exponentials])."""
    if not isinstance(expr, sympy.Add) or len(expr.args) != 2:
        return None
    parts = []
    for term in expr.args:
        if term.is_number:
            if not term.is_positive:
                return None
            parts.append((term, S.Zero))
            continue
        coeff, body = term.as_coeff_Mul()
        base, power = _as_power(body)
        if not coeff.is_positive or base != S.Exp1:
            return None
        parts.append((coeff, power))
    if all(power == 0 for _, power in parts):
        return None
    first, second = sorted(parts, key=lambda p: sympy.default_sort_key(p[1]))
    return first, second


def _add(node: sympy.Add) -> Expr | None:
    """`c*exp(u) - c + rest` -> `c*expm1(u) + rest` (SymPy distributes `2*(exp(u) - 1)`), and
    `c*u**a - c + rest` -> `c*expm1(a*log(u)) + rest` for a positive base (Note [powers less one])."""
    constants = [a for a in node.args if a.is_Number]
    if not constants:
        return None
    for term in sorted(node.args, key=sympy.default_sort_key):
        coeff, rest = term.as_coeff_Mul()
        if coeff != -constants[0]:
            continue
        others = [a for a in node.args if a is not term and a is not constants[0]]
        if _is_exp(rest):
            return sympy.Add(coeff * fn.expm1(_exp_arg(rest)), *others)
        if isinstance(rest, sympy.Pow) and not rest.exp.is_Integer and _positive(rest.base):
            return sympy.Add(coeff * fn.expm1(rest.exp * sympy.log(rest.base)), *others)
    return None


# Note [powers less one]
# ~~~~~~~~~~~~~~~~~~~~~~
# `u**a - 1` cancels where `u**a` is near 1: Barron's robust loss `|a-2|/a * ((x**2/|a-2| + 1)**(a/2) - 1)`
# keeps one digit in float32 at a = 1e-6. For `u > 0` it is exactly `expm1(a*log(u))`, and with
# `u = 1 + v`, `expm1(a*log1p(v))` (the loss's reference code computes it so), exact at small `a` and at
# small `v`. Only a base known positive is rewritten (`1 +` a sum of squares, absolute values,
# exponentials, ...): `x**p - 1` with a negative `x` and a whole `p` is a number where `log(x)` is NaN.


def _nonnegative(expr: sympy.Basic) -> bool:
    """Whether `expr` is >= 0 (or +inf) for every real value of its symbols, by its form alone."""
    if expr.is_nonnegative or isinstance(expr, (sympy.Abs, sympy.exp)):
        return True
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        return all(_nonnegative(a) for a in expr.args)
    if isinstance(expr, sympy.Pow):
        return bool(expr.exp.is_even) or _nonnegative(expr.base)
    return False


def _positive(expr: sympy.Basic) -> bool:
    """Whether `expr` is > 0: positive as SymPy knows, or a positive number plus terms that are >= 0."""
    if expr.is_positive:
        return True
    if not isinstance(expr, sympy.Add):
        return False
    constant, terms = expr.as_coeff_Add()
    return bool(constant.is_positive) and _nonnegative(terms)


def _pow(node: sympy.Pow) -> Expr | None:
    base, exponent = node.args
    if exponent.is_Integer and exponent < 0:
        rest = _one_plus(base)
        if rest is not None and _is_exp(rest):
            return fn.sigmoid(-_exp_arg(rest)) ** (-exponent)
    if exponent == S.Half and isinstance(base, sympy.Add) and len(base.args) == 2:
        a, b = (_squared(t) for t in base.args)
        if a is not None and b is not None:
            return hypot(a, b)
    return None


def _mul(node: sympy.Mul) -> Expr | None:
    factors = list(node.args)
    combined = same_base(factors)  # Note [power rule] in opgen/derive/powers.py
    if combined is not None:
        return combined
    # exp(u) * sigmoid(-u) = exp(u) / (1 + exp(u)) = sigmoid(u)
    for k, factor in enumerate(factors):
        if not _is_exp(factor):
            continue
        u = _exp_arg(factor)
        for j, other in enumerate(factors):
            base, power = other.as_base_exp()
            if isinstance(base, fn.sigmoid) and power.is_Integer and power >= 1 and base.args[0] == -u:
                rest = [f for i, f in enumerate(factors) if i not in (k, j)]
                return sympy.Mul(fn.sigmoid(u), base ** (power - 1), *rest)
    # u * sign(u) = abs(u)
    for factor in factors:
        if isinstance(factor, (sympy.sign, fn.sign)) and factor.args[0] in factors:
            rest = [f for f in factors if f is not factor]
            rest.remove(factor.args[0])
            return sympy.Mul(sympy.Abs(factor.args[0]), *rest)
    # -c * softplus(-u) = c * logsigmoid(u)
    coeff, terms = node.as_coeff_mul()
    if coeff.is_negative:
        for k, term in enumerate(terms):
            if isinstance(term, fn.softplus) and term.args[0].could_extract_minus_sign():
                rest = [t for i, t in enumerate(terms) if i != k]
                return sympy.Mul(-coeff, logsigmoid(-term.args[0]), *rest)
    masked = _masked(factors)
    if masked is not None:
        return masked
    ratio = _exp_ratio(factors) or erfc_times_exp(factors) or _exp_into_sum(factors) or _share_of_sum(node)
    if ratio is not None:
        return ratio
    double = double_angle(factors) or x_log_x(factors) or sinh_over_cosh(factors) or exp_decaying(factors)
    if double is not None:
        return double
    return to_sinc(node)


# Note [ratios of exponentials]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A quotient of exponentials overflows in both parts where its value is moderate: tanh written out,
# `(exp(x) - exp(-x)) / (exp(x) + exp(-x))`, is inf / inf = NaN in float32 at x = -1e4, and
# `(m**2 + exp(a)) / exp(b)` at a = b = 100. Over a sum of two exponentials with one coefficient
# `c (exp(a) + exp(b))`, the difference `k (exp(a) - exp(b))` is `k/c tanh((a - b) / 2)` and one
# exponential `exp(a)` is `sigmoid(a - b) / c`; an exponential beside a sum that holds one is multiplied
# in (`exp(-b) (m**2 + exp(a)) = m**2 exp(-b) + exp(a - b)`, the power rule joins the two), so the
# exponents meet before anything is raised.


def _exp_ratio(factors: list[Expr]) -> Expr | None:
    """`k (exp(a) - exp(b)) / (c exp(a) + c exp(b))` -> `k/c tanh((a - b)/2)`, `exp(a) / (c exp(a) + c exp(b))`
    -> `sigmoid(a - b) / c` (Note [ratios of exponentials])."""
    for divisor in factors:
        if isinstance(divisor, fn.sigmoid):  # 1 / (1 + exp(-v)), rewritten first
            (c, a), (_, b) = (S.One, -divisor.args[0]), (S.One, S.Zero)
        elif isinstance(divisor, sympy.Pow) and divisor.exp == -1:
            scaled = _scaled_exps(divisor.base)
            if scaled is None or scaled[0][0] != scaled[1][0]:
                continue
            (c, a), (_, b) = scaled
        else:
            continue
        for other in factors:
            found = _over_two_exps(other, a, b)
            if found is not None:
                rest = [f for f in factors if f is not divisor and f is not other]
                return sympy.Mul(found / c, *rest)
    return None


def _over_two_exps(numerator: Expr, a: Expr, b: Expr) -> Expr | None:
    """`numerator / (exp(a) + exp(b))` as a tanh or a sigmoid: `numerator` is `exp(a)`, `exp(b)` or
    `k exp(a) - k exp(b)`."""
    if _is_exp(numerator):
        u = _exp_arg(numerator)
        return fn.sigmoid(a - b) if u == a else fn.sigmoid(b - a) if u == b else None
    coeff, body = numerator.as_coeff_Mul()
    if isinstance(body, fn.expm1):  # exp(u) - 1, rewritten first
        numerator = coeff * sympy.exp(body.args[0]) - coeff
    if not isinstance(numerator, sympy.Add) or len(numerator.args) != 2:
        return None
    terms = {}
    for term in numerator.args:
        coeff, body = term.as_coeff_Mul()
        if body == 1:
            terms[S.Zero] = coeff
            continue
        if not _is_exp(body) or not coeff.is_number:
            return None
        terms[_exp_arg(body)] = coeff
    if set(terms) != {a, b} or terms[a] != -terms[b]:
        return None
    return terms[a] * sympy.tanh((a - b) / 2)


def _masked(factors: list[Expr]) -> Expr | None:
    """`q * where(c, 1, 0)` -> `where(c, q, 0)`, `q` not a number.

    Note [masked products]
    ~~~~~~~~~~~~~~~~~~~~~~
    A kink's slope is an indicator (`max(x, 0)`'s is `where(x > 0, 1, 0)`), and the product of the chain
    rule multiplies it by the outer slope, which may be inf or NaN where the indicator is 0:
    `relu(x)**p` has the slope `p relu(x)**(p - 1) (x > 0)`, inf * 0 = NaN at x <= 0 for p < 1, where
    the exact slope and torch.pow's are 0. Selected instead of multiplied, it is 0 there, and the
    selected branch is guarded (Note [double where] in opgen/derive/guard.py) so that its derivative
    is 0 there too.
    """
    for factor in factors:
        if isinstance(factor, fn.where) and factor.args[1:] == (S.One, S.Zero):
            rest = [f for f in factors if f is not factor]
            if any(not (f.is_number or f.is_Symbol) for f in rest):  # a plain input or grad: nothing to mask
                cond = factor.args[0]  # its symbols are tensors: a kink of a number has no indicator
                return guard_branches(fn.where(cond, sympy.Mul(*rest), S.Zero), frozenset(cond.free_symbols))
    return None


def _share_of_sum(node: sympy.Mul) -> Expr | None:
    """`k N / (N + c)` -> `k where(|N| > |c|, 1 - c / (N + c), N / (N + c))`, `c` a nonzero number.

    Note [shares of a sum]
    ~~~~~~~~~~~~~~~~~~~~~~
    `x**2 / (x**2 + 4)` is inf / inf = NaN in float32 from |x| = 1.8e19 on, where its value is 1. Where
    the numerator outweighs the number, `1 - c / (N + c)` is the same value without the quotient of two
    large numbers; where it does not, the formula as written keeps the digits that the difference
    would cancel (x = 1e-20).
    """
    coeff, factors = node.as_coeff_mul()
    divisors = [f for f in factors if isinstance(f, sympy.Pow) and f.exp == -1 and isinstance(f.base, sympy.Add)]
    if len(divisors) != 1:
        return None
    total = divisors[0].base
    numerator = sympy.Mul(*[f for f in factors if f is not divisors[0]])
    rest = sympy.expand(total - numerator)
    if numerator.is_number or not rest.is_number or rest == 0 or rest == total:
        return None
    large = sympy.StrictGreaterThan(sympy.Abs(numerator), abs(rest))
    return coeff * fn.where(large, 1 - rest / total, numerator / total)


def _is_share_form(node: fn.where) -> bool:
    """Whether `node` is what `_share_of_sum` made of its last branch: rewritten already."""
    branch = node.args[2]
    return isinstance(branch, sympy.Mul) and _share_of_sum(branch) == node


def _exp_into_sum(factors: list[Expr]) -> Expr | None:
    """`exp(u) (r + k exp(v))` -> `r exp(u) + k exp(u + v)` (Note [ratios of exponentials])."""
    exps = [f for f in factors if _is_exp(f)]
    for total in factors:
        if exps and isinstance(total, sympy.Add) and any(any(map(_is_exp, sympy.Mul.make_args(t))) for t in total.args):
            rest = [f for f in factors if f is not total and f is not exps[0]]
            return sympy.Mul(sympy.Add(*(t * exps[0] for t in total.args)), *rest)
    return None


def _branch_value(relation: sympy.Basic, cond: sympy.Basic) -> sympy.Basic:
    """`relation` (`u == k` or `u != k`) where `cond` holds: a truth value when SymPy evaluates it,
    or when `u == k` would make `cond` false."""
    if relation in (S.true, S.false):
        return relation
    lhs, rhs = relation.args
    if not rhs.is_number or lhs.is_number:
        return relation
    if cond.xreplace({lhs: rhs}) is S.false:  # `u == k` cannot hold where `cond` does
        return S.false if isinstance(relation, sympy.Eq) else S.true
    return relation


def _equality(node: sympy.Basic) -> sympy.Basic | None:
    """`where(c, a, b) == k`, the same truth value in both branches -> that value.

    Note [conditions of guarded values]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    A guard (Note [double where] in opgen/derive/guard.py) makes a value `w = where(c, u, safe)`;
    a function of it may test `w == 0` (sinc's derivative does). Where `c` holds, `w` is `u`,
    and `u == 0` cannot hold if `c` becomes false with `u` 0 (`abs(x) >= 0.0001`); elsewhere `w`
    is `safe`, a number. When both branches give the same truth value, so does the test, and
    the `where` it decides has a dead branch: it goes.
    """
    lhs, rhs = node.args
    if isinstance(rhs, fn.where) and not isinstance(lhs, fn.where):
        lhs, rhs = rhs, lhs
    if not isinstance(lhs, fn.where) or not rhs.is_number:
        return None
    cond, a, b = lhs.args
    taken = _branch_value(node.func(a, rhs), cond)
    other = _branch_value(node.func(b, rhs), sympy.Not(cond))
    return taken if taken == other and taken in (S.true, S.false) else None


def _sum(node: sympy.Add) -> Expr | None:
    return _add(node) or conjugate(node) or joined_branches(node)


def _log1p(node: fn.log1p) -> Expr | None:
    """`log1p(-exp(u))` -> `log1mexp(u)`: it loses every digit near u = 0, where `exp(u)` rounds to 1."""
    arg = -node.args[0]
    return log1mexp(_exp_arg(arg)) if _is_exp(arg) else None


_RULES = {
    sympy.log: _log,
    fn.log1p: _log1p,
    sympy.Add: _sum,
    sympy.Pow: _pow,
    sympy.Mul: _mul,
    sympy.Eq: _equality,
    sympy.Ne: _equality,
    sympy.erfinv: quantile,
}

# Note [stable rewrites over reductions] in opgen/optimize/reductions.py: these see shapes.
_TENSOR_RULES = {
    sympy.log: reductions.log_of,
    sympy.exp: reductions.exponential,
    sympy.Add: reductions.total,
    sympy.Mul: scales.product,
    ReduceSum: reductions.reduce_sum,
    ReduceLogSumExp: reductions.logsumexp,
    Softmax: reductions.softmax,
}


def _once(expr: sympy.Basic, shapes: Shapes | None) -> sympy.Basic:
    if expr.is_Atom or not expr.args:
        return expr
    if isinstance(expr, fn.where) and (is_conjugate_form(expr) or _is_share_form(expr)):
        return expr  # its last branch is the sum as written, taken where it does not cancel
    args = tuple(_once(a, shapes) for a in expr.args)
    node = expr.func(*args) if args != expr.args else expr
    rule = _RULES.get(type(node))
    if rule is not None:
        replaced = rule(node)
        if replaced is not None:
            return replaced
    tensor_rule = _TENSOR_RULES.get(type(node))
    if tensor_rule is not None and node.has(TensorOp):
        replaced = tensor_rule(node, shapes)
        if replaced is not None:
            return replaced
    return node


def rewrite(expr: Expr, shapes: Shapes | None = None) -> Expr:
    """`expr` with every stable rewrite applied, until none applies (Note [stable rewrites]).

    `shapes` (the static shape of each symbol) lets the rules over reductions see what is
    constant along a reduced dimension; without it only numbers are.
    """
    for _ in range(MAX_PASSES):
        rewritten = _once(expr, shapes)
        if rewritten == expr:
            break
        expr = rewritten
    return expr


def _shorter(expr: Expr) -> Expr:
    """Note [no exponentials over a common denominator]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    `sympy.together` reads `exp(-u)` as `1 / exp(u)`: `a exp(-u) + b` becomes `exp(-u) (a + b exp(u))`,
    and where `exp(-u)` underflows to 0 (`erf(u)`'s derivative at u = 100), `exp(u)` overflows and the
    gradient is `0 * inf`, NaN, where the formula's is `b`. A common denominator that brings an
    exponential the gradient did not have is refused."""
    together = sympy.together(expr)
    if together.atoms(sympy.exp) - expr.atoms(sympy.exp):
        return expr
    return together if sympy.count_ops(together) < sympy.count_ops(expr) else expr


def _rewritten(factor: Expr, shapes: Shapes) -> Expr:
    return unsinc(rewrite(_shorter(rewrite(factor, shapes)), shapes))


def rewrite_gradients(derived: Derived) -> Derived:
    """`derived` with every gradient factor rewritten (the forward was rewritten before `derive`)."""
    shapes = derived.shapes
    variants = []
    for variant in derived.variants:
        gradients = tuple(
            replace(g, contributions=tuple(replace(c, factor=_rewritten(c.factor, shapes)) for c in g.contributions))
            for g in variant.gradients
        )
        variants.append(replace(variant, gradients=gradients))
    return replace(derived, variants=tuple(variants))
