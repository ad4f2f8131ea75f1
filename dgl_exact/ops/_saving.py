"""What an autograd function keeps for backward, and how.

``stash(x, cfg)`` decides how an activation is kept:

* a tensor without ``grad_fn`` (input features, parameters, constants) is alive anyway: keep it by
  reference, at no cost; replacing it with a compressed copy would *add* memory. The exception is a
  tensor one of dgl_exact's ops just produced without autograd (e.g. the neighbour mean of input
  features that need no gradient): it is marked *fresh*, nobody else keeps it, so it is compressed;
* with compression disabled, keep the tensor itself (as plain autograd would);
* otherwise keep a :class:`~dgl_exact.compression.CompressedTensor`.

``save(ctx, ...)`` / ``load(ctx)`` pass any mix of tensors, compressed tensors and ``None`` through
``ctx.save_for_backward``, so saved-tensor hooks (memory meters, CPU offloading) see everything kept.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from ..compression import CompressedTensor, compress, decompress
from ..config import CompressionConfig

Stashed = Union[torch.Tensor, CompressedTensor, None]


_FRESH = "_dgl_exact_fresh"


def alive_anyway(x: torch.Tensor) -> bool:
    """True for tensors autograd did not create (leaves: data, parameters, constants), unless a dgl_exact
    op produced them as temporaries (see :func:`fresh_outputs`)."""
    return x.grad_fn is None and not getattr(x, _FRESH, False)


def fresh_outputs(fn):
    """Decorator for public ops: outputs computed without autograd are temporaries nobody else keeps;
    mark them so a later op compresses rather than references them. An output sharing storage with an
    input (an op that returned its input, or a view of it) is not fresh."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        inputs = None
        for t in (out if isinstance(out, tuple) else (out,)):
            if isinstance(t, torch.Tensor) and t.grad_fn is None and not t.requires_grad:
                if inputs is None:
                    inputs = {a.untyped_storage().data_ptr() for a in (*args, *kwargs.values())
                              if isinstance(a, torch.Tensor)}
                if t.untyped_storage().data_ptr() not in inputs:
                    setattr(t, _FRESH, True)
        return out

    return wrapper


def stash(x: Optional[torch.Tensor], cfg: CompressionConfig, force: bool = False) -> Stashed:
    """Keep ``x`` for backward: by reference if it is alive anyway or compression is off, else compressed.
    ``force`` compresses even a leaf (used for per-edge tensors nobody else keeps)."""
    if x is None:
        return None
    if not cfg.enabled or (alive_anyway(x) and not force):
        return x.detach()
    return compress(x, cfg)


def unstash(item: Stashed) -> Optional[torch.Tensor]:
    if item is None or isinstance(item, torch.Tensor):
        return item
    return decompress(item)


def save(ctx, *items: Stashed) -> None:
    tensors, layout = [], []
    for item in items:
        if item is None:
            layout.append(None)
        elif isinstance(item, CompressedTensor):
            shell, ts = item.split()
            layout.append((shell, len(ts)))
            tensors.extend(ts)
        elif isinstance(item, torch.Tensor):
            layout.append(1)
            tensors.append(item)
        else:
            raise TypeError(f"cannot save {type(item).__name__} for backward")
    ctx.save_for_backward(*tensors)
    ctx._dgl_exact_layout = layout


def load(ctx) -> list:
    """The saved items, compressed ones still compressed (call :func:`unstash` to decode)."""
    tensors = iter(ctx.saved_tensors)
    out = []
    for entry in ctx._dgl_exact_layout:
        if entry is None:
            out.append(None)
        elif entry == 1:
            out.append(next(tensors))
        else:
            shell, n = entry
            out.append(shell.join([next(tensors) for _ in range(n)]))
    return out


def needs_saving(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether autograd will record the op (grad mode on and some input requires grad)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The autocast dtype for ``device_type`` if autocast is active there, else None."""
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except TypeError:  # torch < 2.4: no device argument
        if device_type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
        if device_type == "cpu" and torch.is_autocast_cpu_enabled():
            return torch.get_autocast_cpu_dtype()
    return None
