"""Errors that teach: every formula a hint offers is in the formula language and computes what the
numpy/torch function it replaces computes; suggestions are made only for believable typos."""

from __future__ import annotations

import ast

import pytest
import sympy
import torch
import torch.nn.functional as F

from opgen.errors import Loc, SpecError
from opgen.formula import hints
from opgen.formula.reader import Scope, read_formula
from opgen.formula.vocabulary import ALL_FUNCTIONS, NUM, Value
from opgen.spec.model import Formula
from opgen.spec.parse_common import plausible

X, A, B = (sympy.Symbol(n, real=True) for n in "xab")
SCOPE = Scope({n.name: Value(n, NUM) for n in (X, A, B)}, frozenset({X, A, B}), shapes=None)

# What each hint replaces, as PyTorch computes it (the independent reference).
TORCH = {
    "square": torch.square,
    "cube": lambda x: x * x * x,
    "pow": torch.pow,
    "power": torch.pow,
    "float_power": lambda x, a: torch.float_power(x, a),
    "exp2": torch.exp2,
    "reciprocal": torch.reciprocal,
    "neg": torch.neg,
    "negative": torch.negative,
    "ln": torch.log,
    "log2": torch.log2,
    "log10": torch.log10,
    "logit": torch.logit,
    "expit": torch.special.expit,
    "relu": torch.relu,
    "relu6": F.relu6,
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "softsign": F.softsign,
    "mish": F.mish,
    "elu": F.elu,
    "leaky_relu": F.leaky_relu,
    "celu": F.celu,
    "selu": F.selu,
    "hardtanh": F.hardtanh,
    "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish,
    "tanhshrink": F.tanhshrink,
    "logsigmoid": F.logsigmoid,
    "log_sigmoid": F.logsigmoid,
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "softmin": lambda x: F.softmin(x, -1),
    "amin": lambda x: torch.amin(x, -1),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "fmax": torch.fmax,
    "fmin": torch.fmin,
    "clip": torch.clip,
    "absolute": torch.absolute,
    "fabs": torch.abs,
    "sgn": torch.sgn,
    "signum": torch.sign,
    "arcsin": torch.arcsin,
    "arccos": torch.arccos,
    "arctan": torch.arctan,
    "arctan2": torch.arctan2,
    "arcsinh": torch.arcsinh,
    "arccosh": torch.arccosh,
    "arctanh": torch.arctanh,
    "gammaln": torch.special.gammaln,
    "psi": torch.special.psi,
    "norm": lambda x: torch.linalg.vector_norm(x, dim=-1),
    "average": lambda x: torch.mean(x, -1),
    "detach": torch.detach,
    "trigamma": lambda x: torch.special.polygamma(1, x),
    "frac": torch.frac,
}


def _numbers_as_tensors(f):
    return lambda *args: f(*(a if torch.is_tensor(a) else torch.tensor(a, dtype=torch.float64) for a in args))


# The formula language's functions, as plain torch (test side: our own fixed text, never a spec's).
LANGUAGE = {
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "sigmoid": torch.sigmoid,
    "softplus": F.softplus,
    "tanh": torch.tanh,
    "expm1": torch.expm1,
    "where": torch.where,
    "erf": torch.erf,
    "abs": torch.abs,
    "sign": torch.sign,
    "clamp": torch.clamp,
    "max": torch.maximum,
    "min": torch.minimum,
    "lgamma": torch.lgamma,
    "digamma": torch.digamma,
    "asin": torch.asin,
    "acos": torch.acos,
    "atan": torch.atan,
    "atan2": torch.atan2,
    "asinh": torch.asinh,
    "acosh": torch.acosh,
    "atanh": torch.atanh,
    "sum": lambda x, dim, keepdim=False: torch.sum(x, dim, keepdim=keepdim),
    "mean": lambda x, dim, keepdim=False: torch.mean(x, dim, keepdim=keepdim),
    "amax": lambda x, dim, keepdim=False: torch.amax(x, dim, keepdim=keepdim),
    "logsumexp": lambda x, dim, keepdim=False: torch.logsumexp(x, dim, keepdim=keepdim),
    "stop_gradient": torch.detach,
    "trunc": torch.trunc,
    "polygamma": lambda n, x: torch.polygamma(int(n), x),
}
LANGUAGE = {
    name: _numbers_as_tensors(f) if name not in ("sum", "mean", "amax", "logsumexp", "polygamma") else f
    for name, f in LANGUAGE.items()
}
LANGUAGE["true"] = True


# Activations whose negative side is a formula of its own: sampled on both sides.
SIGNED = ("mish", "elu", "celu", "selu", "hardtanh", "hardsigmoid", "hardswish", "tanhshrink", "leaky_relu")


def test_every_alternative_has_a_reference():
    assert set(TORCH) == set(hints.ALTERNATIVES)


@pytest.mark.parametrize("name", sorted(hints.ALTERNATIVES))
def test_each_hint_is_a_formula_that_computes_the_function_it_replaces(name):
    text = hints.spelled(name, [])  # with the placeholders x, a, b
    used = [
        n for n in ("x", "a", "b") if n in {node.id for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Name)}
    ]
    read_formula(Formula(text, Loc("hint", 1, 1)), SCOPE)  # raises if it is not in the language
    generator = torch.Generator().manual_seed(0)
    low = 1.1 if name == "arccosh" else -4.0 if name in SIGNED else 0.05
    high = 0.95 if name in ("arcsin", "arccos", "arctanh", "logit") else 3.0
    values = {n: low + (high - low) * torch.rand(4, 5, generator=generator, dtype=torch.float64) for n in used}
    if name in ("pow", "power", "float_power"):
        values["a"] = torch.full((4, 5), 2.5, dtype=torch.float64)
    ours = eval(compile(ast.parse(text, mode="eval"), "hint", "eval"), {"__builtins__": {}}, {**LANGUAGE, **values})  # noqa: S307
    theirs = TORCH[name](*(values[n] for n in used))
    torch.testing.assert_close(ours.to(theirs.dtype), theirs)


@pytest.mark.parametrize(
    ("word", "options", "expected"),
    [
        ("square", ALL_FUNCTIONS, None),
        ("softmax", ALL_FUNCTIONS, None),
        ("expp", ALL_FUNCTIONS, "exp"),
        ("sigmod", ALL_FUNCTIONS, "sigmoid"),
        ("tanhh", ALL_FUNCTIONS, "tanh"),
        ("Exp", ALL_FUNCTIONS, "exp"),
        ("lgoit", ("logit",), "logit"),  # two letters swapped
        ("q", ("x",), None),
        ("X", ("x",), "x"),
        ("grad_out", ("grad_y",), None),
        ("gradient", ("gradients",), "gradients"),
    ],
)
def test_suggestions_only_for_believable_typos(word, options, expected):
    assert plausible(word, options) == expected


def _message(text: str) -> str:
    with pytest.raises(SpecError) as error:
        read_formula(Formula(text, Loc("f", 1, 1)), SCOPE)
    return error.value.message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("np.exp(x)", "write `exp(x)`"),
        ("numpy.log1p(x)", "write `log1p(x)`"),
        ("torch.exp(x) * a", "write `exp(x)`"),
        ("math.exp(x)", "write `exp(x)`"),
        ("F.gelu(x)", "write `gelu(x)`"),
        ("torch.special.expit(x)", "write `expit(x)`"),
        ("(a + x).exp()", "write `exp(a + x)`"),
        ("x.sum(dim=-1, keepdim=True)", "write `sum(x, dim=-1, keepdim=True)`"),
        ("x.square()", "write `square(x)`"),
        ("torch.pi * x", "write `pi`"),
        ("np.inf + x", "write `inf`"),
        ("x^2", "write `x ** 2`"),
        ("a * x^2 + b", "write `a * x ** 2 + b`"),
        ("x ^ (a + 1)", "write `x ** (a + 1)`"),
        ("sqaure(x + a)", "did you mean 'square'?"),
        ("sofmax(x, dim=-1)", "did you mean 'softmax'?"),
        # Stopping a gradient: the language's `stop_gradient(e)`, PyTorch's name `detach(e)`.
        ("x * sigmoid(x).detach()", "write `detach(sigmoid(x))`"),
        ("x + jax.lax.stop_gradient(a - x)", "write `stop_gradient(a - x)`"),
        ("x * sigmoid(x).detach_()", "write `stop_gradient(e)` (or `detach(e)`)"),
        ("no_grad(x)", "`x + stop_gradient(round(x) - x)`"),
    ],
)
def test_messages_say_what_to_write(text, expected):
    message = _message(text)
    assert expected in message, message
    assert "did you mean 'sqrt'" not in message and "did you mean 'max'" not in message
