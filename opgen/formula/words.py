"""Names of the formula language that need no SymPy: the reductions, and the formulas PyTorch's and
numpy's names for functions stand for (`relu` -> `max({0}, 0)`, read by opgen.formula.aliases).

Kept apart from opgen.formula.vocabulary so that reading a formula's syntax tree (opgen.formula.syntax)
imports no SymPy: a run answered from the cache never loads it.
"""

from __future__ import annotations

REDUCTIONS = ("sum", "mean", "amax", "logsumexp", "var", "std", "norm")

# Functions of numpy, torch and math the language spells another way: name -> the formula, with
# {0}, {1}, ... for the call's arguments. Each formula is in the language (tests/test_bad_specs.py).
ALTERNATIVES: dict[str, str] = {
    "square": "{0}**2",
    "cube": "{0}**3",
    "pow": "{0}**{1}",
    "power": "{0}**{1}",
    "float_power": "{0}**{1}",
    "exp2": "2**{0}",
    "reciprocal": "1 / {0}",
    "neg": "-{0}",
    "negative": "-{0}",
    "ln": "log({0})",
    "log2": "log({0}) / log(2)",
    "log10": "log({0}) / log(10)",
    "logit": "log({0} / (1 - {0}))",
    "expit": "sigmoid({0})",
    "relu": "max({0}, 0)",
    "relu6": "clamp({0}, 0, 6)",
    "silu": "{0} * sigmoid({0})",
    "swish": "{0} * sigmoid({0})",
    "gelu": "{0} * (1 + erf({0} / sqrt(2))) / 2",
    "softsign": "{0} / (1 + abs({0}))",
    "mish": "{0} * tanh(softplus({0}))",
    "elu": "where({0} > 0, {0}, {alpha} * expm1({0}))",
    "celu": "where({0} > 0, {0}, {alpha} * expm1({0} / {alpha}))",
    "leaky_relu": "where({0} > 0, {0}, {negative_slope} * {0})",
    "selu": "1.0507009873554804934193349852946 * where({0} > 0, {0}, 1.6732632423543772848170429916717 * expm1({0}))",
    "hardtanh": "max(min({0}, {max_val}), {min_val})",
    "hardsigmoid": "max(min({0} + 3, 6), 0) / 6",
    "hardswish": "{0} * max(min({0} + 3, 6), 0) / 6",
    "tanhshrink": "{0} - tanh({0})",
    "logsigmoid": "-softplus(-{0})",
    "log_sigmoid": "-softplus(-{0})",
    "softmax": "exp({0} - logsumexp({0}, dim=-1, keepdim=true))",
    "log_softmax": "{0} - logsumexp({0}, dim=-1, keepdim=true)",
    "softmin": "exp(-{0} - logsumexp(-{0}, dim=-1, keepdim=true))",
    "amin": "-amax(-{0}, dim=-1)",
    "maximum": "max({0}, {1})",
    "minimum": "min({0}, {1})",
    "fmax": "max({0}, {1})",
    "fmin": "min({0}, {1})",
    "clip": "clamp({0}, {1}, {2})",
    "absolute": "abs({0})",
    "fabs": "abs({0})",
    "sgn": "sign({0})",
    "signum": "sign({0})",
    "arcsin": "asin({0})",
    "arccos": "acos({0})",
    "arctan": "atan({0})",
    "arctan2": "atan2({0}, {1})",
    "arcsinh": "asinh({0})",
    "arccosh": "acosh({0})",
    "arctanh": "atanh({0})",
    "gammaln": "lgamma({0})",
    "psi": "digamma({0})",
    "trigamma": "polygamma(1, {0})",
    "frac": "{0} - trunc({0})",
    "norm": "sqrt(sum({0}**2, dim=-1))",
    "average": "mean({0}, dim=-1)",
    "detach": "stop_gradient({0})",
}


# PyTorch's parameters of a function, in the order its signature has them after the tensor, with
# their defaults: `{alpha}` in the formula (`elu(x, alpha=0.5)`, `leaky_relu(x, 0.1)`).
PARAMETERS: dict[str, tuple[tuple[str, str], ...]] = {
    "elu": (("alpha", "1.0"),),
    "celu": (("alpha", "1.0"),),
    "leaky_relu": (("negative_slope", "0.01"),),
    "hardtanh": (("min_val", "-1.0"), ("max_val", "1.0")),
    "softplus": (("beta", "1.0"), ("threshold", "20.0")),
    "logit": (("eps", "None"),),  # None: no clamp
}
# Functions that PyTorch's parameters make another formula: read as this one only when a parameter
# is given (`softplus(x, beta=2)` as F.softplus, linear past the threshold; torch.logit's `eps` clamps).
PARAMETRIZED: dict[str, str] = {
    "softplus": "where({beta} * {0} > {threshold}, {0}, softplus({beta} * {0}) / {beta})",
    "logit": "log(clamp({0}, {eps}, 1 - {eps}) / (1 - clamp({0}, {eps}, 1 - {eps})))",
}


# A parameter of a function that PyTorch gives as a string: name -> (the keyword, its values' formulas).
CHOICES: dict[str, tuple[str, dict[str, str]]] = {
    "gelu": (
        "approximate",
        {"none": ALTERNATIVES["gelu"], "tanh": "0.5 * {0} * (1 + tanh(sqrt(2 / pi) * ({0} + 0.044715 * {0}**3)))"},
    ),
}


def defaults(name: str) -> dict[str, str]:
    """The parameters of `name` (`PARAMETERS`) at their defaults, as formula text."""
    return dict(PARAMETERS.get(name, ()))


def arity(name: str) -> int:
    """How many arguments the function `name` of `ALTERNATIVES` takes: its template's placeholders."""
    template = ALTERNATIVES.get(name) or PARAMETRIZED[name]
    return max((int(t) + 1 for t in "012" if "{" + t + "}" in template), default=0)
