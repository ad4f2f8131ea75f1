"""Kept items decoded through the op that made them (rules 10 and 11 of :mod:`.keep`): what an op keeps for
backward, at no cost of its own, where its ``y`` was made from something already kept.

* :class:`LinearOf`: ``y = x W^T + b``, the output of dgl_exact's linear, kept as that linear's kept ``x`` (its
  compressed copy, or ``x`` itself where that is data, or an :class:`ElementwiseOf`), ``W`` and ``b`` (rule 10).
* :class:`ElementwiseOf`: ``y`` made by elementwise ops from a kept root: a dropout of data ``x`` (input
  features: alive anyway), kept as ``x`` itself and the mask's seed (rule 11: exact, the mask regenerated from
  its counter-based seed element for element, so no bytes and no noise); or batch norm, then activations and
  dropout, kept as the batch norm's compressed copy of its input, its per-channel scale and shift, the
  activations' one-bit masks and the dropout's seed (rule 12: unbiased, no bytes beyond the batch norm's copy).

Both split into a shell and tensors for ``ctx.save_for_backward`` (:func:`~.saved.save_kept`) and join back, as a
:class:`~dgl_exact.compression.CompressedTensor` does; :func:`~.keep.restore` decodes one whole and
:func:`~.chunks.row_chunks` row chunk by row chunk. Which ``y`` may be kept so is decided in :mod:`.keep`.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .. import kernels
from ..compression import CompressedTensor

__all__ = ["Derived", "LinearOf", "ElementwiseOf", "Affine", "Mask", "Drop", "is_exact"]


class Derived:
    """Base of the kept items decoded through the op that made them (``isinstance`` checks name this class)."""

    shape: torch.Size


class LinearOf(Derived):
    """A kept ``y = x W^T + b`` (rule 10): the kept ``x`` of the dgl_exact linear that made ``y`` (its compressed
    copy, ``x`` itself where that is data, or an :class:`ElementwiseOf`), ``weight`` and ``bias``; ``shape``: the shape
    ``y`` is kept as (a view of the whole output, rows first, so row ``r`` of ``y`` comes from row ``r`` of
    ``x``). Decoded by :func:`~.keep.restore` or row chunk by row chunk (:func:`~.chunks.row_chunks`)."""

    def __init__(self, x, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], shape: torch.Size):
        self.x, self.weight, self.bias, self.shape = x, weight, bias, torch.Size(shape)

    @property
    def device(self) -> torch.device:
        return self.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    def rows(self, x_rows: torch.Tensor) -> torch.Tensor:
        """The rows of ``y`` made from decoded rows ``x_rows`` of ``x``."""
        y = F.linear(x_rows.to(self.weight.dtype), self.weight, self.bias)
        return y.reshape((x_rows.shape[0],) + tuple(self.shape[1:]))

    def split(self):
        """``(shell, tensors)`` as :meth:`CompressedTensor.split <dgl_exact.compression.CompressedTensor.split>`
        gives them (for ``ctx.save_for_backward``); :meth:`join` rebuilds."""
        shell_x, xs = self.x.split() if isinstance(self.x, (CompressedTensor, Derived)) else (None, (self.x,))
        shell = LinearOf(shell_x, None, None, self.shape)
        shell.n_x, shell.has_bias = len(xs), self.bias is not None
        return shell, tuple(xs) + ((self.weight,) if self.bias is None else (self.weight, self.bias))

    def join(self, tensors) -> "LinearOf":
        """Inverse of :meth:`split`."""
        xs, rest = tensors[:self.n_x], tensors[self.n_x:]
        x = xs[0] if self.x is None else self.x.join(list(xs))
        return LinearOf(x, rest[0], rest[1] if self.has_bias else None, self.shape)

    def __repr__(self) -> str:
        return f"LinearOf(shape={tuple(self.shape)}, x={self.x!r})"


class Affine:
    """Step ``v * scale + shift`` per channel (dim 1; ``scale``, ``shift`` ``[C]``), in their dtype, then cast to
    ``dtype``: a batch norm's output from its input."""

    def __init__(self, scale: Optional[torch.Tensor], shift: Optional[torch.Tensor], dtype: torch.dtype):
        self.scale, self.shift, self.dtype = scale, shift, dtype

    def tensors(self):
        return (self.scale, self.shift)

    def with_tensors(self, ts) -> "Affine":
        return Affine(ts[0], ts[1], self.dtype)

    def apply(self, v: torch.Tensor, start: int) -> torch.Tensor:
        return torch.addcmul(self.shift, v.to(self.scale.dtype), self.scale).to(self.dtype)  # one pass


class Mask:
    """Step ``where(mask, v, v * slope) * scale`` with the one-bit ``mask`` an activation kept for its own backward
    (``packed``: element ``e`` of the whole tensor, row-major): ReLU (``slope`` 0), fused ReLU-dropout (``scale``
    ``1 / (1 - p)``, the mask ``x > 0 and kept``), leaky ReLU."""

    def __init__(self, packed: Optional[torch.Tensor], slope: float, scale: float):
        self.packed, self.slope, self.scale = packed, float(slope), float(scale)

    def tensors(self):
        return (self.packed,)

    def with_tensors(self, ts) -> "Mask":
        return Mask(ts[0], self.slope, self.scale)

    def apply(self, v: torch.Tensor, start: int) -> torch.Tensor:
        if start % 8 == 0:  # on a whole byte (row chunks of a compressed root are): the kernel's one fused pass
            return kernels.get("masked_scale", v.device)(v.contiguous(), self.packed[start // 8:], self.scale,
                                                         self.slope * self.scale)
        first = start // 8  # the byte holding element ``start``; its bits before ``start`` are dropped
        bits = kernels.get("unpack_mask", v.device)(self.packed[first:], start + v.numel() - first * 8)
        m = bits[start - first * 8:].view(v.shape)
        other = v * self.slope if self.slope != 0.0 else torch.zeros((), dtype=v.dtype, device=v.device)
        out = torch.where(m, v, other)
        return out * self.scale if self.scale != 1.0 else out


class Drop:
    """Step: dgl_exact's dropout with ``p`` and ``seed`` (the kernels' counter-based mask, from any element on)."""

    def __init__(self, p: float, seed: int):
        self.p, self.seed = float(p), int(seed)

    def tensors(self):
        return ()

    def with_tensors(self, ts) -> "Drop":
        return self

    def apply(self, v: torch.Tensor, start: int) -> torch.Tensor:
        return kernels.get("dropout_at", v.device)(v.contiguous(), self.p, self.seed, start)


class ElementwiseOf(Derived):
    """A kept ``y`` made from a kept ``root`` by elementwise ops (rules 11 and 12): ``steps`` (:class:`Affine`,
    :class:`Mask`, :class:`Drop`) applied in order. ``root`` is a tensor (data, alive anyway, under dropouts: exact,
    each step bit for bit what the op computed; or a batch norm's input kept by reference: exact up to the
    affine step's rounding) or a batch norm's compressed copy of its input (unbiased: every step is affine in
    its input given the masks, which are exact). Decoded whole or row chunk by row chunk
    (:func:`~.chunks.row_chunks`: the root's chunks, each step applied from the chunk's first element on)."""

    def __init__(self, root, steps: tuple, shape: torch.Size):
        self.root, self.steps, self.shape = root, tuple(steps), torch.Size(shape)
        self.root_node = None  # the root's autograd node, for rule 6's check (not saved)

    @property
    def device(self) -> torch.device:
        return self.root.device

    @property
    def dtype(self) -> torch.dtype:
        for step in reversed(self.steps):
            if isinstance(step, Affine):
                return step.dtype
        return self.root.dtype

    def rows(self, root_rows: torch.Tensor, r0: int) -> torch.Tensor:
        """Rows ``r0:r0 + len(root_rows)`` of ``y`` from the same rows of the decoded root."""
        n = self.shape[0] if len(self.shape) else 1
        start = r0 * (self.shape.numel() // max(n, 1))
        v = root_rows.reshape((root_rows.shape[0],) + tuple(self.shape[1:])) if len(self.shape) else root_rows
        for step in self.steps:
            v = step.apply(v, start)
        return v

    def split(self):
        """``(shell, tensors)`` for ``ctx.save_for_backward`` (the root through it: torch's version check applies
        to data); :meth:`join` rebuilds."""
        shell_root, ts = self.root.split() if isinstance(self.root, CompressedTensor) else (None, (self.root,))
        steps, tensors = [], list(ts)
        for step in self.steps:
            st = step.tensors()
            steps.append((step, len(st)))
            tensors.extend(st)
        shell = ElementwiseOf(shell_root, (), self.shape)
        shell.layout = (len(ts), steps)
        return shell, tuple(tensors)

    def join(self, tensors) -> "ElementwiseOf":
        """Inverse of :meth:`split`."""
        n_root, steps = self.layout
        root = tensors[0] if self.root is None else self.root.join(list(tensors[:n_root]))
        i, out = n_root, []
        for step, k in steps:
            out.append(step.with_tensors(tensors[i:i + k]))
            i += k
        return ElementwiseOf(root, tuple(out), self.shape)

    def __repr__(self) -> str:
        names = ", ".join(type(s).__name__ for s in self.steps)
        return f"ElementwiseOf(shape={tuple(self.shape)}, steps=[{names}], root={type(self.root).__name__})"


def is_exact(item) -> bool:
    """Whether a kept item decodes to exactly what it stands for: a tensor, an :class:`ElementwiseOf` of data, or
    a :class:`LinearOf` of an exact ``x`` (no quantization noise: rule 6's conditions on shared draws do not
    apply)."""
    if isinstance(item, LinearOf):
        return is_exact(item.x)
    if isinstance(item, ElementwiseOf):
        return isinstance(item.root, torch.Tensor)
    return isinstance(item, torch.Tensor)
