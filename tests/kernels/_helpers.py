"""Helpers shared by the backend conformance tests (``test_extension.py``, ``test_numba_kernels.py``):
each backend is compared with the torch reference (``dgl_exact.kernels.reference``)."""
from __future__ import annotations

import torch

SEED = 0x5DEECE66D_1234567  # > 2**32: both seed words matter
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def assert_same(got: torch.Tensor, want: torch.Tensor, exact: bool = True, **tol) -> None:
    """Same shape, dtype and device; bit-identical values (NaN where NaN) unless ``exact=False``, then
    ``torch.testing.assert_close`` with ``tol``."""
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.device == want.device, (got.device, want.device)
    if exact:
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(got, want, equal_nan=True, **tol)
