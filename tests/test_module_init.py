"""A parameter's `init:` from the module's constructor args (Note [init from constructor args] in
opgen.spec.parse_init): `constant(alpha)`, nn.Linear's `uniform(-1 / sqrt(in_features), ...)`,
`normal(0, std)`. Each module built with a non-default arg has its parameter initialised from it,
compared with `torch.nn.init` called by hand on the same random stream.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from spec_ops import build_ops

from opgen.spec.model import Init

SNAKE = """\
name: snake
inputs:
  x: Tensor[..., C]
  a: Tensor[C]
outputs:
  y: x + sin(a * x) ** 2 / a
module:
  name: Snake
  args:
    channels: int
    alpha: float = 1.0
  parameters:
    a: {shape: [channels], init: constant(alpha)}
"""

LINEAR = """\
name: dense
inputs:
  input: Tensor[..., N, in_features]
  weight: Tensor[out_features, in_features]
  bias: Tensor[out_features]?
outputs:
  out: input @ weight.T + bias
module:
  name: Dense
  args:
    in_features: int
    out_features: int
    bias: bool = true
    std: float = 0.02
  parameters:
    weight: {shape: [out_features, in_features], init: uniform(-1 / sqrt(in_features), 1 / sqrt(in_features))}
    bias: {shape: [out_features], init: "normal(0, 2 * std ** 2 + pi - pi)", when: bias}
"""


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory):
    folder: Path = tmp_path_factory.mktemp("module_init")
    return build_ops(folder, "module_init_ops", {"snake": SNAKE, "dense": LINEAR})


def test_constant_init_takes_the_constructor_arg(ops) -> None:
    assert torch.equal(ops.Snake(5).a.detach(), torch.ones(5))
    snake = ops.Snake(5, alpha=0.3)
    assert torch.equal(snake.a.detach(), torch.full((5,), 0.3))
    snake.alpha = 2.5  # reset_parameters reads the module's arg as it is now
    snake.reset_parameters()
    assert torch.equal(snake.a.detach(), torch.full((5,), 2.5))


def test_uniform_bounds_and_normal_std_from_the_constructor_args(ops) -> None:
    torch.manual_seed(7)
    dense = ops.Dense(9, 3, std=0.5)
    torch.manual_seed(7)
    weight, bias = torch.empty(3, 9), torch.empty(3)
    torch.nn.init.uniform_(weight, -1 / math.sqrt(9), 1 / math.sqrt(9))
    torch.nn.init.normal_(bias, 0.0, 2 * 0.5**2)
    torch.testing.assert_close(dense.weight.detach(), weight, rtol=0, atol=0)
    torch.testing.assert_close(dense.bias.detach(), bias, rtol=0, atol=0)
    assert dense.weight.abs().max() <= 1 / 3
    assert ops.Dense(9, 3, bias=False).bias is None
    x = torch.randn(2, 9)
    torch.testing.assert_close(dense(x), x @ dense.weight.T + dense.bias)


def test_plain_numbers_stay_numbers_and_arithmetic_stays_checked_text() -> None:
    from opgen.errors import Loc
    from opgen.spec.load import RawScalar
    from opgen.spec.model import Input
    from opgen.spec.parse_common import parse_type
    from opgen.spec.parse_init import parse_init

    loc = Loc("s.yaml", 3, 5)
    args = [Input("in_features", parse_type("int", loc, allow_tensor=False), loc)]
    assert parse_init(RawScalar("uniform(-0.1, 0.1)", loc, False), "w", args) == Init("uniform", (-0.1, 0.1))
    found = parse_init(RawScalar("uniform(-1/sqrt(in_features), 2)", loc, False), "w", args)
    assert found == Init("uniform", ("-1 / sqrt(in_features)", 2.0))


def test_init_text_round_trips() -> None:
    init = Init("uniform", (-0.1, "1 / sqrt(in_features)"))
    assert str(init) == "uniform(-0.1, 1 / sqrt(in_features))"


@pytest.mark.parametrize(
    ("text", "argument"),
    [
        ("constant(1 / 0)", "1 / 0"),
        ("constant(10 ** 400)", "10 ** 400"),
        ("normal(0, 9 ** 9 ** 9)", "9 ** 9 ** 9"),
        ("constant(log(0))", "log(0)"),
        ("uniform(sqrt(-1), 1)", "sqrt(-1)"),
    ],
)
def test_arithmetic_on_numbers_alone_must_be_finite(text: str, argument: str) -> None:
    """`1 / 0` would raise ZeroDivisionError in reset_parameters(), `10 ** 400` OverflowError: located now."""
    from opgen.errors import Loc, SpecError
    from opgen.spec.load import RawScalar
    from opgen.spec.parse_init import parse_init

    with pytest.raises(SpecError, match="is not a finite number") as raised:
        parse_init(RawScalar(text, Loc("s.yaml", 3, 5), False), "w", [])
    assert (raised.value.loc.line, raised.value.loc.col) == (3, 5 + text.index(argument))


def test_finite_arithmetic_on_numbers_stays_text() -> None:
    from opgen.errors import Loc
    from opgen.spec.load import RawScalar
    from opgen.spec.parse_init import parse_init

    found = parse_init(RawScalar("constant(2 ** 0.5 * pi)", Loc("s.yaml", 3, 5), False), "w", [])
    assert found == Init("constant", ("2 ** 0.5 * pi",))
