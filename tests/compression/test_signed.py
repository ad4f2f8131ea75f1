"""Sign-exact compression (dgl_exact.compression.signed): signs and zeros decode exactly, values stay unbiased,
and the sign classes cost 0, 1 or 2 bits per element as the tensor needs."""
from __future__ import annotations

import math

import pytest
import torch

from dgl_exact import CompressionConfig
from dgl_exact.compression import compressed_nbytes
from dgl_exact.compression.signed import compress_sign_exact, decompress_sign_exact, sign_tiny


def _signed_input(kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(48, 40, generator=g)
    small = torch.rand(48, 40, generator=g) < 0.2
    x = torch.where(small, x.sign() * 1e-3, x)  # far below a quantization step: rounds to 0 without the fix
    if kind == "mixed_zeros":
        x[torch.rand(48, 40, generator=g) < 0.15] = 0.0
    elif kind == "relu":
        x = x.clamp_min(0)
    elif kind == "negative":
        x = -x.abs() - 1e-4
    return x


@pytest.mark.parametrize("kind, extra_bits", [("mixed", 1), ("mixed_zeros", 2), ("relu", 1), ("negative", 0)])
@pytest.mark.parametrize("bits", [2, 8])
def test_sign_exact_keeps_signs_and_zeros_and_is_unbiased(kind, extra_bits, bits):
    x = _signed_input(kind)
    cfg = CompressionConfig(bits=bits)
    n_draws = 200
    total = torch.zeros_like(x, dtype=torch.float64)
    for seed in range(n_draws):
        c = compress_sign_exact(x, cfg, seed=seed)
        y = decompress_sign_exact(c)
        assert torch.equal(torch.sign(y), torch.sign(x))  # every draw: signs and zeros exact
        total += y
    assert c.nbytes == compressed_nbytes(x.shape, cfg) + extra_bits * math.ceil(x.numel() / 8)
    # each decoded element takes one of two adjacent levels of its row (one group per row), a step s apart,
    # where s <= (max|x| - min|x|) / (2**bits - 1), rounded up to bf16: Hoeffding bounds the mean of n_draws
    # draws, P(|mean - x| >= t) <= 2 exp(-2 n t^2 / s^2), at 1e-9 over all elements together
    a = x.abs()
    s = (a.amax(1, keepdim=True) - a.amin(1, keepdim=True)) / (2 ** bits - 1) * (1 + 2 ** -7)
    t = s * math.sqrt(math.log(2 / (1e-9 / x.numel())) / (2 * n_draws)) + sign_tiny(x.dtype)
    assert ((total / n_draws - x.double()).abs() <= t).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_sign_exact_other_dtypes_keep_tiny_nonzeros(dtype):
    x = _signed_input("mixed_zeros").to(dtype)
    y = decompress_sign_exact(compress_sign_exact(x, CompressionConfig(bits=1), seed=5))
    assert y.dtype == dtype and torch.equal(torch.sign(y), torch.sign(x))
    assert (y[(x != 0)].abs() >= sign_tiny(dtype)).all()


def test_sign_exact_all_zero_nonfinite_and_split_join():
    z = torch.zeros(8, 16)
    c = compress_sign_exact(z, CompressionConfig(bits=2), seed=1)
    assert c.nonzero is None and c.negative is None and torch.equal(decompress_sign_exact(c), z)
    x = _signed_input("mixed_zeros")
    x[3, 5] = float("nan")
    c = compress_sign_exact(x, CompressionConfig(bits=4), seed=2)
    shell, parts = c.split()
    y = decompress_sign_exact(shell.join(parts))
    assert torch.isnan(y[3]).all()  # a group holding a NaN decodes to NaN throughout, as compress does
    rows = torch.ones(48, dtype=torch.bool)
    rows[3] = False
    assert torch.equal(torch.sign(y[rows]), torch.sign(x[rows]))
    with pytest.raises(ValueError, match="join expects"):
        shell.join(parts[:-1])


@pytest.mark.parametrize("kw", [dict(bits=2, levels="optimal"), dict(bits=4, block_rows=4), dict(bits=1)])
def test_sign_exact_under_other_configs(kw):
    x = _signed_input("mixed_zeros")
    for seed in range(5):
        y = decompress_sign_exact(compress_sign_exact(x, CompressionConfig(**kw), seed=seed))
        assert torch.equal(torch.sign(y), torch.sign(x)) and torch.equal(y == 0, x == 0)


@pytest.mark.parametrize("kind", ["mixed", "mixed_zeros", "relu", "negative"])
def test_sign_exact_in_chunks_decodes_as_whole(kind, monkeypatch):
    """Chunked sign passes (chunks of 8 elements here: a row holds 40) decode exactly what one chunk would."""
    from dgl_exact.compression import signed

    x = _signed_input(kind)
    whole = decompress_sign_exact(compress_sign_exact(x, CompressionConfig(bits=2), seed=4))
    monkeypatch.setattr(signed, "SIGN_CHUNK", 8)
    c = compress_sign_exact(x, CompressionConfig(bits=2), seed=4)
    assert torch.equal(decompress_sign_exact(c), whole) and torch.equal(decompress_sign_exact(c), whole)


@pytest.mark.parametrize("kind", ["relu", "negative", "mixed_zeros"])
def test_sign_exact_with_compression_off_is_exact_and_leaves_the_input(kind):
    """Compression off: decoding gives ``x`` back, twice, and never writes into ``x`` (kept as is)."""
    x = _signed_input(kind)
    before = x.clone()
    c = compress_sign_exact(x, CompressionConfig(enabled=False))
    assert torch.equal(decompress_sign_exact(c), before) and torch.equal(decompress_sign_exact(c), before)
    assert torch.equal(x, before)
