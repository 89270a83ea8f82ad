"""The work benchmark (benchmarks/work.py) counts what it says: aten calls of backward, the full
passes among them and the bytes saved for it, on toy ops whose counts are known by hand."""

from __future__ import annotations

import torch
from conftest import ROOT, import_package

from benchmarks import work


class Square(torch.autograd.Function):
    """`x * x`, saving `x`; backward is two multiplications."""

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (2 * x)


def test_a_function_counts_its_backward_calls_passes_and_saved_bytes():
    x = torch.rand(10, 3, requires_grad=True)
    counted = work.count_work(Square.apply, [x])
    # Unpacking the saved `x` detaches it (a view: no pass), then two multiplications sweep x.
    assert counted.names == ("detach", "mul", "mul")
    assert (counted.calls, counted.passes, counted.saved) == (3, 2, 30 * 4)


def test_plain_autograd_counts_each_saved_storage_once():
    x = torch.rand(10, 3, requires_grad=True)
    counted = work.count_work(lambda x: x * x, [x])
    # MulBackward saves x twice (one storage), computes grad * x twice and the engine adds them.
    assert sorted(counted.names) == ["add", "detach", "detach", "mul", "mul"]
    assert (counted.passes, counted.saved) == (3, 30 * 4)


def test_views_are_calls_but_not_passes_and_a_reduction_is_a_pass():
    x, w = torch.rand(10, 3, requires_grad=True), torch.rand(3, requires_grad=True)
    counted = work.count_work(lambda x, w: (x * w).sum(), [x, w])
    assert sorted(n for n in counted.names if n != "detach") == ["expand", "mul", "mul", "sum", "view"]
    assert counted.passes == 3  # the two products and the sum over x's shape
    assert counted.saved == (30 + 3) * 4


def test_outputs_limits_the_gradients_to_the_first_outputs():
    x = torch.rand(10, 3, requires_grad=True)
    both = work.count_work(lambda x: (x.exp(), x.sin()), [x])
    first = work.count_work(lambda x: (x.exp(), x.sin()), [x], outputs=1)
    assert first.names == ("detach", "mul")  # exp's gradient reads its saved result
    assert both.calls > first.calls
    assert first.saved == both.saved == 2 * 30 * 4  # the forward saves for both either way


def test_the_benchmark_prints_a_row_per_op_through_the_function(capsys):
    import_package(ROOT, "generated")
    assert work.main(["--ops", "mish", "layer_norm", "--scale", "2"]) == 0
    out = capsys.readouterr().out
    assert "| mish |" in out and "| layer_norm |" in out
    generated = import_package(ROOT, "generated")
    module = __import__("generated.ops.mish", fromlist=["MishFunction"])
    with work.through_functions(module):
        y = generated.mish(torch.rand(3, requires_grad=True))
    assert isinstance(y.grad_fn, module.MishFunction._backward_cls)  # not the small call: the Function
    assert module.MishFunction.native_below > 0  # restored


def test_no_op_of_the_library_saves_more_than_plain_autograd_or_pytorchs_op():
    """Saved bytes, counted as the benchmark counts them: at most plain autograd's of the formula or
    PyTorch's own op's, for every spec whose gradient is derived (a wrapped phase once saved both its
    inputs where plain autograd keeps the one wrapped difference). A surrogate gradient (`gradients:`)
    reads what plain autograd of the formula, whose gradient is 0, never needs."""
    import_package(ROOT, "generated")
    from benchmarks.run import load_specs

    over = {}
    for spec in load_specs(ROOT / "specs", lambda s: not s.gradients):
        counted = work.measure(spec.name, 2, "generated", work.literal_sizes(spec))
        bounds = [counted["naive"].saved] + ([counted["native"].saved] if "native" in counted else [])
        if counted["generated"].saved > max(bounds):
            over[spec.name] = (counted["generated"].saved, bounds)
    assert not over, over
