"""The inputs the generated tests sample: their shapes, and the wrong shape the functional must reject.

Named dimensions get the sizes `tests.shapes` gives, else small distinct defaults; inputs without
named dimensions get `DEFAULT_SHAPE` (a trailing part of it for the broadcast samples); the
Module's parameters fit the sampled inputs (`parameter_sizes`).
"""

from __future__ import annotations

import re
from dataclasses import replace

from opgen.formula.syntax import reduces_every_dim
from opgen.formula.tensor import BATCH
from opgen.spec import quote
from opgen.spec.model import Spec

DEFAULT_SHAPE = (3, 4)
DEFAULT_DIM = {0: 3, 1: 4, 2: 5, 3: 2}
BATCH_SHAPE = (2,)  # batch dimensions `...` of the batched samples


def shape_error(spec: Spec) -> dict[str, object] | None:
    """A wrong shape for one input, which the functional must reject at call time.

    Preferably a named dimension that an earlier input fixed, given another size (the inner
    dimensions of `@` disagree); else a rank that the declaration does not allow.
    """
    shapes = sample_shapes(spec, False)
    seen: set[str] = set()
    for k, inp in enumerate(spec.inputs):
        if not inp.is_tensor or not inp.type.dims or inp.name in dict(spec.tests.shapes):
            continue
        named = [d for d in inp.type.dims if d != BATCH]
        shared = [d for d in named if d in seen]
        if shared:
            wrong = list(shapes[inp.name])
            position = len(wrong) - len(named) + named.index(shared[0])
            wrong[position] += 1
            return {
                "name": inp.name,
                "index": k,
                "shape": wrong,
                "match": _pattern(f"argument '{inp.name}' must have shape"),
            }
        seen.update(named)
    for k, inp in enumerate(spec.inputs):
        if inp.is_tensor and inp.type.dims:
            batch = inp.type.dims[:1] == (BATCH,)
            if batch and len(inp.type.dims) == 1:
                continue
            wrong = [] if batch else [2, *shapes[inp.name]]
            return {
                "name": inp.name,
                "index": k,
                "shape": wrong,
                "match": _pattern(f"argument '{inp.name}' must have shape"),
            }
    return _broadcast_error(spec, shapes)


def _broadcast_error(spec: Spec, shapes: dict[str, tuple[int, ...]]) -> dict[str, object] | None:
    """Two inputs without named dimensions whose shapes cannot broadcast: the last one's last
    dimension made one longer than another input's (which is longer than 1)."""
    plain = [(k, i) for k, i in enumerate(spec.inputs) if i.is_tensor and i.type.dims is None]
    if len(plain) < 2 or len(spec.tensor_inputs) != len(plain):
        return None
    k, last = plain[-1]
    other = next((shapes[i.name] for _, i in plain[:-1] if shapes[i.name] and shapes[i.name][-1] > 1), None)
    if other is None:
        return None
    wrong = [*shapes[last.name][:-1], other[-1] + 1] if shapes[last.name] else [other[-1] + 1]
    return {"name": last.name, "index": k, "shape": wrong, "match": _pattern("do not broadcast together")}


def _pattern(message: str) -> str:
    """A string literal of the regular expression that matches `message` as it is."""
    return quote.string(re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", message))


def with_cut_sizes(spec: Spec, divisible: dict[str, int]) -> Spec:
    """`spec` with sample sizes, for the dimensions its formulas cut into equal parts, that those parts
    divide (the default rounded up to a multiple); sizes the spec gives stay as they are."""
    given = dict(spec.tests.shapes)
    sizes = dim_sizes(spec)
    added = tuple((d, (-(-sizes[d] // k) * k,)) for d, k in divisible.items() if d in sizes and d not in given)
    return replace(spec, tests=replace(spec.tests, shapes=spec.tests.shapes + added)) if added else spec


def dim_sizes(spec: Spec) -> dict[str, int]:
    """The size each named dimension has in the sampled inputs."""
    shapes = dict(spec.tests.shapes)
    dims: dict[str, int] = {}
    for inp in spec.tensor_inputs:
        for dim in inp.type.dims or ():
            factor, star, base = dim.partition("*")  # `2*H`: twice H's size (Note [multiples of a dimension])
            for name in (base, dim) if star else (dim,):
                if name != BATCH and name not in dims:
                    literal = (int(name),) if name.isdigit() else None  # `Tensor[..., 4]`: Note [literal sizes]
                    if name == dim and star:
                        literal = (int(factor) * dims[base],)
                    dims[name] = (literal or shapes.get(name, (DEFAULT_DIM.get(len(dims), 3),)))[0]
    return dims


def sample_shapes(spec: Spec, broadcast: bool, batch: tuple[int, ...] = ()) -> dict[str, tuple[int, ...]]:
    """Sample shapes; inputs with batch dimensions `...` get `batch` in front, and `BATCH_SHAPE` when
    a formula reduces over every dimension: `var(norm(x, dim=-1))` of an `x` without a batch is the
    variance of one number, NaN, though the op is right."""
    if not batch and reduces_every_dim(spec):
        batch = BATCH_SHAPE
    shapes = dict(spec.tests.shapes)
    result = {}
    dims = dim_sizes(spec)
    for inp in spec.tensor_inputs:
        if inp.name in shapes:
            result[inp.name] = shapes[inp.name]
        elif inp.type.dims is not None:
            front = batch if inp.type.dims[:1] == (BATCH,) else ()
            result[inp.name] = front + tuple(dims[d] for d in inp.type.dims if d != BATCH)
        else:
            result[inp.name] = DEFAULT_SHAPE
    if broadcast:
        first = True
        for inp in spec.tensor_inputs:
            if inp.type.dims is None and inp.name not in shapes:
                if not first:
                    result[inp.name] = DEFAULT_SHAPE[1:]
                first = False
    return result


def parameter_sizes(spec: Spec) -> dict[str, int]:
    """The int args that size a parameter, each with the size its input has in the samples.

    `weight: {shape: [normalized_shape]}` for `weight: Tensor[D]` gives `normalized_shape`
    the sample size of D, so the Module's parameters fit the sampled inputs as the
    functional's arguments do; shapes align from the last dimension, as broadcasting does.
    """
    assert spec.module is not None
    samples = sample_shapes(spec, False)
    sizes: dict[str, int] = {}
    for param in spec.module.parameters:
        sample = samples.get(param.name, ())
        for entry, size in zip(reversed(param.shape), reversed(sample), strict=False):
            if isinstance(entry, str):
                sizes.setdefault(entry, size)
    return sizes
