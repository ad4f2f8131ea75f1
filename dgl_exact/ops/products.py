"""Elementwise products of activations, compressed: ``a * b`` keeps, for each operand's gradient, the other
operand; torch keeps it in fp32 (an attention layer's ``(ft * self.attn_l).sum(-1)`` keeps the whole ``ft``,
layer-sized, for the attention vector's gradient). :func:`compressed_products` runs such products, inside its
scope, as :class:`Product`: each operand the other's gradient needs is kept by :func:`~.keep.as_kept`: compressed
where it is an activation (the gradient ``sum(g * a)`` is linear in it, so the stochastic rounding stays
unbiased), by reference where it is alive anyway (a parameter, a leaf) or compression is off. Values are
torch's; gradients with compression off are torch's. The backward forms each gradient in row chunks of the kept
operand (:func:`operand_grad`): no full-size decoded copy, and no output-sized product for an operand broadcast
over the rows.

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
from ..compression import CompressedTensor
from .chunks import linear_of_row_sum, needs_chunks, row_chunks
from .double_backward import double_backward
from .derived import Derived, LinearOf
from .keep import Kept, alive_anyway, as_kept, op_inputs, restore
from .saved import load_kept, save_kept
from .torch_routes import route, scope
from .function import Function

__all__ = ["Product", "compressed_products", "operand_grad"]

_PRODUCTS = frozenset({torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__})


class Product(Function):
    """``a * b`` (broadcast) keeping each operand the other's gradient needs through :func:`~.keep.as_kept`."""

    @staticmethod
    def forward(ctx, a, b, cfg: CompressionConfig):
        need_a, need_b = ctx.needs_input_grad[:2]
        ctx.shapes = (a.shape, b.shape)
        save_kept(ctx, as_kept(a, cfg, via_linear=True) if need_b else None,
                  as_kept(b, cfg, via_linear=True) if need_a else None)
        return a * b

    @staticmethod
    def backward(ctx, grad):
        a_s, b_s = load_kept(ctx)
        need_a, need_b = ctx.needs_input_grad[:2]
        # raises where an operand is compressed; else (create_graph) the products as written, differentiable
        whole = double_backward("mul", a_s, b_s)
        ga = operand_grad(grad, b_s, ctx.shapes[0], whole) if need_a else None
        gb = operand_grad(grad, a_s, ctx.shapes[1], whole) if need_b else None
        return ga, gb, None


def operand_grad(grad: torch.Tensor, other: Kept, shape: torch.Size, whole: bool = False) -> torch.Tensor:
    """``(grad * other).sum_to_size(shape)``: the gradient of the operand of ``shape`` in ``a * b``, ``other`` the
    kept other operand. Where ``other`` has the output's rows and is large enough to chunk, it is formed in row
    chunks (:func:`~.chunks.row_chunks`): a compressed ``other`` has no full-size decoded copy, and an operand
    broadcast over the rows (an attention vector ``[1, H, D]``) no output-sized product either (each chunk's
    product is reduced before the next chunk is decoded). The chunked sums differ from the product as written
    only in float summation order. ``whole``: the product as written (a differentiable gradient)."""
    padded = (1,) * (grad.dim() - len(shape)) + tuple(shape)
    over_rows = grad.dim() > 0 and padded[0] == 1 and grad.shape[0] > 1
    if over_rows and not whole and isinstance(other, LinearOf):  # through the linear's input, no decoded ``other``
        total = linear_of_row_sum(grad, other)
        if total is not None:
            return total.unsqueeze(0).sum_to_size(padded).reshape(shape)
    chunked = (not whole and len(other.shape) == grad.dim() > 0 and other.shape[0] == grad.shape[0]
               and needs_chunks(other) and (over_rows or isinstance(other, (CompressedTensor, Derived))))
    if not chunked:
        return (grad * restore(other)).sum_to_size(shape)
    out = None if over_rows else grad.new_empty(padded)
    for r0, r1, x in row_chunks(other):
        part = (grad[r0:r1] * x).sum_to_size((1 if over_rows else r1 - r0,) + padded[1:])
        if not over_rows:
            out[r0:r1] = part
        else:
            out = part if out is None else out.add_(part)
        del x, part  # before the next chunk is decoded (see row_chunks)
    return out.reshape(shape)


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
    with op_inputs(a, b):  # rule 6: a keeper shares a copy only where its other operand was not computed from it
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
