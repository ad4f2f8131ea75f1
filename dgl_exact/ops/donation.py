"""Donation (ownership rule 5, :mod:`.keep`): a caller gives a tensor up with :func:`donate`; the op it is
handed to may :func:`release` its memory once it has kept what its backward needs, or hand it back
(:func:`reclaim`) where it declined."""
from __future__ import annotations

import torch

from .._compat import compiling

__all__ = ["Donated", "Released", "donate", "reclaim", "release"]


class Donated(torch.Tensor):
    """The class of a tensor its owner gave up with :func:`donate`: it computes as a plain tensor (results
    of operations on it are plain tensors) until an op that was handed it :func:`release` s it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class Released(torch.Tensor):
    """The class of a donated tensor once released: its memory went back to the allocator (unless another
    tensor shares it); any use raises."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        raise RuntimeError(
            f"dgl_exact: this tensor was donated (dgl_exact.donate) to a module that has released its memory; "
            f"it cannot be used any more (by {name}). Donate only a tensor nothing reads after the call: write "
            f"`h = conv(g, dgl_exact.donate(h))`, and keep another tensor where you need its values later.")


def donate(x: torch.Tensor) -> torch.Tensor:
    """Give ``x`` up to the next dgl_exact module or op it is passed to: nothing reads ``x`` after that call
    (by any name), so the callee may free its memory as soon as it has kept what its backward needs,
    instead of when the call returns (``nn.Module.__call__`` and the caller's name hold it until then).
    Returns ``x`` itself, now of class :class:`Donated`; use it as ``h = conv(g, dgl_exact.donate(h))``.

    Donation is a permission, never a request: a callee releases ``x`` only where that cannot change what
    is computed or seen (training with grad, no hooks on the module, ``x`` kept compressed, not under
    torch.compile; :func:`dgl_exact.explain` says what happened). A released ``x`` raises on any use; views
    of it made before keep their values (and its memory). Parameters, leaves that require grad and tensor
    subclasses cannot be donated (TypeError); under torch.compile ``donate`` returns ``x`` unchanged."""
    if compiling():
        return x
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"dgl_exact.donate expects a torch.Tensor, got {type(x).__name__}")
    if type(x) is Donated:
        return x
    if type(x) is not torch.Tensor or (x.is_leaf and x.requires_grad):
        raise TypeError("dgl_exact.donate: only a plain tensor computed in this forward can be donated (not a "
                        f"parameter, a leaf that requires grad or a {type(x).__name__} subclass)")
    x.__class__ = Donated
    return x


def reclaim(x: torch.Tensor) -> torch.Tensor:
    """Take back a tensor donated to a callee that declined it (did not :func:`release` it, e.g. a fused
    path that refused and returned None so that the caller runs the modules instead): returns ``x`` itself
    as a plain tensor again. A released ``x`` raises (its memory is gone); a plain ``x`` is returned as is."""
    if type(x) is Released:
        raise RuntimeError("dgl_exact.reclaim: this tensor was released by the op it was donated to")
    if type(x) is Donated:
        x.__class__ = torch.Tensor
    return x


def release(x: torch.Tensor) -> bool:
    """Free the memory of a :class:`Donated` tensor ``x`` (its reference to its storage is dropped; the
    memory returns once no view shares it) and make any later use of ``x`` raise. For the callee ``x`` was
    donated to, once nothing it computes reads ``x`` again and its backward keeps no reference to ``x``
    (rule 5). Returns whether ``x`` was released (False: not donated)."""
    if type(x) is not Donated:
        return False
    with torch.no_grad():
        x.set_(torch.empty(0, dtype=x.dtype, device=x.device))
    x.__class__ = Released
    return True
