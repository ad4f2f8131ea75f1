"""Compress what autograd saves for ops dgl_exact does not know (the approach of ActNN and GACT).

``with dgl_exact.compress_saved(config, model=model): loss = model(g, x)`` installs
:func:`torch.autograd.graph.saved_tensors_hooks` whose pack hook stores each floating tensor autograd saves
for backward sign-exact (:mod:`dgl_exact.compression.signed`: the magnitudes as a
:class:`~dgl_exact.compression.CompressedTensor` at ``config``'s bits, no projection, plus 0-2 bits per
element of exact signs and zeros) and whose unpack hook decompresses it when the backward reads it.
``compress_model(model, saved_tensors=True)`` enters this scope around every training forward of ``model``.

What is kept as is:

* tensors autograd did not create (``grad_fn`` is None: parameters, buffers, input features, constants)
  and views of them: alive anyway, a compressed copy would *add* memory; with ``model=``, every storage of
  the model's parameters and buffers is also recognised (collected once per scope);
* tensors dgl_exact's own ops save (their compressed codes and metadata, and what they decided to keep
  exactly): :func:`dgl_exact.ops.saved.save_kept` registers them with the scope, so nothing is compressed twice;
* non-floating tensors (indices, masks), tensors smaller than ``min_bytes`` (default 64 KiB: metadata would
  dominate and the saving is negligible), non-contiguous views, and anything saved inside
  :func:`keep_exact`.

The same tensor saved by several ops (the same storage, offset, shape, stride and version, while the
tensor first saved is alive) is compressed once per scope and shared. With ``enabled=False`` (or
``config.enabled`` False) the scope does nothing.

**Masks are exact.** A backward that reads a mask from what it saved gets the exact mask in every draw,
so its gradient is exact (given exact incoming gradients): signs and zeros decode exactly (``relu``,
``leaky_relu``, ``prelu``, ``elu``, ``abs``, a ``threshold`` or ``clamp`` at 0 read no more); the functions
whose backward compares with another constant or another saved tensor (``clamp``, ``hardtanh``, ``relu6``,
``threshold``, ``hard/softshrink``, ``hardsigmoid``, ``hardswish``, ``maximum``/``minimum``/``fmax``/``fmin``,
``max``/``min``/``amax``/``amin``) run under :func:`keep_exact` (a torch-function mode, in force in the scope,
sees each outermost call): what they save stays as is, and a later save of the same tensor is not compressed
again. ``where``, ``max(dim=)``, max pooling and sorting save indices or booleans: never compressed.

**Caveat: bias.** Compression is unbiased (stochastic rounding), so a gradient is unbiased when the op's
backward is linear in the saved tensor (matmul, elementwise multiply, the weight gradient of a linear
layer), up to ``finfo.tiny`` per element (a nonzero whose magnitude rounds to 0 decodes to ``+-tiny``).
An op whose backward is *nonlinear* in what it saves (tanh, sigmoid, exp, division, norms) gets a
gradient biased by O(quantization step**2): the fallback trades that for memory. It is opt-in; the named
layers (:mod:`dgl_exact.nn`) document exactly what they keep and are preferred where they exist. Double
backward through a compressed saved tensor is not supported (the decompressed copy has no history), nor is
``torch.compile`` of a forward inside the scope (saved-tensor hooks are eager-mode machinery).
"""
from __future__ import annotations

import contextlib
import contextvars
import weakref
from typing import Iterator, Optional

import torch

from ._compat import storage_ptr
from .compression.signed import SignExactTensor, compress_sign_exact, decompress_sign_exact
from .compression_config import CompressionConfig, resolve_config
from .ops import keep as keeping
from .ops.saved import own_saved

__all__ = ["compress_saved", "keep_exact", "SavedTensorsStats"]

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_keep_exact_depth: contextvars.ContextVar = contextvars.ContextVar("dgl_exact_keep_exact", default=0)


class SavedTensorsStats:
    """What a :func:`compress_saved` scope did: ``compressed`` (tensors newly compressed), ``shared`` (saves
    answered from the cache), ``kept`` (saves passed through as is), ``bytes_before`` / ``bytes_after`` (the
    compressed tensors' sizes before and after compression)."""

    def __init__(self):
        self.compressed = self.shared = self.kept = 0
        self.bytes_before = self.bytes_after = 0

    def __repr__(self):
        return (f"SavedTensorsStats(compressed={self.compressed}, shared={self.shared}, kept={self.kept}, "
                f"bytes_before={self.bytes_before}, bytes_after={self.bytes_after})")


class _Packed:
    __slots__ = ("shell", "parts")

    def __init__(self, shell, parts):
        self.shell, self.parts = shell, parts


def _ptr(t: torch.Tensor) -> int:
    return storage_ptr(t)


@contextlib.contextmanager
def keep_exact() -> Iterator[None]:
    """Inside this block, saved-tensor compression (:func:`compress_saved`) keeps everything as is."""
    token = _keep_exact_depth.set(_keep_exact_depth.get() + 1)
    try:
        yield
    finally:
        _keep_exact_depth.reset(token)


def _mask_ops() -> frozenset:
    """The functions whose backward compares a saved tensor with a constant other than 0 or with another
    saved tensor (``hardtanh``: ``min < self < max``; ``clamp``; ``threshold``: ``self > threshold``;
    ``maximum``: ``self >= other``; ``amax``: ``self == result``; ...): no sign bit keeps that mask exact, so
    :func:`compress_saved` keeps what they save as is. Each as torch, ``torch.nn.functional`` and the
    ``Tensor`` method name it (a torch-function mode sees the outermost call only)."""
    global _MASK_OPS
    if _MASK_OPS is None:
        F = torch.nn.functional
        names = ("clamp", "clamp_", "clip", "clip_", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_",
                 "threshold", "threshold_", "hardtanh", "hardtanh_", "relu6", "hardshrink", "softshrink",
                 "hardsigmoid", "hardswish", "maximum", "minimum", "fmax", "fmin", "max", "min", "amax", "amin")
        found = set()
        for where in (torch, torch.Tensor, F, torch._C._nn):
            for name in names:
                fn = getattr(where, name, None)
                if fn is not None:
                    found.add(fn)
        _MASK_OPS = frozenset(found)
    return _MASK_OPS


_MASK_OPS: Optional[frozenset] = None


class _ExactMasks(torch.overrides.TorchFunctionMode):
    """Runs the functions of :func:`_mask_ops` inside :func:`keep_exact` (the rest as they are)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            masked = func in _mask_ops()
        except TypeError:  # an unhashable callable: not one of them
            masked = False
        if masked:
            with keep_exact():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def _outer_hooks():
    """The saved-tensor hooks in force around this scope (a memory meter's, say), to pack through them in
    turn; None where there are none, or where torch cannot tell (before 2.2: then the outer hooks do not see
    what this scope packs, as with any nested ``saved_tensors_hooks``)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top(False) if top is not None else None


@contextlib.contextmanager
def compress_saved(config: Optional[CompressionConfig] = None, *, model: Optional[torch.nn.Module] = None,
                   min_bytes: int = 64 * 1024, enabled: bool = True) -> Iterator[SavedTensorsStats]:
    """Compress the tensors autograd saves for backward inside this block (see the module doc).

    ``config``: the compression (None: the configuration in force; its ``kept_frac`` is ignored).
    ``model``: whose parameters and buffers are never compressed. Yields a :class:`SavedTensorsStats`."""
    stats = SavedTensorsStats()
    cfg = resolve_config(config)
    if not enabled or not cfg.enabled:
        yield stats
        return
    cfg = cfg.replace(kept_frac=1.0)
    static = set()
    if model is not None:
        static = {_ptr(t) for t in (*model.parameters(), *model.buffers())}
    own: set = set()  # storages dgl_exact's own ops keep (see ops.saved.save_kept)
    cache: dict = {}
    exact: dict = {}  # storage -> weakref of a tensor saved as is inside keep_exact (a mask-reading op's save)
    outer = _outer_hooks()
    outer_pack, outer_unpack = outer if outer is not None else (None, None)

    def passthrough(t):
        stats.kept += 1
        return outer_pack(t) if outer_pack is not None else t

    def pack(t):
        if (t.dtype not in _FLOATS or t.layout != torch.strided
                or t.numel() * t.element_size() < min_bytes or not t.is_contiguous() or t.dim() == 0
                or keeping.alive_anyway(t) or (t._base is not None and keeping.alive_anyway(t._base))):
            return passthrough(t)  # (a view of a leaf, e.g. a reshaped parameter, shares its storage)
        ptr = _ptr(t)
        if _keep_exact_depth.get():
            exact[ptr] = weakref.ref(t)  # kept as is: a later save of the same storage need not compress it
            return passthrough(t)
        held = exact.get(ptr)
        if ptr in static or ptr in own or (held is not None and held() is not None):
            return passthrough(t)
        key = (ptr, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t._version, t.dtype)
        hit = cache.get(key)
        # the cached tensor must still be alive: once it is freed, a new tensor may get the same address,
        # shape and version 0 and must not be answered with the old one's codes
        if hit is not None and hit[0]() is not None:
            stats.shared += 1
            return hit[1]
        c = compress_sign_exact(t, cfg)
        shell, parts = c.split()
        packed = _Packed(shell, [outer_pack(p) if outer_pack is not None else p for p in parts])
        cache[key] = (weakref.ref(t), packed)
        stats.compressed += 1
        stats.bytes_before += t.numel() * t.element_size()
        stats.bytes_after += sum(p.numel() * p.element_size() for p in parts)
        return packed

    def unpack(item):
        if isinstance(item, _Packed):
            parts = [outer_unpack(p) if outer_unpack is not None else p for p in item.parts]
            c: SignExactTensor = item.shell.join(parts)
            return decompress_sign_exact(c)
        return outer_unpack(item) if outer_unpack is not None else item

    try:
        with own_saved(own), torch.autograd.graph.saved_tensors_hooks(pack, unpack), _ExactMasks():
            yield stats
    finally:
        cache.clear()
        exact.clear()
