"""The one list of kernel ops: name, signature, and which backend implements each op on which devices.

Everything else is derived from :data:`OPS`: the registry's checks (:func:`dgl_exact.kernels.register`
refuses an op or a device the list does not name), the extension's Python wrappers and fake
implementations (:mod:`.extension`), the ops the Numba backend registers (:mod:`.numba_kernels`) and the
conformance test that every op has every backend or a recorded reason (``tests/kernels/test_spec.py``).

``signature`` is the Python signature every backend's function has (the reference's, in
:mod:`.reference`); ``schema`` is the extension's ``torch.ops.dgl_exact`` schema (``cuda/dgl_exact.cpp``
declares the same string), or ``None`` where the extension's op differs and :mod:`.extension` writes the
wrapper by hand. ``backends`` maps each backend to the devices it serves (a tuple) or to the reason it does
not implement the op (a string).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple, Union

import torch

__all__ = ["Op", "OPS", "BACKENDS", "implemented", "reason"]

#: Backend names, in the order the registry prefers them (see the package docstring for the chains).
BACKENDS = ("ext", "numba", "dgl", "torch")

_ANY = ("cpu", "cuda")
_CPU = ("cpu",)
_NO_DGL_CODEC = "DGL has no compression, mask or dropout kernels"
_NO_NUMBA_GRAPH = "no Numba kernel: ext (any device) and dgl (CPU) serve this graph op"


@dataclass(frozen=True)
class Op:
    name: str
    signature: str
    schema: Optional[str]
    backends: Dict[str, Union[Tuple[str, ...], str]]
    fake: Optional[Callable] = None  # output shapes/dtypes of the extension op, for torch.compile

    def devices(self, backend: str) -> Tuple[str, ...]:
        v = self.backends.get(backend, ())
        return v if isinstance(v, tuple) else ()


def _nbytes(numel, bits):
    return (numel * bits + 7) // 8


def _codec(dgl_reason=_NO_DGL_CODEC):
    return {"ext": _ANY, "numba": _ANY, "dgl": dgl_reason, "torch": _ANY}


def _graph(dgl=_CPU):
    return {"ext": _ANY, "numba": _NO_NUMBA_GRAPH, "dgl": dgl, "torch": _ANY}


_OPS = (
    Op("group_meta", "(mn, mx, bits) -> [2, G] fp32 (lo, step)",
       "group_meta(Tensor mn, Tensor mx, int bits) -> Tensor", _codec(),
       lambda mn, mx, bits: mn.new_empty((2, mn.numel()), dtype=torch.float32)),
    Op("quantize_pack", "(x, lo, step, levels, bits, block_rows, seed, stochastic) -> packed uint8",
       "quantize_pack(Tensor x, Tensor lo, Tensor step, Tensor? levels, int bits, int block_rows, int seed, "
       "bool stochastic) -> Tensor", _codec(),
       lambda x, lo, step, levels, bits, block_rows, seed, stochastic:
           x.new_empty((_nbytes(x.shape[0] * x.shape[1], bits),), dtype=torch.uint8)),
    Op("unpack_dequantize", "(packed, lo, step, levels, bits, block_rows, n_rows, k, dtype) -> [n_rows, k]",
       "unpack_dequantize(Tensor packed, Tensor lo, Tensor step, Tensor? levels, int bits, int block_rows, "
       "int n_rows, int k, ScalarType dtype) -> Tensor", _codec(),
       lambda packed, lo, step, levels, bits, block_rows, n_rows, k, dtype:
           packed.new_empty((n_rows, k), dtype=dtype)),
    Op("compress_rows", "(x, levels, bits, block_rows, seed, stochastic) -> (packed uint8, [2, G] bf16 lo, step)",
       "compress_rows(Tensor x, Tensor? levels, int bits, int block_rows, int seed, bool stochastic) "
       "-> (Tensor, Tensor)", _codec(),
       lambda x, levels, bits, block_rows, seed, stochastic:
           (x.new_empty((_nbytes(x.shape[0] * x.shape[1], bits),), dtype=torch.uint8),
            x.new_empty((2, -(-x.shape[0] // block_rows)), dtype=torch.bfloat16))),
    Op("relu_dropout_compress",
       "(x, p, seed, levels, bits, block_rows, code_seed, stochastic) -> (y, packed mask, packed codes, [2, G] bf16)",
       "relu_dropout_compress(Tensor x, float p, int seed, Tensor? levels, int bits, int block_rows, int code_seed, "
       "bool stochastic) -> (Tensor, Tensor, Tensor, Tensor)", _codec(),
       lambda x, p, seed, levels, bits, block_rows, code_seed, stochastic:
           (x.new_empty(x.shape), x.new_empty((_nbytes(x.numel(), 1),), dtype=torch.uint8),
            x.new_empty((_nbytes(x.shape[0] * x.shape[1], bits),), dtype=torch.uint8),
            x.new_empty((2, -(-x.shape[0] // block_rows)), dtype=torch.bfloat16))),
    Op("pack_mask", "(mask) -> packed uint8", "pack_mask(Tensor mask) -> Tensor", _codec(),
       lambda mask: mask.new_empty((_nbytes(mask.numel(), 1),), dtype=torch.uint8)),
    Op("unpack_mask", "(packed, numel) -> bool [numel]", "unpack_mask(Tensor packed, int numel) -> Tensor",
       _codec(), lambda packed, numel: packed.new_empty((numel,), dtype=torch.bool)),
    Op("dropout", "(x, p, seed) -> y", "dropout(Tensor x, float p, int seed) -> Tensor", _codec(),
       lambda x, p, seed: x.new_empty(x.shape)),
    Op("dropout_at", "(x, p, seed, start) -> y", None,
       {"ext": "no kernel: the numba kernel (or the torch reference) regenerates a kept dropout's rows",
        "numba": _ANY, "dgl": _NO_DGL_CODEC, "torch": _ANY},
       lambda x, p, seed, start: x.new_empty(x.shape)),
    Op("relu_dropout", "(x, p, seed) -> (y, packed mask)",
       "relu_dropout(Tensor x, float p, int seed) -> (Tensor, Tensor)", _codec(),
       lambda x, p, seed: (x.new_empty(x.shape), x.new_empty((_nbytes(x.numel(), 1),), dtype=torch.uint8))),
    # in place: the extension has no kernel of its own (its wrapper would copy); numba serves CUDA tensors
    Op("relu_dropout_inplace", "(x, p, seed) -> packed mask; x (contiguous) overwritten with relu_dropout's y",
       None, {"ext": "no in-place kernel: on CUDA the numba kernel (or the torch reference) serves",
              "numba": _ANY, "dgl": _NO_DGL_CODEC, "torch": _ANY}),
    Op("masked_scale", "(g, packed, on, off) -> g * (on if bit else off)",
       "masked_scale(Tensor g, Tensor packed, float on, float off) -> Tensor", _codec(),
       lambda g, packed, on, off: g.new_empty(g.shape)),
    # the extension fills a preallocated [d, k] tensor (an op with no tensor input has no device to
    # dispatch on): extension.rademacher allocates it
    Op("rademacher", "(d, k, seed, device, dtype) -> [d, k], entries +-1/sqrt(k)",
       None, _codec("DGL has no random-matrix kernel"), None),
    Op("spmm_sum", "(indptr, indices, eids, x, w, n_dst) -> [n_dst, H, D]",
       "spmm_sum(Tensor indptr, Tensor indices, Tensor? eids, Tensor x, Tensor? w, int n_dst) -> Tensor",
       _graph(), lambda indptr, indices, eids, x, w, n_dst: x.new_empty((n_dst, x.shape[1], x.shape[2]))),
    # spmm_sum with edge weights, an op of its own so that each backend's fastest kernel serves it: DGL's CPU
    # kernel broadcasts a weight per element (about 5x slower than its unweighted sum), Numba's CPU kernel
    # reads one weight per edge and head; the extension's spmm_sum takes the weights
    Op("spmm_weighted_sum", "(indptr, indices, eids, x, w, n_dst) -> [n_dst, H, D]; w [E, H] or [E, 1] required",
       None, {"ext": _ANY, "numba": _CPU,
              "dgl": "DGL's u_mul_e sum broadcasts the weight per element on the CPU: numba's kernel serves",
              "torch": _ANY}),
    Op("spmm_minmax", "(indptr, indices, eids, x, reduce, n_dst) -> (out, arg)",
       "spmm_minmax(Tensor indptr, Tensor indices, Tensor? eids, Tensor x, str reduce, int n_dst) "
       "-> (Tensor, Tensor)", _graph(),
       lambda indptr, indices, eids, x, reduce, n_dst: (x.new_empty((n_dst, x.shape[1], x.shape[2])),
                                                        x.new_empty((n_dst, x.shape[1], x.shape[2]),
                                                                    dtype=torch.int64))),
    Op("sddmm_dot", "(indptr, indices, eids, a, b) -> [E, H]",
       "sddmm_dot(Tensor indptr, Tensor indices, Tensor? eids, Tensor a, Tensor b) -> Tensor", _graph(),
       lambda indptr, indices, eids, a, b: a.new_empty((indices.shape[0], a.shape[1]),
                                                       dtype=torch.promote_types(a.dtype, b.dtype))),
    Op("edge_softmax", "(indptr, indices, eids, e) -> softmax of e [E, H] over each destination's in-edges",
       None, {"ext": "no kernel: on CUDA the torch reference's scatter ops serve (not measured as a bottleneck)",
              "numba": _NO_NUMBA_GRAPH, "dgl": _CPU, "torch": _ANY}),
)

#: op name -> :class:`Op`
OPS: Dict[str, Op] = {op.name: op for op in _OPS}


def implemented(backend: str) -> Tuple[str, ...]:
    """The ops ``backend`` implements on at least one device."""
    return tuple(name for name, op in OPS.items() if op.devices(backend))


def reason(op: str, backend: str) -> Optional[str]:
    """Why ``backend`` does not implement ``op`` (``None`` when it does)."""
    v = OPS[op].backends.get(backend)
    return v if isinstance(v, str) else None
