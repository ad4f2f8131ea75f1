"""Elementwise products of activations, compressed: ``a * b`` keeps, for each operand's gradient, the other
operand; torch keeps it in fp32 (an attention layer's ``(ft * self.attn_l).sum(-1)`` keeps the whole ``ft``,
layer-sized, for the attention vector's gradient). :func:`compressed_products` runs such products, inside its
scope, as :class:`Product`: each operand the other's gradient needs is kept by :func:`~.keep.stash`: compressed
where it is an activation (the gradient ``sum(g * a)`` is linear in it, so the stochastic rounding stays
unbiased), by reference where it is alive anyway (a parameter, a leaf) or compression is off. Values are
torch's; gradients with compression off are torch's.

The scope is entered with :func:`dgl_exact.ops.message_passing`, around every converted model's forward. Only
out-of-place products of two floating-point tensors of one dtype and device are taken (``torch.mul``,
``Tensor.mul``, ``*``), in grad mode with compression on and where some kept operand is an activation; the
rest (in-place ``mul_``, scalars, mixed dtypes, products nothing keeps) run as torch runs them.
"""
from __future__ import annotations

import contextlib
import contextvars
from functools import partial
from typing import Iterator

import torch

from .._compat import compiling
from ..compression_config import CompressionConfig, resolve_config
from .double_backward import double_backward
from .keep import alive_anyway, stash, unstash
from .saved import load_kept, save_kept
from .torch_routes import route, scope

__all__ = ["Product", "compressed_products"]

_PRODUCTS = frozenset({torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__})


class Product(torch.autograd.Function):
    """``a * b`` (broadcast) keeping each operand the other's gradient needs through :func:`~.keep.stash`."""

    @staticmethod
    def forward(ctx, a, b, cfg: CompressionConfig):
        need_a, need_b = ctx.needs_input_grad[:2]
        ctx.shapes = (a.shape, b.shape)
        save_kept(ctx, stash(a, cfg) if need_b else None, stash(b, cfg) if need_a else None)
        return a * b

    @staticmethod
    def backward(ctx, grad):
        a_s, b_s = load_kept(ctx)
        need_a, need_b = ctx.needs_input_grad[:2]
        double_backward("mul", a_s, b_s)  # raises where an operand is compressed; else the ops below are exact
        ga = (grad * unstash(b_s)).sum_to_size(ctx.shapes[0]) if need_a else None
        gb = (grad * unstash(a_s)).sum_to_size(ctx.shapes[1]) if need_b else None
        return ga, gb, None


def _plain(x) -> bool:
    """A tensor or a parameter (a tensor subclass, which may override torch functions, is left to torch)."""
    return type(x) in (torch.Tensor, torch.nn.Parameter)


def _taken(a, b) -> bool:
    """Whether ``a * b`` runs as :class:`Product`: two floating tensors of one dtype and device, recorded by
    autograd, and an operand torch would keep that is an activation (not alive anyway)."""
    if not (_plain(a) and _plain(b)) or a.dtype != b.dtype or not a.is_floating_point() or a.device != b.device:
        return False
    return (b.requires_grad and not alive_anyway(a)) or (a.requires_grad and not alive_anyway(b))


def _product(a, b, cfg: CompressionConfig):
    # a frame of its own: what a routed product keeps is dgl_exact's decision, while the mode's own frame
    # only passes calls on (dgl_exact.explain tells them apart by the frame's name)
    return Product.apply(a, b, cfg)


def _route(args, kwargs):
    """A product of two positional operands, taken (:func:`_taken`) in grad mode with compression on, outside
    dynamo's tracing: a call of :func:`_product` (else None: torch runs it)."""
    if kwargs or len(args) != 2 or not torch.is_grad_enabled() or compiling() or not _taken(*args):
        return None
    cfg = resolve_config(None)
    return partial(_product, args[0], args[1], cfg) if cfg.enabled else None


_on: contextvars.ContextVar = contextvars.ContextVar("dgl_exact_compressed_products", default=False)
route(_on, dict.fromkeys(_PRODUCTS, _route))


@contextlib.contextmanager
def compressed_products(enabled: bool = True) -> Iterator[None]:
    """Within this scope, elementwise products of activations keep their operands as :class:`Product` does
    (see the module doc), at the configuration in force; nestable (``enabled=False``: torch's own inside).
    The routing mode (:mod:`.torch_routes`) is pushed by the outermost enabled scope of a thread or task, not
    while dynamo traces (modes do not compose with it), and no product is taken while it traces."""
    with scope(_on, enabled, push=not compiling()):
        yield
