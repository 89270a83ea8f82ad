"""Formulas mixing tensors with plain numbers: non-tensor inputs, constants, dimension sizes.

Note [numbers and tensors] (opgen.formula.kinds): a number-valued subexpression is computed with
`math`, never saved with `save_for_backward`, never passed to a torch function that needs
a tensor. Note [gradient shapes] (opgen.plan.backward): every gradient has its input's shape. Each
case is generated, imported, called, and compared in float64 with plain torch autograd of
the same formula; the generated tests of the package run too.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from fuzz_ast import UNARY
from spec_ops import build_ops

F = torch.nn.functional
DTYPE = torch.float64


def n(value: float) -> torch.Tensor:
    """A plain number as a float64 scalar tensor, for the plain-torch references."""
    return torch.tensor(value, dtype=DTYPE)


def rand(*shape: int, low: float = -2.0, high: float = 2.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(sum(shape) + len(shape))
    return (low + (high - low) * torch.rand(shape, generator=generator, dtype=DTYPE)).requires_grad_()


@dataclass(frozen=True)
class Case:
    spec: str  # the spec without its `name:` line
    reference: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]]  # plain torch of the same formula
    args: Callable[[], list[object]]
    gradgrad: bool = True  # the gradient is differentiable (and not an override)


def _layer_norm(x, weight, bias, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * weight + bias


def _cosine_loss(x1, x2, y, margin=0.0):
    cos = (x1 * x2).sum(-1) / torch.sqrt((x1 * x1).sum(-1) * (x2 * x2).sum(-1) + 1e-8)
    return torch.where(y == 1, 1 - cos, torch.clamp_min(cos - margin, 0)).mean(0)


# The cases of issue 8 (failures 5, 6, 8, 9), each as a user would write it.
ISSUE = {
    "exp_of_float": Case(
        """
        inputs:
          x: Tensor
          a: float
        outputs:
          y: exp(a) * x
        """,
        lambda x, a: torch.exp(n(a)) * x,
        lambda: [rand(3, 4), 0.5],
    ),
    "acos_tanh_of_float": Case(
        """
        inputs:
          x: Tensor
          a: float
        outputs:
          y: x * acos(tanh(a))
        """,
        lambda x, a: x * torch.acos(torch.tanh(n(a))),
        lambda: [rand(3, 4), 0.5],
    ),
    "softplus_of_float": Case(
        """
        inputs:
          x: Tensor
          a: float
        outputs:
          y: x * softplus(a)
        """,
        lambda x, a: x * F.softplus(n(a)),
        lambda: [rand(3, 4), -0.7],
    ),
    "clamp_of_constants": Case(
        """
        inputs:
          x: Tensor
        outputs:
          y: x * clamp(2, 0, 1)
        """,
        lambda x: x * torch.clamp(n(2), 0, 1),
        lambda: [rand(3, 4)],
    ),
    "zero_gradient_larger_input": Case(
        """
        inputs:
          x: Tensor
          z: Tensor
        outputs:
          y: x + 0 * z
        """,
        lambda x, z: x + 0 * z,  # the shape as written (Note [shapes as written]), though SymPy drops `0 * z`
        lambda: [rand(4), rand(3, 4)],
    ),
    "comparison_of_a_let": Case(
        """
        inputs:
          x: Tensor
          a: float
        let:
          l0: exp(a * (x > 0))
        outputs:
          l1: l0 <= x
        """,
        lambda x, a: (torch.exp(a * (x > 0).to(DTYPE)) <= x).to(DTYPE) + 0 * x,
        lambda: [rand(3, 4, low=0.5, high=3.0), 0.25],
        gradgrad=False,
    ),
    "cosine_embedding_loss": Case(
        """
        inputs:
          x1: Tensor[N, D]
          x2: Tensor[N, D]
          y: Tensor[N]
          margin: float = 0.0
        let:
          cos: sum(x1 * x2, dim=-1) / sqrt(sum(x1 * x1, dim=-1) * sum(x2 * x2, dim=-1) + 1e-8)
        outputs:
          loss: mean(where(y == 1, 1 - cos, max(cos - margin, 0)), dim=0)
        """,
        _cosine_loss,
        lambda: [rand(6, 5), rand(6, 5), torch.tensor([1.0, -1, 1, -1, -1, 1], dtype=DTYPE), 0.1],
    ),
    "logit": Case(
        """
        inputs:
          x: Tensor
          eps: float = 1e-6
        let:
          p: clamp(x, eps, 1 - eps)
        outputs:
          y: log(p / (1 - p))
        tests:
          domain: {x: [0.05, 0.95]}
        """,
        lambda x, eps: torch.logit(x, eps),
        lambda: [rand(3, 4, low=0.05, high=0.95), 1e-6],
    ),
    "layer_norm": Case(
        """
        inputs:
          x: Tensor[..., D]
          weight: Tensor[D]
          bias: Tensor[D]
          eps: float = 1e-5
        let:
          mu: mean(x, dim=-1, keepdim=true)
          var: mean((x - mu)**2, dim=-1, keepdim=true)
        outputs:
          y: (x - mu) / sqrt(var + eps) * weight + bias
        module:
          name: MyLayerNorm
          args:
            normalized_shape: int
            eps: float = 1e-5
          parameters:
            weight: {shape: [normalized_shape], init: ones}
            bias: {shape: [normalized_shape], init: zeros}
        """,
        _layer_norm,
        lambda: [rand(2, 3, 5), rand(5), rand(5), 1e-5],
    ),
    "override_on_a_parameter": Case(
        """
        inputs:
          x: Tensor
          w: Tensor
        outputs:
          y: x * w
        gradients:
          w: 2 * grad * x
        module:
          name: ScaledLayer
          args: {size: int}
          parameters:
            w: {shape: [size], init: normal(0, 1)}
        """,
        lambda x, w: x * w,  # w's gradient is the override's: see test_overrides_fit_their_input
        lambda: [rand(3, 4), rand(4)],
        gradgrad=False,
    ),
}

# More: floats with named dimension sizes, int and bool inputs, number conditions, mixed
# bounds, number lets and temporaries, outputs of different shapes, overrides that do not
# span their input.
MORE = {
    "floats_and_sizes": Case(
        """
        inputs:
          x: Tensor[N, D]
          a: float
        outputs:
          y: x * exp(a) / sqrt(D) + x ** 2 * log(D + a)
        """,
        lambda x, a: x * math.exp(a) / math.sqrt(x.shape[-1]) + x**2 * math.log(x.shape[-1] + a),
        lambda: [rand(3, 5), 0.5],
    ),
    "sizes_only": Case(
        """
        inputs:
          x: Tensor[N, D]
        outputs:
          y: x * softplus(D) + sigmoid(N) * x ** 2
        """,
        lambda x: x * F.softplus(n(x.shape[1])) + torch.sigmoid(n(x.shape[0])) * x**2,
        lambda: [rand(3, 5)],
    ),
    "int_and_bool": Case(
        """
        inputs:
          x: Tensor
          k: int
          flag: bool
        outputs:
          y: where(flag > 0, x ** k, -x)
        """,
        lambda x, k, flag: torch.where(torch.tensor(flag), x**k, -x),
        lambda: [rand(3, 4), 3, False],
    ),
    "number_condition_tensor_branches": Case(
        """
        inputs:
          x: Tensor
          z: Tensor
          a: float
        outputs:
          y: exp(where(a > 0, x, z)) + where(a > 1, x, 0)
        """,
        lambda x, z, a: torch.exp(torch.where(torch.tensor(a > 0), x, z)) + torch.where(torch.tensor(a > 1), x, 0.0),
        lambda: [rand(4), rand(3, 4), 0.5],
    ),
    "clamp_bounds_mixed": Case(
        """
        inputs:
          x: Tensor
          z: Tensor
          a: float
        outputs:
          y: clamp(x, z, 1) + clamp(a, x, 2) * x
        """,
        lambda x, z, a: torch.clamp(x, z, n(1)) + torch.clamp(n(a), x, n(2)) * x,
        lambda: [rand(3, 4), rand(4, low=-2, high=0), 0.25],
    ),
    "clamp_bounds_crossing": Case(
        """
        inputs:
          x: Tensor
          lo: Tensor
          hi: Tensor
        outputs:
          y: clamp(x, lo, hi) + clamp(x, lo, 1)
        """,
        lambda x, lo, hi: torch.clamp(x, lo, hi) + torch.clamp(x, lo, n(1)),
        lambda: [rand(3, 4), rand(4, low=-1.0, high=3.0), rand(3, 1, low=-1.0, high=1.0)],
        gradgrad=False,  # gradgradcheck's steps cross the bounds' kinks
    ),
    "constants_of_clamp_max_min": Case(
        """
        inputs:
          x: Tensor
        outputs:
          y: x * clamp(-2, -3, -1) + x ** 2 * clamp(2, 3, 1) + max(-2, -3) * x ** 3 + min(2, 3)
        """,
        lambda x: x * torch.clamp(n(-2), -3, -1) + x**2 * torch.clamp(n(2), 3, 1) - 2 * x**3 + 2,
        lambda: [rand(3, 4)],
    ),
    "clamp_of_floats": Case(
        """
        inputs:
          x: Tensor
          a: float
          b: float
        outputs:
          y: x * clamp(a, b, 1) + x * clamp(a, 1, b)
        """,
        lambda x, a, b: x * torch.clamp(n(a), n(b), n(1)) + x * torch.clamp(n(a), n(1), n(b)),
        lambda: [rand(3, 4), 0.25, 2.0],
    ),
    "number_lets_and_temporaries": Case(
        """
        inputs:
          x: Tensor
          a: float
        let:
          s: exp(a) + 1
        outputs:
          y: s * x * s + sigmoid(s) * x ** 3 * (1 - a)
        """,
        lambda x, a: (math.exp(a) + 1) ** 2 * x + torch.sigmoid(n(math.exp(a) + 1)) * x**3 * (1 - a),
        lambda: [rand(3, 4), 0.3],
    ),
    "powers_and_atan2": Case(
        """
        inputs:
          x: Tensor
          a: float
        outputs:
          y: x * a ** 0.3 + a ** x + x ** a + atan2(a, x) + atan2(x, a) * atan2(a, 2)
        tests:
          domain:
            x: [0.1, 2.0]
        """,
        lambda x, a: x * a**0.3 + n(a) ** x + x**a + torch.atan2(n(a), x) + torch.atan2(x, n(a)) * math.atan2(a, 2),
        lambda: [rand(3, 4, low=0.1, high=2.0), 1.5],
    ),
    "conditions_of_numbers": Case(
        """
        inputs:
          x: Tensor
          a: float
          b: float
        outputs:
          y: x * (a > 0) + x * ((a > 1) | (b < -1)) + x * max(a, b)
        """,
        lambda x, a, b: x * float(a > 0) + x * float(a > 1 or b < -1) + x * max(a, b),
        lambda: [rand(3, 4), 2.0, 0.5],
    ),
    "outputs_of_different_shapes": Case(
        """
        inputs:
          x: Tensor
          z: Tensor
        outputs:
          y: 2 * x
          u: x * z + sign(z)
        """,
        lambda x, z: (2 * x, x * z + torch.sign(z)),
        lambda: [rand(4), rand(3, 4)],
    ),
    "outputs_of_different_shapes_overridden": Case(
        """
        inputs:
          x: Tensor
          z: Tensor
        outputs:
          y: 2 * x
          u: x * z
        gradients:
          z: grad_u * x
        """,
        lambda x, z: (2 * x, x * z),
        lambda: [rand(4), rand(3, 4)],
        gradgrad=False,
    ),
    "overrides_narrower_than_input": Case(
        """
        inputs:
          x: Tensor
          z: Tensor
        outputs:
          y: x * z
        gradients:
          x: z
          z: 1
        """,
        lambda x, z: x * z,
        lambda: [rand(3, 4), rand(4)],
        gradgrad=False,
    ),
    "fused_with_floats": Case(
        """
        inputs:
          x: Tensor
          a: float
        outputs:
          y: x * softplus(a) + sigmoid(x * a) * exp(a)
        optimize:
          fuse: true
        """,
        lambda x, a: x * F.softplus(n(a)) + torch.sigmoid(x * a) * math.exp(a),
        lambda: [rand(3, 4), 0.5],
    ),
    "memory_policy_with_floats": Case(
        """
        inputs:
          x: Tensor
          a: float
        outputs:
          y: x - tanh(a) + tanh(x) * erf(a)
        optimize:
          policy: memory
        """,
        lambda x, a: x - math.tanh(a) + torch.tanh(x) * math.erf(a),
        lambda: [rand(3, 4), 0.5],
    ),
    # A factor that vanishes once multiplied out: x's gradient is a zero tensor, not the number 0.
    "vanishing_factor": Case(
        """
        inputs:
          x: Tensor
          a: Tensor
        outputs:
          y: (a < a) * x + a
        """,
        lambda x, a: (a < a) * x + a,
        lambda: [rand(3, 4), rand(4)],
    ),
    # Through `.T`: the gradient of x is the transpose of a vanished term, a zero.
    "vanishing_factor_through_a_transpose": Case(
        """
        inputs:
          x: Tensor[..., N, K]
          a: float
        outputs:
          y: -where(a < a, x.T, a) + 0 * x.T
        """,
        lambda x, a: -torch.where(torch.tensor(a < a), x.mT, n(a)) + 0 * x.mT,
        lambda: [rand(3, 4), 0.5],
    ),
    "vanishing_factor_of_two_outputs": Case(
        """
        inputs:
          x: Tensor
          a: Tensor
        outputs:
          y: (a < a) * x + a
          z: (x > x) * a + sin(x)
        """,
        lambda x, a: ((a < a) * x + a, (x > x) * a + torch.sin(x)),
        lambda: [rand(3, 4), rand(4)],
    ),
    # A bool is a number (0 or 1) in formulas; torch refuses `tensor - True`.
    "bool_subtracted": Case(
        """
        inputs:
          x: Tensor
          b: bool = true
        outputs:
          y: x * x - b
          z: b - exp(x) * b + x / (1 + b)
        """,
        lambda x, b: (x * x - int(b), int(b) - torch.exp(x) * int(b) + x / (1 + int(b))),
        lambda: [rand(3, 4), True],
    ),
    "bool_false_in_a_power": Case(
        """
        inputs:
          x: Tensor
          b: bool
        outputs:
          y: (x - b) ** (2 - b) + sin(b - x)
        """,
        lambda x, b: (x - int(b)) ** (2 - int(b)) + torch.sin(int(b) - x),
        lambda: [rand(3, 4), False],
    ),
    # A side that SymPy folds to 0 from tensors (`x - x`) keeps torch.maximum against a tensor zero;
    # the other side is printed whole, not as the receiver of `.new_tensor` (`2.5 - x.new_tensor(0)`).
    "folded_zero_against_a_sum": Case(
        """
        inputs:
          x: Tensor
        outputs:
          y: max(x - x, 2.5 - x)
          z: min(0 * x, x + 1)
        """,
        lambda x: (torch.maximum(x - x, 2.5 - x), torch.minimum(0 * x, x + 1)),
        lambda: [rand(3, 4, low=-3.0, high=4.0)],
    ),
}
CASES = {**ISSUE, **MORE}
# Override formulas evaluated on their own, for the gradients they replace.
OVERRIDES: dict[str, Callable[..., dict[int, torch.Tensor]]] = {
    "override_on_a_parameter": lambda x, w, g: {1: 2 * g * x},
    "outputs_of_different_shapes_overridden": lambda x, z, gy, gu: {1: gu * x},
    "overrides_narrower_than_input": lambda x, z, g: {0: z.expand(3, 4), 1: torch.ones(4, dtype=DTYPE)},
}


def _spec_text(name: str, case: Case) -> str:
    import textwrap

    return f"name: {name}\n" + textwrap.dedent(case.spec).strip() + "\n"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("numbers")


@pytest.fixture(scope="module")
def ops_of(root: Path):
    """The generated package of one case (`root/<case>/ops_<case>`), built once: a case
    opgen refuses fails alone."""
    built: dict[str, object] = {}

    def get(name: str):
        if name not in built:
            built[name] = build_ops(root / name, f"ops_{name}", {name: _spec_text(name, CASES[name])})
        return built[name]

    return get


def _as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


def _tensors(args: list[object]) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


def _incoming(outs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randn(o.shape, generator=generator, dtype=DTYPE) for o in outs]


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_equal_plain_autograd(ops_of, name: str):
    ops = ops_of(name)
    case = CASES[name]
    args = case.args()
    outs = _as_tuple(getattr(ops, name)(*args))
    want = _as_tuple(case.reference(*args))
    for out, expected in zip(outs, want, strict=True):
        torch.testing.assert_close(out, expected.expand_as(out))
    tensors = _tensors(args)
    grads_in = _incoming(outs)
    got = torch.autograd.grad(outs, tensors, grads_in, allow_unused=True, materialize_grads=True)
    expected_grads = list(torch.autograd.grad(want, tensors, grads_in, allow_unused=True, materialize_grads=True))
    for k, value in OVERRIDES.get(name, lambda *a: {})(*tensors, *grads_in).items():
        expected_grads[k] = value.sum_to_size(tensors[k].shape)
    for tensor, grad, expected in zip(tensors, got, expected_grads, strict=True):
        assert grad.shape == tensor.shape
        torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.gradgrad))
def test_double_backward(ops_of, name: str):
    ops = ops_of(name)
    args = CASES[name].args()
    positions = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]

    def call(*tensors):
        full = list(args)
        for k, tensor in zip(positions, tensors, strict=True):
            full[k] = tensor
        return getattr(ops, name)(*full)

    assert torch.autograd.gradgradcheck(call, [args[k] for k in positions])


def test_generated_tests_pass(ops_of, root: Path):
    for name in CASES:
        ops_of(name)
    folders = [f"{name}/ops_{name}/tests" for name in sorted(CASES)]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *folders],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-4000:]
    assert " passed" in result.stdout


def test_layer_norm_module_is_torchs_layer_norm(ops_of):
    ops = ops_of("layer_norm")
    module = ops.MyLayerNorm(5).to(DTYPE)
    torch.nn.init.normal_(module.weight)
    torch.nn.init.normal_(module.bias)
    x = rand(2, 3, 5)
    expected = F.layer_norm(x, (5,), module.weight, module.bias, 1e-5)
    torch.testing.assert_close(module(x), expected)
    torch.testing.assert_close(ops.layer_norm(x, module.weight, module.bias), expected)


def test_overrides_fit_their_input(ops_of):
    """The override layer's `w` gets the override summed over the batch, as its module uses it."""
    ops = ops_of("override_on_a_parameter")
    layer = ops.ScaledLayer(4).to(DTYPE)
    x = rand(3, 4)
    layer(x).sum().backward()
    torch.testing.assert_close(layer.w.grad, 2 * x.detach().sum(0))


# -- every function of the formula language, of a float input ----------------------------------------

# The fuzz tests' table of plain torch functions (independent of opgen), and heaviside.
FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    **UNARY,
    "heaviside": lambda u: (u >= 0).to(DTYPE),
}
# Points inside each function's domain, including where a naive formula overflows.
POINTS = (-800.0, -2.5, -0.5, 0.0, 0.5, 2.5, 700.0)
DOMAIN: dict[str, Callable[[float], bool]] = {
    "log": lambda a: a > 0,
    "log1p": lambda a: a > -1,
    "sqrt": lambda a: a >= 0,
    "rsqrt": lambda a: a > 0,
    "lgamma": lambda a: a > 0,
    "digamma": lambda a: a > 0,
    "asin": lambda a: abs(a) <= 1,
    "acos": lambda a: abs(a) <= 1,
    "atanh": lambda a: abs(a) < 1,
    "erfinv": lambda a: abs(a) < 1,
    "acosh": lambda a: a >= 1,
    "exp": lambda a: a < 700,
    "expm1": lambda a: a < 700,
    "sinh": lambda a: abs(a) < 700,
    "cosh": lambda a: abs(a) < 700,
    "tan": lambda a: abs(a) < 1e3,
}


@pytest.fixture(scope="module")
def function_ops(tmp_path_factory: pytest.TempPathFactory):
    specs = {
        f"of_{f}": f"name: of_{f}\ninputs: {{x: Tensor, a: float}}\noutputs: {{y: x * {f}(a) + {f}(a)}}\n"
        for f in FUNCTIONS
    }
    return build_ops(tmp_path_factory.mktemp("functions"), "function_ops", specs)


@pytest.mark.parametrize("function", sorted(FUNCTIONS))
def test_every_function_of_a_float(function_ops, function: str):
    op = getattr(function_ops, f"of_{function}")
    points = [a for a in (*POINTS, 1.0, 1.5) if DOMAIN.get(function, lambda _: True)(a)]
    for a in points:
        x = rand(3, 4)
        y = op(x, a)
        value = FUNCTIONS[function](n(a))
        torch.testing.assert_close(y, x * value + value, msg=lambda m, a=a: f"{function}({a}): {m}")
        (grad,) = torch.autograd.grad(y.sum(), x)
        torch.testing.assert_close(grad, value.expand_as(x), msg=lambda m, a=a: f"{function}({a}): {m}")


def test_a_float_outside_its_domain_raises_as_math_does(function_ops):
    """Number-valued subexpressions are Python's `math`: a domain error is an exception, not NaN."""
    x = rand(3, 4)
    with pytest.raises(ValueError, match="math domain error"):
        function_ops.of_log(x, -1.0)
    with pytest.raises(OverflowError):
        function_ops.of_exp(x, 800.0)


def test_an_output_of_numbers_alone_is_refused_at_its_formula(run_cli, tmp_path: Path):
    """`y: a * 2` has no tensor to take a dtype, device or shape from (Note [numbers and tensors])."""
    spec = tmp_path / "numbers.yaml"
    spec.write_text("name: numbers\ninputs:\n  x: Tensor\n  a: float\noutputs:\n  y: a * 2\n  z: x * a\n")
    status, _, err = run_cli("generate", str(spec), "-o", str(tmp_path / "out"))
    assert status == 2
    assert f"{spec}:6:6: output 'y' does not depend on any Tensor input" in err
    assert not (tmp_path / "out").exists()


def test_constants_the_math_module_lacks(tmp_path):
    """`digamma(1)` is SymPy's `-EulerGamma`, a constant with no `math` name: printing it was
    an internal error (SymPy's rule for them collects them for a `doprint`). Against torch.digamma."""
    from spec_ops import build_ops

    spec = "name: op\ninputs:\n  x: Tensor\noutputs:\n  y: digamma(1) * x + digamma(0.5)\n"
    op = build_ops(tmp_path, "constant_ops", {"op": spec}).op
    x = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64)
    at = torch.tensor([1.0, 0.5], dtype=torch.float64).digamma()
    torch.testing.assert_close(op(x), at[0] * x + at[1])
