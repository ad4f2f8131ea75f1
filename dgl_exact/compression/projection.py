"""Random projection of saved activations (EXACT): store ``X R`` instead of ``X`` and reconstruct
``X_hat R^T`` in backward. ``R`` is a ``D x k`` Rademacher matrix with entries ``+-1/sqrt(k)``, so
``E[R R^T] = I`` and the reconstruction is unbiased. ``R`` is regenerated from a 64-bit seed with the
same counter-based hash the kernels use, so it costs no memory and is identical on every device.
"""
from __future__ import annotations

import torch

from .. import kernels

__all__ = ["rademacher", "project", "unproject"]


def rademacher(d: int, k: int, seed: int, device, dtype=torch.float32) -> torch.Tensor:
    """The ``d x k`` projection matrix for ``seed`` (entries ``+-1/sqrt(k)``; the kernel op ``rademacher``,
    one launch on a GPU)."""
    return kernels.get("rademacher", device)(d, k, seed, device, dtype)


def project(x: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """``x [N, D] @ R [D, k]`` in ``x``'s dtype (fp32 accumulation on CPU for low precision)."""
    dtype = x.dtype if x.is_cuda or x.dtype == torch.float32 else torch.float32
    r = rademacher(x.shape[1], k, seed, x.device, dtype)
    return x.to(dtype) @ r


def unproject(y: torch.Tensor, d: int, seed: int) -> torch.Tensor:
    """``y [N, k] @ R^T`` back to ``[N, d]``."""
    r = rademacher(d, y.shape[1], seed, y.device, y.dtype)
    return y @ r.t()
