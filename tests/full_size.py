"""Counting full-size passes: the aten calls of a region of code whose result has a given number of
elements (the inputs' broadcast), shared by the structural tests of backward's work."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class FullSize(TorchDispatchMode):
    """Counts the aten calls that make a tensor of `numel` elements; with `views=False`, not the views
    (`expand`, `detach`), which read no memory."""

    def __init__(self, numel: int, views: bool = True) -> None:
        super().__init__()
        self.numel, self.views, self.count = numel, views, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if not self.views and (func.is_view or func.__name__ in ("detach", "alias")):
            return out
        results = out if isinstance(out, (tuple, list)) else (out,)
        self.count += any(isinstance(r, torch.Tensor) and r.numel() == self.numel for r in results)
        return out
