"""Graph-kernel timings of ``dgl-exact bench kernels``: the weighted sum (``spmm_weighted_sum``: GraphConv's
degree factors, attention weights) on every backend that serves it on the device, beside DGL's CPU kernel given
the same weights (``dgl (u_mul_e)``; the kernel spec leaves it off the chain, see
:mod:`dgl_exact.kernels`) and the unweighted sum (``spmm_sum``) as the chain serves it. The graph is random
with a fixed in-degree (``degree``, about ogbn-arxiv's 14 with self loops), ``nodes`` nodes."""
from __future__ import annotations

import time
import warnings
from typing import Callable, Dict, List

import torch

from .. import kernels
from .._progress import progress_bar
from ..ops.structure import grouped

#: (setting name, heads) of the weighted sums timed; each head has ``cols // heads`` features
SHAPES = (("w [E, 1]", 1), ("w [E, 3] (3 heads)", 3))


def best_ms(fn: Callable[[], object], device, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn`` in ms (synchronised on CUDA); ``fn`` is called once
    before, untimed (a numba kernel compiles on its first call)."""
    device = torch.device(device)
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return min(times) * 1000


def _dgl_graph(indptr, indices, eids, nodes):
    """DGL's graph index of the CSC (on the CPU, where DGL's kernels load), else None."""
    if kernels.available_backends().get("dgl") != "available":
        return None
    from ..kernels.dgl_graph import csc_graph_index

    return csc_graph_index(indptr, indices, eids, nodes, nodes)


def _backends_serving(op: str, device) -> List[tuple]:
    """``(backend, function)`` of every available backend that serves ``op`` on ``device``."""
    out = []
    for name, status in kernels.available_backends().items():
        with kernels.use_backend(name), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a forced backend warns about ops it cannot serve
            if status == "available" and kernels.chosen(op, device) == name:
                out.append((name, kernels.get(op, device)))
    return out


def graph_kernel_grid(sink, device, nodes: int = 169343, degree: int = 14, cols: int = 128, repeats: int = 5,
                      progress: bool = True) -> List[Dict]:
    """Rows of :data:`~dgl_exact.bench.runner.KERNEL_COLUMNS`; ``GB_per_s``: bytes of gathered features (one
    feature row per edge) over the time."""
    from ..kernels import dgl_graph

    device = torch.device(device)
    g = torch.Generator().manual_seed(0)
    edges = nodes * degree
    dst = torch.arange(nodes).repeat_interleave(degree)
    indptr, indices, _ = grouped(dst, torch.randint(0, nodes, (edges,), generator=g), nodes)
    eids = torch.randperm(edges, generator=g)  # a graph built from a COO: ids are not positions
    gidx = _dgl_graph(indptr, indices, eids, nodes) if device.type == "cpu" else None
    csc = (indptr.to(device), indices.to(device), eids.to(device))
    unweighted = kernels.chosen("spmm_sum", device)
    out = []
    shapes = [(setting, heads) for setting, heads in SHAPES if cols >= heads]
    for setting, heads in progress_bar(shapes, progress, desc="graph kernels", unit="shape"):
        x = torch.randn(nodes, heads, cols // heads, generator=g).to(device)
        w = torch.rand(edges, heads, generator=g).to(device)
        calls = [(name, "spmm_weighted_sum", lambda fn=fn: fn(*csc, x, w, nodes))
                 for name, fn in _backends_serving("spmm_weighted_sum", device)]
        if gidx is not None:
            calls.append(("dgl (u_mul_e)", "spmm_weighted_sum", lambda: dgl_graph.spmm_sum(gidx, x, w, nodes)))
        if unweighted == "dgl":
            calls.append(("dgl", "spmm_sum (no weights)", lambda: dgl_graph.spmm_sum(gidx, x, None, nodes)))
        else:
            fn0 = kernels.get("spmm_sum", device)
            calls.append((unweighted, "spmm_sum (no weights)", lambda: fn0(*csc, x, None, nodes)))
        for backend, op, call in calls:
            ms = best_ms(call, device, repeats)
            row = {"kind": "kernel", "backend": backend, "op": op, "setting": setting,
                   "shape": f"{nodes} nodes x {degree} in-edges, {heads}x{cols // heads}", "ms": ms,
                   "GB_per_s": edges * x[0].numel() * x.element_size() / (ms / 1000) / 1e9, "device": str(device)}
            out.append(row)
            sink.add(row)
    return out
