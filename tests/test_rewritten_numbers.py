"""The stable forms `opgen.optimize.rewrite` introduces, of plain numbers (Note [numbers and tensors]).

`log(sigmoid(u))`, `-softplus(-u)`, `log(exp(a) + exp(b))`, `sqrt(a**2 + b**2)` and
`sin(u) / u` become `logsigmoid`, `logaddexp`, `hypot` and `sinc`; where their arguments are
non-tensor inputs or constants they are computed with `math`, never handed to a torch function
that needs a tensor (the fuzz case: logsigmoid of an int called on a Python number). Each op
is compared in float64 with plain torch of the same formula, the numbers as scalar tensors.
"""

from __future__ import annotations

import math

import pytest
import torch
from spec_ops import build_ops

DTYPE = torch.float64
F = torch.nn.functional

# formula of x (Tensor), n (int) and a (float) -> plain torch of it, numbers as float64 scalars
CASES = {
    "log_sigmoid_int": ("x * log(sigmoid(n))", lambda x, n, a: x * torch.log(torch.sigmoid(n))),
    "log_sigmoid_product": ("x * log(sigmoid(n * a))", lambda x, n, a: x * torch.log(torch.sigmoid(n * a))),
    "neg_softplus": ("x - 2 * softplus(-n)", lambda x, n, a: x - 2 * F.softplus(-n)),
    "log_sigmoid_far": ("x * log(sigmoid(-1000 * a))", lambda x, n, a: x * F.logsigmoid(-1000 * a)),
    "logaddexp": ("x * log(exp(n) + exp(a))", lambda x, n, a: x * torch.logaddexp(n, a)),
    "logaddexp_far": ("x * log(exp(900 * a) + exp(n))", lambda x, n, a: x * torch.logaddexp(900 * a, n)),
    "hypot": ("x * sqrt(n ** 2 + a ** 2)", lambda x, n, a: x * torch.hypot(n, a)),
    "sinc": ("x * sin(n * a) / (n * a)", lambda x, n, a: x * torch.sin(n * a) / (n * a)),
    "power": ("x * log(sigmoid(n)) ** 2", lambda x, n, a: x * torch.log(torch.sigmoid(n)) ** 2),
    "mixed": ("log(sigmoid(n)) * log(sigmoid(x))", lambda x, n, a: torch.log(torch.sigmoid(n)) * F.logsigmoid(x)),
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory):
    specs = {
        name: f"name: {name}\ninputs: {{x: Tensor, n: int = 3, a: float = 0.5}}\noutputs:\n  y: {formula}\n"
        for name, (formula, _) in CASES.items()
    }
    return build_ops(tmp_path_factory.mktemp("numbers"), "number_ops", specs)


@pytest.mark.parametrize("n, a", [(3, 0.5), (-2, 1.5), (40, -0.25)])
@pytest.mark.parametrize("name", sorted(CASES))
def test_rewritten_functions_of_numbers_match_torch(ops, name: str, n: int, a: float) -> None:
    _, reference = CASES[name]
    x = torch.linspace(-2, 2, 7, dtype=DTYPE, requires_grad=True)
    y = getattr(ops, name)(x, n, a)
    expected = reference(x, torch.tensor(float(n), dtype=DTYPE), torch.tensor(a, dtype=DTYPE))
    assert math.isfinite(float(expected.detach().abs().max()))
    torch.testing.assert_close(y, expected)
    (got,) = torch.autograd.grad(y.sum(), x)
    (want,) = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(got, want)
