"""Generated code is typed (Note [typed generated code] in opgen/emit/annotations.py): `mypy
--strict` passes on `generated/` and on a package of unusual specs, finds a caller's type errors
against the generated signatures, and the annotations are the types the ops take and return."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

import pytest
import torch
from spec_ops import build_ops

ROOT = Path(__file__).resolve().parent.parent

# Optional inputs, int and bool inputs, several outputs (one not differentiable), a Module whose
# `bias` parameter exists `when:` its bool arg says, a forward-only default after a Tensor?.
GATE = """
name: gate
inputs:
  x: Tensor
  weight: Tensor
  bias: Tensor?
  shift: Tensor?
  k: int = 2
  flag: bool = true
outputs:
  y: x * weight * k * flag + bias + shift
  z: exp(x) * weight
  mask: {formula: x > 0, differentiable: false}
module:
  name: Gate
  args:
    size: int
    bias: bool = true
  parameters:
    weight: {shape: [size], init: normal(0, 1)}
    bias: {shape: [size], init: zeros, when: bias}
  attributes:
    k: size
"""

# An op named after a builtin the annotations use, a Module named `Any`, an input named `float`.
TUPLE = """
name: tuple
inputs:
  x: Tensor
  float: float = 0.5
outputs:
  a: x * float
  b: tanh(x)
module:
  name: Any
  args:
    float: float = 1.5
"""

# What a user's typed code may and may not do with the ops; `# error` marks the lines mypy must flag.
USER_CODE = """
import torch

from typed_ops import Any, Gate, GateFunction, gate, tuple as pair
from generated import Linear, linear, silu, swish

x = torch.randn(3)
y: torch.Tensor = silu(x)
a, b = pair(x, 2.0)
out, z, mask = gate(x, x, None, k=3)
first: torch.Tensor = Gate(3)(x)[0]
swished: torch.Tensor = swish(x, beta=2)
applied: torch.Tensor = GateFunction.apply(x, x, None, None, 2, True)[1]
layer: torch.nn.Module = Linear(3, 4, bias=False)
module_out: tuple[torch.Tensor, torch.Tensor] = Any()(x)
silu("x")  # error
silu(x, 2.0)  # error
wrong: torch.Tensor = gate(x, x)  # error
linear(x, x, 1.0)  # error
swish(x, beta="2")  # error
Gate(size=3.5)  # error
pair(x)[2]  # error
"""


def _mypy(*paths: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # A cache that outlives the test: torch's stubs take most of a cold run.
    cache = Path(tempfile.gettempdir()) / "opgen-mypy-cache"
    command = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache), "--no-error-summary", *paths]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)


# The custom_op form, with a residual (`tanh(x)`, from its companion op): the package's
# `_custom_ops.py` and the generated tests' opcheck are typed too.
CUSTOM = """
name: shrink
form: custom_op
inputs:
  x: Tensor
outputs:
  y: x - tanh(x)
"""


# A whole-tensor mean of two plain Tensors: its count is `torch.broadcast_shapes(...).numel()`, a
# call torch leaves untyped.
MEAN = """
name: mean_squared
inputs:
  x: Tensor
  y: Tensor
outputs:
  loss: mean((x - y)**2)
"""


@pytest.fixture(scope="module")
def typed_ops(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, typing.Any]:
    root = tmp_path_factory.mktemp("typed")
    return root, build_ops(root, "typed_ops", {"gate": GATE, "tuple": TUPLE, "shrink": CUSTOM, "mean_squared": MEAN})


def test_mypy_strict_passes_on_generated_code_and_flags_wrong_calls(typed_ops: tuple[Path, typing.Any]) -> None:
    """One mypy run (torch's stubs are the slow part): the golden package, the unusual one and a
    user's module; errors only on the user's marked lines."""
    root, _ = typed_ops
    (root / "generated").symlink_to(ROOT / "generated", target_is_directory=True)
    (root / "user_code.py").write_text(USER_CODE)
    result = _mypy("generated", "typed_ops", "user_code.py", cwd=root)
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    flagged = {int(line.split(":")[1]) for line in errors if line.startswith("user_code.py:")}
    marked = {n for n, line in enumerate(USER_CODE.splitlines(), 1) if line.endswith("# error")}
    assert [line for line in errors if not line.startswith("user_code.py:")] == [], result.stdout
    assert flagged == marked, result.stdout
    assert result.returncode == 1, result.stdout + result.stderr


def test_annotations_are_the_types_ops_take_and_return(typed_ops: tuple[Path, typing.Any]) -> None:
    _, ops = typed_ops
    t = torch.Tensor
    assert typing.get_type_hints(ops.gate) == {
        "x": t,
        "weight": t,
        "bias": t | None,
        "shift": t | None,
        "k": int,
        "flag": bool,
        "return": tuple[t, t, t],
    }
    assert typing.get_type_hints(ops.tuple) == {"x": t, "float": float, "return": tuple[t, t]}
    assert typing.get_type_hints(ops.Gate.forward) == {
        "x": t,
        "shift": t | None,
        "flag": bool,
        "return": tuple[t, t, t],
    }
    assert typing.get_type_hints(ops.Gate.__init__) == {"size": int, "bias": bool, "return": type(None)}
    assert typing.get_type_hints(ops.Any.extra_repr) == {"return": str}
    function = typing.get_type_hints(ops.GateFunction.backward)
    assert function["return"] == tuple[t | None, t | None, t | None, t | None, None, None]
    jvp = typing.get_type_hints(ops.GateFunction.jvp)
    assert (jvp["tangent_bias"], jvp["tangent_k"], jvp["return"]) == (t | None, type(None), tuple[t, t, None])
    # The op is named `tuple`: its module writes the builtin `builtins.tuple`, and still works.
    source = (Path(ops.__file__).parent / "ops" / "tuple.py").read_text()
    assert "import builtins\n" in source and re.search(r"-> builtins\.tuple\[", source)
    x = torch.randn(3, dtype=torch.float64)
    a, b = ops.tuple(x, 2.0)
    torch.testing.assert_close(a, 2 * x)
    torch.testing.assert_close(ops.Any()(x)[1], torch.tanh(x))
