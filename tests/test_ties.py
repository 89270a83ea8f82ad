"""Gradients at ties and kinks equal plain autograd of the formula, `let`s included.

The reference is the formula in plain torch, each `let` a real intermediate tensor
(`opgen.formula.reference`, which the generated tests use too), differentiated by autograd in
float64; the points are ties and kinks: inputs equal to each other, to 0 and to the
numbers of the formula. First and second derivatives are compared
(Note [tensor-valued lets] in opgen.derive.gradients, Note [kink conventions] in opgen.formula.functions).

`OPGEN_TIES_FORMULAS=200 pytest tests/test_ties.py` runs a longer random search.
"""

from __future__ import annotations

import importlib
import itertools
import math
import os
import re
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import strategies as st
from spec_ops import build_ops

import opgen.emit.tests
from opgen.errors import Problems
from opgen.formula.python_source import source as python_source
from opgen.formula.reference import reference_tree
from opgen.spec.load import load_file
from opgen.spec.model import Spec
from opgen.spec.parse import parse_spec

DTYPE = torch.float64
GRID = (-1.0, 0.0, 0.5, 1.0)  # every combination of these for x, y, z: ties everywhere


def _tensor(value: object) -> torch.Tensor:
    return torch.as_tensor(value, dtype=DTYPE)


def tensor_valued(spec: Spec) -> frozenset[str]:
    """Names holding tensors in plain torch: Tensor inputs and whatever is computed from one."""
    held = {i.name for i in spec.tensor_inputs}
    formulas = [(x.name, x.formula) for x in spec.lets] + [(o.name, o.formula) for o in spec.outputs]
    for _ in formulas:  # lets come in any order: enough rounds to reach every dependency
        held |= {name for name, f in formulas if re.search(rf"\b({'|'.join(held)})\b", f.text)}
    return frozenset(held)


def plain_torch(spec: Spec):
    """The spec's formulas as plain torch, lets as intermediate tensors (lets come in dependency order here)."""
    names = {n: n for n in [i.name for i in spec.inputs] + [x.name for x in spec.lets] + [o.name for o in spec.outputs]}
    tensors = tensor_valued(spec)
    lines = [f"{name} = T({name})" for name in (i.name for i in spec.inputs if not i.is_tensor)]
    for name, formula in [(x.name, x.formula) for x in spec.lets] + [(o.name, o.formula) for o in spec.outputs]:
        lines.append(f"{name} = {python_source(reference_tree(formula, names, 'T', 'torch', 'math', tensors=tensors))}")
    outputs = ", ".join(o.name for o in spec.outputs)
    source = f"def reference({', '.join(i.name for i in spec.inputs)}):\n"
    source += "".join(f"    {line}\n" for line in lines) + f"    return ({outputs},)\n"
    namespace: dict[str, object] = {"torch": torch, "math": math, "T": _tensor}
    exec(source, namespace)  # noqa: S102 - our own translation of our own test formulas
    return namespace["reference"]


def derivatives(f, args: list, wrt: list[int] | None = None) -> list[torch.Tensor]:
    """Values, first derivatives along fixed directions, and second derivatives of those.

    `f(*args)` returns the differentiable outputs; `wrt` are the positions of the tensors to
    differentiate by (all tensors when None); the other arguments are passed as they are.
    """
    wrt = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor)] if wrt is None else wrt
    args = [
        a.detach().clone().requires_grad_(k in wrt) if isinstance(a, torch.Tensor) else a for k, a in enumerate(args)
    ]
    leaves = [args[k] for k in wrt]
    outs = f(*args)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    directions = [torch.linspace(-1.0, 1.5, o.numel(), dtype=DTYPE).reshape(o.shape) for o in outs]
    live = [(o, d) for o, d in zip(outs, directions, strict=True) if o.requires_grad]  # steps have no graph
    first = [torch.zeros_like(x) for x in leaves]
    if live:
        first = list(
            torch.autograd.grad(
                [o for o, _ in live],
                leaves,
                [d for _, d in live],
                create_graph=True,
                allow_unused=True,
                materialize_grads=True,
            )
        )
    weights = [torch.linspace(0.5, 2.0, g.numel(), dtype=DTYPE).reshape(g.shape) for g in first]
    total = sum((g * w).sum() for g, w in zip(first, weights, strict=True))
    second = [torch.zeros_like(x) for x in leaves]
    if isinstance(total, torch.Tensor) and total.requires_grad:
        second = list(torch.autograd.grad(total, leaves, allow_unused=True, materialize_grads=True))
    return [*(o.detach() for o in outs), *(g.detach() for g in first), *second]


def assert_same_derivatives(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        label = f"item {k} of values, first derivatives, second derivatives"
        finite = torch.isfinite(w)  # the guard of `where` makes the op finite where plain torch is not
        torch.testing.assert_close(g[finite], w[finite], msg=lambda m, label=label: f"{what}: {label}: {m}")


def grid(count: int) -> list[torch.Tensor]:
    columns = list(zip(*itertools.product(GRID, repeat=count), strict=True))
    return [torch.tensor(c, dtype=DTYPE) for c in columns]


# -- the issue's examples, against hand-written torch ------------------------------------------

ISSUE = {
    "tie_of_lets": """
        name: tie_of_lets
        inputs: {x: Tensor, y: Tensor, z: Tensor}
        let: {a: min(x, y), b: min(x, z)}
        outputs: {o: max(a, b)}
    """,
    "one_let_twice": """
        name: one_let_twice
        inputs: {x: Tensor}
        let: {l0: 2 * x}
        outputs: {o: max(l0, l0) + min(l0, l0)}
    """,
    "output_of_output": """
        name: output_of_output
        inputs: {x: Tensor, y: Tensor}
        outputs: {a: x * y, o: max(a, x)}
    """,
    "abs_of_kinks": """
        name: abs_of_kinks
        inputs: {x: Tensor, y: Tensor}
        outputs: {o: abs(max(x, y)) + abs(clamp(x, y, y + 1)) + abs(where(x > 0, x, y))}
    """,
    "against_numbers": """
        name: against_numbers
        inputs: {x: Tensor}
        outputs: {o: x * min(x, 1) + x * max(x, 0.5) + exp(min(-x, 1))}
    """,
    "folded_numbers": """
        name: folded_numbers
        inputs: {x: Tensor}
        let: {l0: max(x, x), l1: tanh(max(l0 + l0, 0))}
        outputs: {o: min(l1, where(l1 < l1, l0, l1)) + clamp(l0 - l0, 0, 1) * x}
    """,
}


@pytest.fixture(scope="module")
def issue_ops(tmp_path_factory):
    return build_ops(tmp_path_factory.mktemp("ties"), "tie_ops", ISSUE)


def test_tie_between_two_lets_splits_like_torch_maximum(issue_ops):
    def by_hand(x, y, z):
        return torch.maximum(torch.minimum(x, y), torch.minimum(x, z))

    inputs = grid(3)
    assert_same_derivatives(derivatives(issue_ops.tie_of_lets, inputs), derivatives(by_hand, inputs), "max(a, b)")
    x, y, z = (torch.tensor([v], dtype=DTYPE, requires_grad=True) for v in (0.0, 1.0, 2.0))
    (dx,) = torch.autograd.grad(issue_ops.tie_of_lets(x, y, z), [x])
    assert dx.item() == 1.0  # x the smallest: both lets are x, and the tie gives x all of it


def test_one_let_against_itself(issue_ops):
    def by_hand(x):
        l0 = 2 * x
        return torch.maximum(l0, l0) + torch.minimum(l0, l0)

    inputs = grid(1)
    assert_same_derivatives(derivatives(issue_ops.one_let_twice, inputs), derivatives(by_hand, inputs), "max(l0, l0)")


def test_an_output_used_in_another_is_a_tensor(issue_ops):
    def by_hand(x, y):
        return torch.maximum(x * y, x)

    inputs = grid(2)
    got = derivatives(lambda x, y: issue_ops.output_of_output(x, y)[1], inputs)
    assert_same_derivatives(got, derivatives(by_hand, inputs), "max(a, x)")


def test_abs_of_a_kink_is_torch_abs_at_zero(issue_ops):
    """d abs(u) = sign(u) du, 0 at u = 0: not the NaN of `u / abs(u)` (Note [real kinks])."""

    def by_hand(x, y):
        return torch.maximum(x, y).abs() + torch.clamp(x, y, y + 1).abs() + torch.where(x > 0, x, y).abs()

    inputs = grid(2)
    assert_same_derivatives(derivatives(issue_ops.abs_of_kinks, inputs), derivatives(by_hand, inputs), "abs of kinks")


def test_double_backward_keeps_the_tie_rule_against_numbers(issue_ops):
    """Backward's own autograd gives the tie to the number, as the first derivative does (Note [printed ties])."""

    def by_hand(x):
        return (
            x * torch.where(x < 1, x, 1.0) + x * torch.where(x > 0.5, x, 0.5) + torch.exp(torch.where(-x < 1, -x, 1.0))
        )

    inputs = [torch.tensor([1.0, 0.5, -1.0, 0.0, 2.0], dtype=DTYPE)]
    assert_same_derivatives(
        derivatives(issue_ops.against_numbers, inputs), derivatives(by_hand, inputs), "x * min(x, 1)"
    )


def test_kinks_that_fold_to_numbers_are_computed(issue_ops):
    """`clamp(l0 - l0, 0, 1)` and a `min` of numbers left by a substitution are numbers, not a failure to generate."""

    def by_hand(x):
        l0 = torch.maximum(x, x)
        l1 = torch.tanh(torch.relu(l0 + l0))
        return torch.minimum(l1, torch.where(l1 < l1, l0, l1)) + torch.clamp(l0 - l0, 0, 1) * x

    inputs = grid(1)
    assert_same_derivatives(derivatives(issue_ops.folded_numbers, inputs), derivatives(by_hand, inputs), "folded")


# -- CELU, as users write it -------------------------------------------------------------------

CELU = {  # name: (formula, orders of derivative equal to F.celu's at x = 0)
    "celu_where": ("where(x >= 0, x, alpha * expm1(x / alpha))", 2),
    "celu_where_exp": ("where(x >= 0, x, alpha * (exp(x / alpha) - 1))", 2),
    "celu_where_strict": ("where(x > 0, x, alpha * (exp(x / alpha) - 1))", 1),
    "celu_max_min": ("max(0, x) + min(0, alpha * (exp(x / alpha) - 1))", 1),
    "celu_max_min_let": ("max(0, x) + min(0, negative)", 1),
}


@pytest.fixture(scope="module")
def celu_ops(tmp_path_factory):
    specs = {}
    for name, (formula, _) in CELU.items():
        let = "let: {negative: alpha * (exp(x / alpha) - 1)}\n" if "negative" in formula else ""
        specs[name] = f"name: {name}\ninputs: {{x: Tensor, alpha: float = 1.5}}\n{let}outputs: {{y: {formula}}}\n"
    return build_ops_only(tmp_path_factory.mktemp("celu"), "celu_ops", specs)


@pytest.mark.parametrize("name", sorted(CELU))
def test_celu_at_its_switch(celu_ops, tmp_path_factory, name):
    """Each form is plain autograd of itself at the ties of alpha; every form is F.celu at 0.

    `where(x >= 0, ...)` is F.celu to the second derivative (F.celu's double backward takes the
    branch `x >= 0` at 0); with `x > 0` the second derivative at 0 is the other branch's, 1/alpha.
    The max/min form's two kinks join into one differentiable function, which opgen writes as one
    selection `where(x > 0, x, ...)`: its slope at 0 is CELU's true slope 1, as F.celu's, where plain
    autograd of max and min takes torch.relu's 0 at each kink (docs/formula-language.md, "Gradients
    at kinks"). Away from 0 it is plain autograd.
    """
    formula, orders = CELU[name]
    alpha = 1.5
    x = torch.tensor([0.0, -0.0, -1.5, 1.5, -1.0, 1.0], dtype=DTYPE)
    op = getattr(celu_ops, name)
    folder = tmp_path_factory.mktemp("celu_spec")
    let = "let: {negative: alpha * (exp(x / alpha) - 1)}\n" if "negative" in formula else ""
    (folder / "specs").mkdir()
    text = f"name: {name}\ninputs: {{x: Tensor, alpha: float = 1.5}}\n{let}outputs: {{y: {formula}}}\n"
    (folder / "specs" / f"{name}.yaml").write_text(text)
    got = derivatives(op, [x, alpha], [0])
    plain = derivatives(plain_torch(read_spec(folder, name)), [x, alpha], [0])
    if "max(" in formula:  # the join is F.celu at 0 (below), plain autograd elsewhere
        away = x != 0
        got_away, plain_away = [g[away] for g in got], [p[away] for p in plain]
        assert_same_derivatives(got_away, plain_away, formula)
    else:
        assert_same_derivatives(got, plain, formula)
    native = derivatives(F.celu, [x, alpha], [0])
    # value, first derivative, second derivative
    for k in range(orders + 1):
        torch.testing.assert_close(got[k], native[k], msg=lambda m, k=k: f"{formula}: order {k}: {m}")
    if orders == 0:
        assert got[1][:2].tolist() == [0.0, 0.0]  # relu's choice at both kinks, which coincide at 0


# -- every spec of the library at its kinks ------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
SPEC_NAMES = sorted(p.stem for p in (ROOT / "specs").glob("*.yaml"))


def read_spec(folder: Path, name: str) -> Spec:
    problems = Problems()
    path = folder / "specs" / f"{name}.yaml"
    spec = parse_spec(load_file(path, str(path)), f"specs/{name}.yaml", problems)
    assert spec is not None, problems.report()
    return spec


def has_derived_gradient(name: str) -> bool:
    """Some Tensor input of the spec gets the derived gradient (no `gradients:` override replaces it)."""
    spec = read_spec(ROOT, name)
    return any(spec.override(i.name) is None for i in spec.tensor_inputs)


DERIVED_NAMES = [name for name in SPEC_NAMES if has_derived_gradient(name)]


def test_the_kink_test_covers_every_spec_with_a_derived_gradient():
    """`DERIVED_NAMES` are exactly the specs whose generated op has gradients checked against autograd."""
    assert SPEC_NAMES and DERIVED_NAMES
    checked = [name for name in SPEC_NAMES if importlib.import_module(f"generated.tests.test_{name}").OP.checked]
    assert DERIVED_NAMES == checked


def tie_values(module) -> list[float]:
    """0, +-1, the op's number arguments and `tests.points`, with their negatives: where its kinks are."""
    values = {0.0, 1.0, -1.0}
    for arg in module.sample_inputs():
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            values |= {float(arg), -float(arg)}
    for row in getattr(module, "POINTS", {}).values():
        values |= {float(v) for v in row}
    return sorted(values)


def tie_inputs(module) -> list:
    """The op's sample inputs with every tensor element replaced by a tie value, paired differently per input."""
    values = tie_values(module)
    args = []
    for k, arg in enumerate(module.sample_inputs()):
        if isinstance(arg, torch.Tensor):
            picks = [values[(i * (2 * k + 1) + k) % len(values)] for i in range(arg.numel())]
            arg = torch.tensor(picks, dtype=DTYPE).reshape(arg.shape)
        args.append(arg)
    return args


@pytest.mark.parametrize("name", DERIVED_NAMES)
def test_every_spec_matches_plain_autograd_at_its_kinks(name):
    """The committed op of each spec in `specs/` with a derived gradient against autograd of its generated
    reference (plain torch); an override is checked against its own formula by the generated tests."""
    module = importlib.import_module(f"generated.tests.test_{name}")
    op = module.OP
    args = tie_inputs(module)

    def outputs(reference: bool):
        def f(*a):
            if reference:
                values = module.reference(*a)
                return [values[op.outputs[k]] for k in op.differentiable]
            outs = op(*a)
            return [outs[k] for k in op.differentiable]

        return f

    wrt = list(op.checked)
    got, want = derivatives(outputs(False), args, wrt), derivatives(outputs(True), args, wrt)
    where = f"{name} at {[a.tolist() if isinstance(a, torch.Tensor) else a for a in args]}"
    first = len(got) - len(wrt)  # the position of the first second derivative
    differ = any(not torch.allclose(got[k], want[k], equal_nan=True) for k in range(first, len(got)))
    if differ and hasattr(module, "native") and len(op.differentiable) == 1:
        # A formula lowered to PyTorch's own kernel (opgen.optimize.lower) has that kernel's double backward,
        # whose choice at the kink may be the other branch's: F.elu's first derivative at 0 takes
        # x <= 0, its second x >= 0. There the op must equal the native op instead.
        native = derivatives(module.native, args, wrt)
        for k in range(first, len(got)):
            native_there = torch.isclose(got[k], native[k]) & ~torch.isclose(native[k], want[k])
            want[k] = torch.where(native_there, native[k], want[k])
    assert_same_derivatives(got, want, where)


# -- random formulas with lets -------------------------------------------------------------------

NUMBERS = ("0", "1", "-1", "0.5", "2")
COMPARE = (">", "<", ">=", "<=", "==", "!=")
FORMULAS = int(os.environ.get("OPGEN_TIES_FORMULAS", "40"))


KINDS = ("max", "min", "where", "+", "*", "-", "abs", "max0", "min0", "clamp", "exp", "tanh", "shift", "scale")


@st.composite
def formula(draw: st.DrawFn, names: list[str], depth: int = 3) -> str:
    """A formula over `names` with the kink functions; few leaves make ties likely.

    The simplest choice of each draw (what hypothesis tries first) is a kink, not a leaf.
    """
    if depth == 0 or draw(st.integers(0, 3)) == 3:
        return draw(st.sampled_from(names))  # numbers come with an operand: no subformula of numbers alone
    kind = draw(st.sampled_from(KINDS))
    a = draw(formula(names, depth - 1))
    if kind in ("abs", "exp", "tanh"):
        return f"{kind}({a})"
    if kind in ("shift", "scale"):
        number = draw(st.sampled_from(NUMBERS))
        return f"({a} + {number})" if kind == "shift" else f"({number} * {a})"
    if kind in ("max0", "min0"):
        return f"{kind[:3]}({a}, {draw(st.sampled_from(NUMBERS))})"
    if kind == "clamp":
        lo, hi = draw(st.sampled_from([("-1", "1"), ("0", "1"), ("0", "0.5"), ("-1", "0")]))
        return f"clamp({a}, {lo}, {hi})"
    b = draw(formula(names, depth - 1))
    if kind == "where":
        test, other = draw(st.sampled_from(COMPARE)), draw(formula(names, depth - 1))
        return f"where({a} {test} {b}, {draw(formula(names, depth - 1))}, {other})"
    if kind in ("max", "min"):
        return f"{kind}({a}, {b})"
    return f"({a} {kind} {b})"


@st.composite
def random_spec(draw: st.DrawFn) -> str:
    """The body of a spec (all but its name): one to three lets and an output using them."""
    names = ["x", "y", "z"]
    lets = []
    for k in range(draw(st.integers(1, 3))):
        lets.append(f"l{k}: {draw(formula(names))}")
        names.append(f"l{k}")
    output = draw(formula(names[3:], 2))
    lines = ["inputs: {x: Tensor, y: Tensor, z: Tensor}", "let:", *(f"  {let}" for let in lets)]
    lines += ["outputs:", f"  o: {output} + 0.25 * x * y * z"]  # always a function of the Tensor inputs
    return "\n".join(lines) + "\n"


def build_ops_only(folder: Path, package: str, specs: dict[str, str]):
    """`build_ops` without the generated test files, the slow part of generating, which is not needed here."""
    saved = opgen.emit.tests.emit_tests
    opgen.emit.tests.emit_tests = lambda plan, renderer, written=None: ""  # type: ignore[assignment]
    try:
        return build_ops(folder, package, specs)
    finally:
        opgen.emit.tests.emit_tests = saved


@settings(
    max_examples=FORMULAS,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each try generates an op; the spec is in the message
    suppress_health_check=list(HealthCheck),
)
@given(random_spec())
def test_random_formulas_with_lets_match_plain_autograd_at_ties(body):
    folder = Path(tempfile.mkdtemp(prefix="opgen_ties_"))
    text = f"name: r\n{body}"
    try:
        ops = build_ops_only(folder, "random_tie_op", {"r": text})
    except AssertionError as error:
        if "clamp() of a non-tensor value" in str(error):  # a clamped number is refused for now
            reject()
        raise
    inputs = grid(3)
    reference = plain_torch(read_spec(folder, "r"))
    got, want = derivatives(ops.r, inputs), derivatives(reference, inputs)
    accept_smooth_second_derivatives(reference, inputs, got, want)
    assert_same_derivatives(got, want, text)


def accept_smooth_second_derivatives(reference, inputs: list[torch.Tensor], got: list, want: list) -> None:
    """Where the function is smooth, its second derivative may be the true one instead of autograd's.

    SymPy folds `abs(u * u)` to `u**2`: the second derivative at u = 0 is then 2, where
    autograd of `torch.abs(u * u)` gives 0 (sign(0)). Where the op's second derivative
    differs from autograd's, it must equal the central difference of autograd's first
    derivatives, which is the true one where the function is smooth and matches neither
    convention at a real kink. (Elementwise formulas: each element depends on its own inputs.)
    """
    count = len(inputs)
    weights = [torch.linspace(0.5, 2.0, x.numel(), dtype=DTYPE).reshape(x.shape) for x in inputs]
    step = 1e-6

    def weighted_first(shifted: list[torch.Tensor]) -> torch.Tensor:
        firsts = derivatives(reference, shifted)[1 : 1 + count]
        return sum(w * g for w, g in zip(weights, firsts, strict=True))  # type: ignore[return-value]

    for j in range(count):
        k = 1 + count + j  # the second derivative by input j
        differs = ~torch.isclose(got[k], want[k])
        if not differs.any():
            continue
        up = [x + step if i == j else x for i, x in enumerate(inputs)]
        down = [x - step if i == j else x for i, x in enumerate(inputs)]
        central = (weighted_first(up) - weighted_first(down)) / (2 * step)
        smooth = differs & torch.isclose(got[k], central, rtol=1e-5, atol=1e-5)
        want[k] = torch.where(smooth, got[k], want[k])
