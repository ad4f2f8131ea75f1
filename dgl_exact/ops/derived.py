"""Kept items decoded through the op that made them (rules 10 and 11 of :mod:`.keep`): what an op keeps for
backward, at no cost of its own, where its ``y`` was made from something already kept.

* :class:`LinearOf`: ``y = x W^T + b``, the output of dgl_exact's linear, kept as that linear's kept ``x`` (its
  compressed copy, or ``x`` itself where that is data, or a :class:`DropoutOf`), ``W`` and ``b`` (rule 10).
* :class:`DropoutOf`: ``y = dropout(x, p)`` of data ``x`` (input features: alive anyway), kept as ``x`` itself
  and the mask's seed (rule 11). Exact: the mask is regenerated from its counter-based seed, element for
  element as the forward drew it, so no bytes and no noise.

Both split into a shell and tensors for ``ctx.save_for_backward`` (:func:`~.saved.save_kept`) and join back, as a
:class:`~dgl_exact.compression.CompressedTensor` does; :func:`~.keep.restore` decodes one whole and
:func:`~.chunks.row_chunks` row chunk by row chunk. Which ``y`` may be kept so is decided in :mod:`.keep`.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..compression import CompressedTensor
from ..kernels.reference import dropout_at

__all__ = ["Derived", "LinearOf", "DropoutOf", "is_exact"]


class Derived:
    """Base of the kept items decoded through the op that made them (``isinstance`` checks name this class)."""

    shape: torch.Size


class LinearOf(Derived):
    """A kept ``y = x W^T + b`` (rule 10): the kept ``x`` of the dgl_exact linear that made ``y`` (its compressed
    copy, ``x`` itself where that is data, or a :class:`DropoutOf`), ``weight`` and ``bias``; ``shape``: the shape
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


class DropoutOf(Derived):
    """A kept ``y = dropout(x, p)`` of data ``x`` (rule 11): ``x`` itself (alive anyway), ``p`` and the seed of
    the mask dgl_exact's dropout drew (the kernels' counter-based mask: element ``e`` of ``x``, in row-major
    order, is kept where ``u(seed, e) >= p``). Decoded exactly, whole or by rows (:meth:`row_range`)."""

    def __init__(self, x: Optional[torch.Tensor], p: float, seed: int, shape: torch.Size):
        self.x, self.p, self.seed, self.shape = x, float(p), int(seed), torch.Size(shape)

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype

    def row_range(self, r0: int, r1: int) -> torch.Tensor:
        """Rows ``r0:r1`` of ``y``, as the forward computed them."""
        n = self.shape[0] if len(self.shape) else 1
        per_row = self.shape.numel() // max(n, 1)
        x = self.x.reshape(self.shape)[r0:r1] if len(self.shape) else self.x
        return dropout_at(x, self.p, self.seed, r0 * per_row)

    def split(self):
        """``(shell, (x,))`` for ``ctx.save_for_backward`` (``x`` through it: torch's version check applies)."""
        return DropoutOf(None, self.p, self.seed, self.shape), (self.x,)

    def join(self, tensors) -> "DropoutOf":
        return DropoutOf(tensors[0], self.p, self.seed, self.shape)

    def __repr__(self) -> str:
        return f"DropoutOf(shape={tuple(self.shape)}, p={self.p})"


def is_exact(item) -> bool:
    """Whether a kept item decodes to exactly what it stands for: a tensor, a :class:`DropoutOf`, or a
    :class:`LinearOf` of an exact ``x`` (no quantization noise: rule 6's conditions on shared draws do not
    apply)."""
    if isinstance(item, LinearOf):
        return is_exact(item.x)
    return isinstance(item, (torch.Tensor, DropoutOf))
