"""Call-time checks of the named dimensions of tensor arguments, shared by the ops."""

import torch

# (argument name, what the caller passed, its named dimensions or None)
Argument = tuple[str, object, tuple[str, ...] | None]


def check_shapes(op: str, *arguments: Argument, divisible: dict[str, int] | None = None) -> None:
    """Raise ValueError unless each (name, tensor, dims) argument has its named dimensions.

    `dims` None: a tensor of any shape, which must broadcast with the other such arguments;
    `divisible`: the dimensions the formulas cut into equal parts (`x[..., :D // 2]`), and into how many.
    """
    sizes: dict[str, tuple[int, str]] = {}  # dimension -> (size, the argument it was read from)
    batches: list[tuple[str, tuple[int, ...]]] = []
    plain: list[tuple[str, tuple[int, ...]]] = []
    for name, tensor, dims in arguments:
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{op}(): argument '{name}' must be a Tensor, not {type(tensor).__name__}")
        if dims is None:
            plain.append((name, tuple(tensor.shape)))
            continue
        batch = dims[:1] == ("...",)
        named = dims[1:] if batch else dims
        shape = tuple(tensor.shape)
        fits = len(shape) >= len(named) if batch else len(shape) == len(named)
        if fits:
            for dim, size in zip(named, shape[len(shape) - len(named) :], strict=True):
                literal = (int(dim), "its type") if dim.isdigit() else (size, name)  # `Tensor[..., 4]`
                factor, star, base = dim.partition("*")
                if star and factor.isdigit():  # `2*H`: a size 2 divides, whose half is H
                    fits = fits and size % int(factor) == 0
                    dim, size, literal = base, size // int(factor), (size // int(factor), name)
                fits = fits and sizes.setdefault(dim, literal)[0] == size
        if not fits:
            known = [
                f"{d}={sizes[d][0]} (from '{sizes[d][1]}')"
                for d in named
                if d in sizes and sizes[d][1] not in (name, "its type")
            ]
            where = f" with {', '.join(known)}" if known else ""
            raise ValueError(f"{op}(): argument '{name}' must have shape [{', '.join(dims)}]{where}, got {list(shape)}")
        if batch:
            batches.append((name, shape[: len(shape) - len(named)]))
    for dim, parts in (divisible or {}).items():
        if dim in sizes and sizes[dim][0] % parts:
            size, source = sizes[dim]
            what = "halves" if parts == 2 else f"{parts} equal parts"
            raise ValueError(
                f"{op}(): dimension {dim} of '{source}' has size {size}, which is not divisible by {parts};"
                f" the op cuts {dim} into {what} (e.g. x[..., :{dim} // 2])"
            )
    if len(batches) > 1:
        try:
            torch.broadcast_shapes(*(b for _, b in batches))  # type: ignore[no-untyped-call, unused-ignore]
        except RuntimeError:
            described = ", ".join(f"'{name}' has {list(b)}" for name, b in batches)
            raise ValueError(f"{op}(): the batch dimensions `...` do not broadcast: {described}") from None
    if len(plain) > 1:
        try:
            torch.broadcast_shapes(*(s for _, s in plain))  # type: ignore[no-untyped-call, unused-ignore]
        except RuntimeError:
            described = ", ".join(f"'{name}' has shape {list(s)}" for name, s in plain)
            raise ValueError(f"{op}(): the arguments do not broadcast together: {described}") from None
