"""Recompute a segment of layers in the backward from its compressed input boundary ("INT2 + recompute").

Compressed activations still grow linearly with depth: every layer keeps its own codes. Split into
segments of ``L`` layers, a stack keeps only each segment's input (its *boundary*), compressed under the
run's configuration (:func:`dgl_exact.ops.keep.as_kept`), and, in the backward, decodes the boundary, runs
the segment's forward again with grad enabled (its layers then keep what they keep, for this segment
only) and back-propagates through it (``torch.utils.checkpoint`` with ``use_reentrant=False`` semantics,
except that the kept boundary is the compressed copy). During the forward nothing inside a segment is
kept: it runs under ``torch.no_grad()``.

**What the backward approximates.** The forward is exact (the segment runs on the true input). The
recomputed forward starts from the *decoded* boundary ``x_hat = x + e`` (``e``: the quantisation error,
zero mean under stochastic rounding), so every activation inside the segment that the backward reads
differs from the forward's by ``e`` propagated through up to ``L`` layers, and the ReLU and dropout masks of
the recompute are those of ``x_hat`` (dropout masks are replayed from the same seeds; ReLU masks may flip
where ``|pre-activation|`` is within the propagated error). The gradient is therefore no longer unbiased in
general (the layers are nonlinear in ``e``); its error grows with ``L``. With compression off (or a
boundary kept exactly) the boundary is the true input and the gradients equal those of the plain stack.

Randomness: ``fn`` must draw the same random numbers with and without grad. dgl_exact's dropout under
``no_grad`` uses torch's own dropout, so a segment takes its dropout seeds explicitly
(``ops.relu_dropout(..., seed=s)``, as :class:`dgl_exact.training.models.GCNII` does); the CPU generator's
state (and the CUDA one's where ``x`` is on a GPU) is also restored for the recompute, as
``torch.utils.checkpoint`` does. The compression inside the recompute draws its rounding noise from a
stream of the segment's own (:func:`dgl_exact.compression.seed_stream`, seeded in the forward), not from
the restored generator: otherwise it would reuse the very numbers the forward drew for the boundaries'
compression (this segment's and the next ones'), correlating their errors, which measurably biased the
gradient (a 5-layer GCNII under INT2, error of the 100-run mean gradient: 0.19 with the reused numbers,
0.10 with a stream of its own; plain INT2 0.01).

GCNII's fused stack has its own recomputed form (:mod:`dgl_exact.ops.gcn2_recompute`), which
:class:`~dgl_exact.training.models.GCNII` takes where the fused stack applies; this module runs the
modules in segments elsewhere.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

import torch

from ..compression import draw_seed, seed_stream
from ..compression_config import CompressionConfig
from .keep import as_kept, restore
from .double_backward import refuse_double_backward
from .saved import load_kept, save_kept
from .function import Function

__all__ = ["recompute_segment", "RECOMPUTE_DOUBLE_BACKWARD_MESSAGE"]

RECOMPUTE_DOUBLE_BACKWARD_MESSAGE = (
    "dgl_exact.ops.recompute: double backward (create_graph=True) through a recomputed segment is not "
    "supported: its backward re-runs the segment from a kept boundary. Train without recompute "
    "(`recompute=None`) and with compression off for double backward.")


class _Recompute(Function):
    @staticmethod
    def forward(ctx, fn, config, memo, buffers, n_args, x, *rest):
        args, params = rest[:n_args], rest[n_args:]
        ctx.fn, ctx.n_args, ctx.buffers = fn, n_args, buffers
        ctx.cpu_rng = torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state(x.device) if x.is_cuda else None
        ctx.arg_is_tensor = [isinstance(a, torch.Tensor) for a in args]
        ctx.plain_args = [None if t else a for a, t in zip(args, ctx.arg_is_tensor)]
        kept = [as_kept(x, config)]
        for a, t in zip(args, ctx.arg_is_tensor):
            if not t:
                continue
            if memo is not None and id(a) in memo and memo[id(a)][0] is a:
                kept.append(memo[id(a)][1])   # shared by every segment: kept once
                continue
            item = as_kept(a, config)
            if memo is not None:
                memo[id(a)] = (a, item)
            kept.append(item)
        save_kept(ctx, *kept, *params)
        ctx.n_kept = len(kept)
        ctx.noise_seed = draw_seed()   # the recompute's compression noise: a stream of the segment's own
        with torch.no_grad():
            out = fn(x, *args)
        return out

    @staticmethod
    def backward(ctx, grad):
        refuse_double_backward("recompute", RECOMPUTE_DOUBLE_BACKWARD_MESSAGE)
        items = load_kept(ctx)
        kept, params = items[:ctx.n_kept], items[ctx.n_kept:]
        needs = ctx.needs_input_grad[5:]
        x = restore(kept[0]).detach().requires_grad_(needs[0])
        decoded = iter(kept[1:])
        args, arg_needs = [], needs[1:1 + ctx.n_args]
        for plain, is_t, need in zip(ctx.plain_args, ctx.arg_is_tensor, arg_needs):
            args.append(restore(next(decoded)).detach().requires_grad_(need) if is_t else plain)
        snapshot = [b.clone() for b in ctx.buffers]
        devices = [x.device] if ctx.cuda_rng is not None else []
        with torch.random.fork_rng(devices=devices), seed_stream(ctx.noise_seed), torch.enable_grad():
            torch.set_rng_state(ctx.cpu_rng)
            if ctx.cuda_rng is not None:
                torch.cuda.set_rng_state(ctx.cuda_rng, x.device)
            out = ctx.fn(x, *args)
        with torch.no_grad():
            for b, s in zip(ctx.buffers, snapshot):   # e.g. batch norm's running statistics: updated once
                b.copy_(s)
        wanted_needs = [needs[0]] + [t and n for t, n in zip(ctx.arg_is_tensor, arg_needs)] + \
                       list(needs[1 + ctx.n_args:])
        targets = [t for t, n in zip([x] + args + list(params), wanted_needs) if n]
        got = iter(torch.autograd.grad(out, targets, grad, allow_unused=True) if targets and out.requires_grad
                   else [None] * len(targets))
        grads = []
        for t, n in zip([x] + args + list(params), wanted_needs):
            g = next(got) if n else None
            grads.append(torch.zeros_like(t) if n and g is None else g)
        return (None, None, None, None, None) + tuple(grads)


def recompute_segment(fn: Callable[..., torch.Tensor], x: torch.Tensor, *args, config: CompressionConfig,
                      params: Sequence[torch.Tensor] = (), memo: Optional[Dict] = None,
                      buffers: Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """``fn(x, *args)`` (one tensor out) keeping only ``x`` compressed under ``config`` (and the tensors
    among ``args``, also by :func:`.keep.as_kept`); the backward decodes them, re-runs ``fn`` with grad enabled
    from the decoded copies and returns the gradients of ``x``, of the tensor ``args`` and of ``params``
    (every parameter ``fn`` reads must be listed there: they receive no gradient otherwise).

    ``memo``: a dict shared by the segments of one forward, so a tensor passed to every segment (GCNII's
    ``h0``) is kept once. ``buffers``: tensors ``fn`` updates in place (batch norm's running statistics),
    restored after the recompute so they are updated once per step. Runs ``fn`` directly (plain autograd)
    where grad is disabled or nothing needs a gradient. Double backward raises. See the module docstring
    for what the backward approximates when ``x`` is kept compressed."""
    params = tuple(params)
    tensors = [x] + [a for a in args if isinstance(a, torch.Tensor)] + list(params)
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors):
        return fn(x, *args)
    return _Recompute.apply(fn, config, memo, tuple(buffers), len(args), x, *args, *params)
