"""Compress a tensor for storage and decompress it: the math of dgl_exact, backend-agnostic.

``compress`` views a tensor as ``[N, D]`` (first dim = rows, the rest flattened; a 1-D tensor is one
row), optionally projects it to ``[N, k]``, splits the rows into groups of ``block_rows``, and stores per
group a bf16 minimum ``lo`` and step ``step`` plus ``bits``-bit codes, packed densely. With quantisation
disabled (``enabled=False``) a projection still applies: the ``[N, k]`` projected rows are kept unquantised
in the input's dtype (EXACT's ``--act_fp --kept_frac``); without projection the tensor itself is kept. The kernels that
turn values into codes and back are chosen by :mod:`dgl_exact.kernels`.

Metadata is rounded *before* quantising, in the direction that keeps every value inside the
representable range: ``lo`` is rounded down and ``step`` up to bf16. Stochastic rounding against the
rounded values is then exactly unbiased (EXACT quantised against the fp32 values and stored rounded
ones: a small per-row bias). A constant group whose value bf16 holds (zeros above all) decodes exactly:
``step = 0``. Any other constant group is quantised like every group, against ``[lo, lo + M step]`` of
width below one bf16 ulp of its value: unbiased, error under that ulp. Compression never synchronises
the host with the device (``nonfinite="raise"`` excepted: it has to look at the data).

Non-finite values: a group holding a NaN or an inf decodes to NaN throughout (``nonfinite="propagate"``,
the default: never a finite wrong value; ``"raise"``: ``FloatingPointError``). The NaN/inf positions come
back non-finite, and so do the group's finite values (a group's codes have no spare value to mark one
element). fp64 values beyond fp32's range become inf in fp32 and count as non-finite.

Extreme finite values (``kernels.reference``'s ``group_meta``): a group whose range overflows fp32 (e.g.
``[3e38, -3e38]``) is stored *wide* (metadata of its values / 16, step negated) and decodes finite, within one
step and unbiased, so a backward that overflows on the exact values overflows on the decoded ones too (a
GAT input row at 1e38: the same NaN gradients as without compression). Denormal fp32 values are quantised
unbiased (denormal steps, down to 2^-133). A decoded level past the output dtype's largest finite value
(fp16/bf16/fp32 values within one step of it) decodes to that value, never to inf: such values are biased
toward zero by less than one step; all others stay unbiased.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from typing import Optional, Tuple

import torch

from .. import kernels, tracing
from ..compression_config import CompressionConfig, resolve_config
from . import projection
from .levels import levels_for

__all__ = ["CompressedTensor", "compress", "decompress", "compressed_nbytes", "draw_seed", "META_DTYPE",
           "relu_dropout_compress", "fuses_with_activation"]

META_DTYPE = torch.bfloat16
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclasses.dataclass
class CompressedTensor:
    """A compressed activation. ``nbytes`` is its exact storage cost (all tensors it holds)."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    bits: int
    block_rows: int
    levels: str
    n_rows: int
    width: int                    # stored columns (after projection)
    orig_width: int               # columns before projection
    proj_seed: Optional[int]      # None: no projection
    packed: Optional[torch.Tensor] = None   # uint8 codes
    lo: Optional[torch.Tensor] = None       # [G] bf16
    step: Optional[torch.Tensor] = None     # [G] bf16
    raw: Optional[torch.Tensor] = None       # compression disabled: the tensor itself

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def tensors(self) -> Tuple[torch.Tensor, ...]:
        """Every tensor this object keeps (for ``ctx.save_for_backward`` and for size accounting)."""
        return tuple(t for t in (self.packed, self.lo, self.step, self.raw)
                     if t is not None)

    _TENSOR_FIELDS = ("packed", "lo", "step", "raw")

    def split(self) -> Tuple["CompressedTensor", Tuple[torch.Tensor, ...]]:
        """``(shell, tensors)``: a tensor-free description plus the tensors, so an autograd function can
        pass the tensors through ``ctx.save_for_backward`` and rebuild with :meth:`join`."""
        present = tuple(n for n in self._TENSOR_FIELDS if getattr(self, n) is not None)
        shell = dataclasses.replace(self, **{n: None for n in self._TENSOR_FIELDS})
        shell._present = present
        return shell, tuple(getattr(self, n) for n in present)

    def join(self, tensors) -> "CompressedTensor":
        """Inverse of :meth:`split`."""
        present = getattr(self, "_present", ())
        if len(tensors) != len(present):
            raise ValueError(f"join expects {len(present)} tensors, got {len(tensors)}")
        return dataclasses.replace(self, **dict(zip(present, tensors)))

    def __repr__(self) -> str:
        kind = "raw" if self.raw is not None else f"INT{self.bits}"
        proj = f", k={self.width}/{self.orig_width}" if self.proj_seed is not None else ""
        return (f"CompressedTensor({kind}, shape={tuple(self.shape)}, dtype={self.dtype}, "
                f"block_rows={self.block_rows}{proj}, nbytes={self.nbytes})")



#: the generator :func:`draw_seed` draws from inside a :func:`seed_stream` scope (None: torch's default)
_stream: "contextvars.ContextVar[Optional[torch.Generator]]" = contextvars.ContextVar("dgl_exact_seed_stream",
                                                                                      default=None)


@contextlib.contextmanager
def seed_stream(seed: int):
    """Within this scope :func:`draw_seed` draws from a CPU generator of its own, seeded with ``seed``: the
    same seeds every time the scope is entered with that ``seed``, independent of torch's default generator
    (which is neither read nor advanced). A recomputed segment's compression noise comes from here
    (:mod:`dgl_exact.ops.recompute`)."""
    token = _stream.set(torch.Generator().manual_seed(int(seed)))
    try:
        yield
    finally:
        _stream.reset(token)


def draw_seed() -> int:
    """A 63-bit seed from torch's default CPU generator (so ``torch.manual_seed`` makes runs repeatable), or
    from the generator of the enclosing :func:`seed_stream`. While dynamo traces an op:
    ``tracing.RUNTIME_SEED``, which the captured op replaces by a seed it draws when it runs (a seed drawn
    at trace time would be baked into the compiled graph)."""
    if tracing.active():
        return tracing.RUNTIME_SEED
    return int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64, generator=_stream.get()).item())


_level_tables = {}


def _level_table(bits: int, mode: str, group_size: int, device) -> Optional[torch.Tensor]:
    key = (bits, mode, group_size, str(device))
    if key not in _level_tables:
        lv = levels_for(bits, mode, group_size)
        _level_tables[key] = None if lv is None else torch.tensor(lv, dtype=torch.float32, device=device)
    return _level_tables[key]


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 1:
        return x.reshape(1, -1)
    return x.reshape(x.shape[0], math.prod(x.shape[1:]))  # not -1: ambiguous when x has 0 elements


def compress(x: torch.Tensor, config: Optional[CompressionConfig] = None,
             seed: Optional[int] = None) -> CompressedTensor:
    """Compress ``x`` (fp32, fp16, bf16 or fp64, any shape with at least one dimension).

    ``config`` defaults to the configuration in force (:func:`dgl_exact.get_config`); ``seed`` fixes the
    rounding noise and projection (default: drawn from torch's default generator). Gradients do not flow
    through compression: ``x`` is treated as data.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"compress expects a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"compress expects a floating tensor (float32, float16, bfloat16 or float64), got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("compress expects a tensor with at least one dimension, got a scalar")
    cfg = resolve_config(config)
    x = x.detach()
    rows = _as_rows(x)
    n_rows, width = rows.shape
    base = dict(shape=x.shape, dtype=x.dtype, device=x.device, bits=cfg.bits, block_rows=cfg.block_rows,
                levels=cfg.levels, n_rows=n_rows, orig_width=width)
    if not cfg.enabled:
        k = cfg.projected_width(width)
        if not (k < width and n_rows > 0):
            return CompressedTensor(width=width, proj_seed=None, raw=x, **base)
        # projection without quantisation (EXACT's --act_fp --kept_frac): the projected rows, in x's dtype
        seed = draw_seed() if seed is None else seed
        proj_seed = (seed * 0x9E3779B97F4A7C15 + 1) & 0x7FFFFFFFFFFFFFFF
        raw = _cast_finite(projection.project(rows, k, proj_seed), x.dtype)
        return CompressedTensor(width=k, proj_seed=proj_seed, raw=raw, **base)
    if seed is None:
        seed = draw_seed()
    proj_seed = None
    k = cfg.projected_width(width)
    if k < width and n_rows > 0:
        proj_seed = (seed * 0x9E3779B97F4A7C15 + 1) & 0x7FFFFFFFFFFFFFFF  # independent of the rounding seed
        rows = projection.project(rows, k, proj_seed)
    else:
        k = width
    rows = rows.contiguous()
    n_groups = -(-n_rows // cfg.block_rows)
    if rows.numel() == 0:
        empty = torch.empty(0, dtype=torch.uint8, device=x.device)
        meta = torch.zeros(n_groups, dtype=META_DTYPE, device=x.device)
        return CompressedTensor(width=k, proj_seed=proj_seed, packed=empty, lo=meta, step=meta.clone(), **base)

    group_size = cfg.block_rows * k if n_rows >= cfg.block_rows else n_rows * k
    levels = _level_table(cfg.bits, cfg.levels, group_size, x.device)
    # one op: group ranges, metadata ([2, G] bf16 lo, step) and codes (kernels.reference.compress_rows)
    packed, meta = kernels.get("compress_rows", x.device)(rows, levels, cfg.bits, cfg.block_rows, seed,
                                                          cfg.stochastic)
    if cfg.nonfinite == "raise":
        bad = int(torch.isnan(meta[0]).sum())  # lo is NaN exactly for the groups whose fp32 values hold a NaN or an inf
        if bad:
            raise FloatingPointError(_nonfinite_message(x, bad, proj_seed is not None))
    return CompressedTensor(width=k, proj_seed=proj_seed, packed=packed, lo=meta[0], step=meta[1], **base)


def fuses_with_activation(x: torch.Tensor, cfg: CompressionConfig) -> bool:
    """Whether :func:`relu_dropout_compress` applies: quantisation on, no projection (its codes are of the
    projected rows), a non-empty floating tensor, and non-finite values left to propagate."""
    if not cfg.enabled or x.dtype not in _FLOAT_DTYPES or x.dim() == 0 or x.numel() == 0:
        return False
    width = x.numel() // (1 if x.dim() == 1 else x.shape[0])
    return cfg.projected_width(width) >= width and cfg.nonfinite == "propagate"


def relu_dropout_compress(x: torch.Tensor, p: float, seed: int, config: Optional[CompressionConfig] = None,
                          code_seed: Optional[int] = None):
    """``y = dropout(relu(x), p)`` (mask from ``seed``, as ``kernels relu_dropout``), its packed 1-bit mask,
    and ``compress(y, config, code_seed)``, from one op (``relu_dropout_compress``): a kernel reads ``x`` once
    for all three. Only where :func:`fuses_with_activation` holds. Returns ``(y, mask, CompressedTensor)``."""
    cfg = resolve_config(config)
    if not fuses_with_activation(x, cfg):
        raise ValueError("relu_dropout_compress needs quantisation on, no projection, a non-empty floating tensor "
                         "and nonfinite='propagate'")
    code_seed = draw_seed() if code_seed is None else code_seed
    x = x.detach()
    rows = _as_rows(x).contiguous()
    n_rows, width = rows.shape
    group_size = cfg.block_rows * width if n_rows >= cfg.block_rows else n_rows * width
    levels = _level_table(cfg.bits, cfg.levels, group_size, x.device)
    y, mask, packed, meta = kernels.get("relu_dropout_compress", x.device)(rows, p, seed, levels, cfg.bits,
                                                                          cfg.block_rows, code_seed, cfg.stochastic)
    c = CompressedTensor(shape=x.shape, dtype=x.dtype, device=x.device, bits=cfg.bits, block_rows=cfg.block_rows,
                         levels=cfg.levels, n_rows=n_rows, orig_width=width, width=width, proj_seed=None,
                         packed=packed, lo=meta[0], step=meta[1])
    return y.view(x.shape), mask, c


def _nonfinite_message(x: torch.Tensor, bad: int, projected: bool) -> str:
    """What made ``bad`` groups non-finite: NaN/Inf in the input, or finite values fp32 cannot hold."""
    n_nan, n_inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
    if n_nan or n_inf:
        return (f"compress: {bad} group(s) of the activation contain NaN or Inf ({n_nan} NaN, {n_inf} inf "
                "values); check the model for overflow (or use nonfinite='propagate' under AMP)")
    peak = float(x.abs().max())
    why = (f"its {x.dtype} values reach {peak:.4g}, beyond float32's largest finite value "
           f"{torch.finfo(torch.float32).max:.4g}" if peak > torch.finfo(torch.float32).max else
           f"its values (up to {peak:.4g} in magnitude) overflow float32 in the random projection")
    return (f"compress: the activation is finite but {bad} group(s) became inf in float32 ({why}); "
            "scale the activation down, or keep it uncompressed (act_fp / enabled=False)")


def decompress(c: CompressedTensor) -> torch.Tensor:
    """The estimate of the original tensor: same shape, dtype and device."""
    if not isinstance(c, CompressedTensor):
        raise TypeError(f"decompress expects a CompressedTensor, got {type(c).__name__}")
    if c.raw is not None:
        if c.proj_seed is None:
            return c.raw
        return _cast_finite(projection.unproject(c.raw.float(), c.orig_width, c.proj_seed), c.dtype).reshape(c.shape)
    if c.packed is None:
        raise ValueError("this CompressedTensor holds no data (a shell from split(); call join() first)")
    lo, step = c.lo, c.step  # bf16: every kernel reads the stored metadata as it is (no converted copy)
    if c.n_rows * c.width == 0:
        return torch.zeros(c.shape, dtype=c.dtype, device=c.device)
    group_size = c.block_rows * c.width if c.n_rows >= c.block_rows else c.n_rows * c.width
    levels = _level_table(c.bits, c.levels, group_size, c.device)
    out_dtype = c.dtype if c.proj_seed is None else torch.float32
    rows = kernels.get("unpack_dequantize", c.device)(c.packed, lo, step, levels, c.bits, c.block_rows,
                                                      c.n_rows, c.width, out_dtype)
    if c.proj_seed is not None:
        rows = _cast_finite(projection.unproject(rows, c.orig_width, c.proj_seed), c.dtype)
    return rows.reshape(c.shape)


def _cast_finite(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``rows`` as ``dtype``, finite values kept finite: a (un)projected estimate can exceed fp16's or bf16's
    largest value where the input did not (projection noise); it is clamped there instead of becoming inf.
    Non-finite values (from a NaN or inf in the input) stay as they are."""
    if dtype in (torch.float16, torch.bfloat16) and rows.dtype != dtype:
        big = torch.finfo(dtype).max
        rows = torch.where(torch.isfinite(rows), rows.clamp(-big, big), rows)
    return rows.to(dtype)


def compressed_nbytes(shape, config: CompressionConfig) -> int:
    """The exact ``nbytes`` a tensor of ``shape`` compresses to under ``config`` (formula; no data)."""
    if not isinstance(config, CompressionConfig):
        raise TypeError(f"compressed_nbytes expects a CompressionConfig, got {type(config).__name__}")
    shape = torch.Size(shape)
    if len(shape) == 0 or any(s < 0 for s in shape):
        raise ValueError(f"compressed_nbytes expects a shape with at least one dimension, all >= 0, got {tuple(shape)}")
    n_rows = 1 if len(shape) == 1 else shape[0]
    width = math.prod(shape) // n_rows if n_rows else math.prod(shape[1:])
    if not config.enabled:
        raise ValueError("compressed_nbytes: compression is disabled in this config (the size is the input's)")
    k = config.projected_width(width)
    if not (k < width and n_rows > 0):  # as compress: no projection of empty or unshrinkable tensors
        k = width
    n_groups = -(-n_rows // config.block_rows)
    codes = -(-(n_rows * k * config.bits) // 8)
    meta = 2 * n_groups * torch.finfo(META_DTYPE).bits // 8
    return codes + meta
