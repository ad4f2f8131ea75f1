"""The base class of every autograd Function of dgl_exact: its backward's gradients own their storage (rule 9).

Autograd sums the gradients of a tensor that several ops read (``ft`` read by two score products and an
aggregation) in its input buffer, in place into the first gradient that arrives where torch may (no grad mode,
a dense tensor that is not a view, whose storage nothing else holds), else out of place: one more buffer of
the tensor's size at the backward's peak. A backward that forms its gradient in a buffer of another shape and
returns ``buffer.view(shape)`` (or ``reshape``) returns a view, which still holds its base: torch then sums out
of place. :class:`Function` returns each such view as ``view.detach()`` (the same storage, no view link; the
base dies with the backward's frame), so that torch's own test decides. Not where the gradient itself must be
differentiable (``create_graph``: grad mode is on) nor while compiling.
"""
from __future__ import annotations

import functools

import torch

from .._compat import compiling

__all__ = ["Function", "owned"]


def owned(grad):
    """``grad`` (a backward's output: a tensor, None or anything else) as a tensor that is not a view: a view
    is detached (the same storage and values, no base kept alive); others are returned as they are."""
    if isinstance(grad, torch.Tensor) and grad._base is not None:
        return grad.detach()
    return grad


def _owning(backward):
    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        out = backward(ctx, *grads)
        if torch.is_grad_enabled() or compiling():  # create_graph: the gradient's own graph must stay
            return out
        return tuple(owned(g) for g in out) if isinstance(out, tuple) else owned(out)

    return wrapper


class Function(torch.autograd.Function):
    """``torch.autograd.Function`` whose subclasses' ``backward`` returns gradients that own their storage
    (module doc; rule 9 of :mod:`.keep`). Subclass it exactly as ``torch.autograd.Function``."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        backward = cls.__dict__.get("backward")
        if backward is not None:
            fn = backward.__func__ if isinstance(backward, staticmethod) else backward
            cls.backward = staticmethod(_owning(fn))
