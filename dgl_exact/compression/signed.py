"""Sign-exact compression: a decoded nonzero keeps its sign and never becomes zero, a zero stays exactly zero,
and every value stays unbiased (the generic path, :func:`dgl_exact.compress_saved`, uses it).

Why: ``relu``'s backward reads ``result > 0`` from its saved output, ``leaky_relu``'s ``self > 0``, ``abs``'s
``sgn(self)``, ``elu``'s ``result <= 0``: a mask, not a value. Stochastic rounding of ``x`` against its group's
``[lo, hi]`` sends a small positive to ``lo``'s level (zero, or a negative level) with probability up to 1:
the mask flips and the gradient of that element is dropped in that draw, a bias no averaging removes.

How (the math): the magnitudes ``|x|`` are compressed (:func:`~dgl_exact.compression.compress`, unbiased:
``E[m] = |x|``, on a range ``[min |x|, max |x|]`` no wider than ``x``'s, so the variance is no larger) and
``x``'s sign class is kept exactly beside them, as few bits as the tensor needs (decided from three flags
read once per tensor):

============================  ==========================================  ==============
the tensor holds              kept exactly                                extra bits/elem
============================  ==========================================  ==============
one sign, no zeros            that sign (a flag)                          0
one sign and zeros (relu)     a ``nonzero`` bit                           1
both signs, no zeros          a ``negative`` bit                          1
both signs and zeros          both bits                                   2
============================  ==========================================  ==============

Decoding: ``x_hat = sign * m`` where ``x`` is nonzero, exactly ``0`` where it is zero; a nonzero whose
magnitude decodes to 0 (its group's range starts at 0 and it rounded down) decodes to ``sign * tiny`` instead
(``tiny``: the dtype's smallest normal number, ``2**-24`` for float16, a normal float32 number, so it
survives flush-to-zero). That is the one bias: ``E[x_hat] - x = sign * tiny * P(m = 0)``, at most ``tiny``
(``1.2e-38`` in float32 and bfloat16, ``6e-8`` in float16) per element. So a sign-reading backward sees the
exact mask in every draw, and a backward linear in the values stays unbiased.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

from .. import kernels
from ..compression_config import CompressionConfig
from .core import CompressedTensor, compress, decompress

__all__ = ["SignExactTensor", "compress_sign_exact", "decompress_sign_exact", "sign_tiny"]


def sign_tiny(dtype: torch.dtype) -> float:
    """The magnitude a nonzero decodes to where its magnitude rounded to 0 (see the module doc)."""
    return 2.0 ** -24 if dtype == torch.float16 else torch.finfo(dtype).tiny


@dataclasses.dataclass
class SignExactTensor:
    """Magnitudes (a :class:`CompressedTensor` of ``|x|``) plus ``x``'s exact sign classes."""

    magnitudes: CompressedTensor
    sign: int                                # +1 or -1: the sign of every nonzero when ``negative`` is None
    all_nonzero: bool                        # no zeros: ``nonzero`` is None
    nonzero: Optional[torch.Tensor] = None   # packed bits (x != 0), where the tensor holds zeros and nonzeros
    negative: Optional[torch.Tensor] = None  # packed bits (x < 0), where it holds both signs

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def tensors(self) -> Tuple[torch.Tensor, ...]:
        return self.magnitudes.tensors() + tuple(t for t in (self.nonzero, self.negative) if t is not None)

    def split(self) -> Tuple["SignExactTensor", Tuple[torch.Tensor, ...]]:
        """``(shell, tensors)``, as :meth:`CompressedTensor.split`; :meth:`join` rebuilds."""
        shell, parts = self.magnitudes.split()
        bits = tuple(t for t in (self.nonzero, self.negative) if t is not None)
        out = dataclasses.replace(self, magnitudes=shell, nonzero=None, negative=None)
        out._layout = (len(parts), self.nonzero is not None, self.negative is not None)
        return out, parts + bits

    def join(self, tensors) -> "SignExactTensor":
        n_parts, has_nz, has_neg = self._layout
        if len(tensors) != n_parts + has_nz + has_neg:
            raise ValueError(f"join expects {n_parts + has_nz + has_neg} tensors, got {len(tensors)}")
        rest = list(tensors[n_parts:])
        return dataclasses.replace(self, magnitudes=self.magnitudes.join(tensors[:n_parts]),
                                   nonzero=rest.pop(0) if has_nz else None, negative=rest.pop(0) if has_neg else None)


#: elements per chunk of the sign passes (a multiple of 8: a chunk's packed bits are whole bytes): their boolean
#: and fp32 temporaries are chunk-sized, not tensor-sized (a saved-tensor hook runs at the forward's peak)
SIGN_CHUNK = 1 << 20


def _chunks(n: int):
    return ((a, min(a + SIGN_CHUNK, n)) for a in range(0, n, SIGN_CHUNK))


def compress_sign_exact(x: torch.Tensor, config: Optional[CompressionConfig] = None,
                        seed: Optional[int] = None) -> SignExactTensor:
    """Compress ``x`` keeping its signs and zeros exact (see the module doc). Reads three flags from the
    device (one synchronisation): whether ``x`` holds negatives, positives and zeros. Its temporaries are
    chunk-sized (:data:`SIGN_CHUNK` elements), but for ``|x|`` where ``x`` holds both signs (one of ``x``'s
    size); a tensor of one sign is compressed as it is (or negated)."""
    x = x.detach()
    flat = x.reshape(-1)
    flags = torch.zeros(3, dtype=torch.bool, device=x.device)
    for a, b in _chunks(flat.numel()):
        part = flat[a:b]  # (a NaN is neither negative, positive nor zero: its group decodes to NaN anyway)
        flags |= torch.stack([(part < 0).any(), (part > 0).any(), (part == 0).any()])
    has_neg, has_pos, has_zero = flags.tolist()
    pack = kernels.get("pack_mask", x.device)

    def packed(test):
        return torch.cat([pack(test(flat[a:b])) for a, b in _chunks(flat.numel())])

    nonzero = packed(lambda part: part != 0) if has_zero and (has_neg or has_pos) else None
    negative = packed(lambda part: part < 0) if has_neg and has_pos else None
    magnitudes = x.abs() if has_neg and has_pos else (-x if has_neg else x)
    return SignExactTensor(magnitudes=compress(magnitudes, config, seed), sign=-1 if has_neg and not has_pos else 1,
                           all_nonzero=not has_zero, nonzero=nonzero, negative=negative)


def decompress_sign_exact(c: SignExactTensor) -> torch.Tensor:
    """The estimate of the original tensor: unbiased up to ``tiny`` per element, signs and zeros exact.
    Decodes the magnitudes, then applies the signs and zeros in place, chunk by chunk (no temporary of the
    tensor's size beside the result)."""
    m = decompress(c.magnitudes)
    if c.magnitudes.raw is not None and c.magnitudes.proj_seed is None:
        m = m.clone()  # kept as is (compression off): the stored tensor itself, not ours to write
    m = m.contiguous()
    flat = m.view(-1)
    unpack = kernels.get("unpack_mask", m.device)
    tiny = sign_tiny(m.dtype)
    for a, b in _chunks(flat.numel()):
        part = flat[a:b]
        if c.nonzero is not None:
            nonzero = unpack(c.nonzero[a // 8:-(-b // 8)], b - a)
            # nonzeros that decoded to 0: tiny; zeros: exactly 0 (times 0 keeps a NaN group NaN)
            part.masked_fill_(nonzero & (part == 0), tiny).mul_(nonzero)
        elif c.all_nonzero:
            part.masked_fill_(part == 0, tiny)
        if c.negative is not None:
            negative = unpack(c.negative[a // 8:-(-b // 8)], b - a)
            part.mul_(negative.to(m.dtype).mul_(-2).add_(1))
    return m.neg_() if c.sign < 0 else m
