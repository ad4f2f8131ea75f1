#!/usr/bin/env python
"""Activation memory of a pre-LayerNorm residual GCN: DGL fp32 against ``compress_model`` at INT2.

The model (``user-block-gcn`` of ``dgl-exact bench memory``, :class:`dgl_exact.bench.user_models.PreNormNet`):
an input ``Linear(128, 512)``, then ``layers`` blocks ``x + FFN(aggregate(LayerNorm(x)))`` with
FFN ``Linear -> GELU -> Dropout -> Linear -> Dropout`` (hidden 512) and a GCN aggregation
``sum_{u -> v} w_uv x_u`` with the symmetric degree norm ``w_uv = 1 / sqrt(d_u d_v)``, then
``Linear(512, 40)`` and cross-entropy. Random graph: 10,000 nodes, average in-degree 8; random features.

Rows (activation bytes kept for backward, measured with ``dgl_exact.memory.measure``: unique storages
saved through autograd's saved-tensor hooks, parameters, buffers, edge weights and the loss excluded):

* ``dgl-fp32``: plain torch layers, aggregation ``dgl.ops.u_mul_e_sum``;
* ``int2-convert``: ``compress_model(model, INT2)`` (the aggregation is a functional DGL call: its input
  stays fp32);
* ``int2-convert+hooks``: ``compress_model(..., saved_tensors=True)``: the aggregation's saved input is
  compressed by the saved-tensor hooks too;
* ``int2-convert+dgl_exact-agg``: the aggregation written with ``dgl_exact.ops.u_mul_e_sum`` (keeps a
  compressed input only for an edge gradient, i.e. nothing here).

Measured (CPU, defaults, torch 2.13, DGL 2.1.0): dgl-fp32 607.5 MiB; every INT2 row 28.4 MiB (21.4x): DGL's
``u_mul_e_sum`` keeps no input when its edge weights need no gradient, so the hooks find nothing more.
With ``--learned-edges``: dgl-fp32 705.1 MiB, int2-convert 126.1 (5.6x: DGL's aggregation keeps its fp32
input), int2-convert+hooks 34.7 (20.3x), int2-convert+dgl_exact-agg 34.7 (20.3x). With
``--without-block-layers``: int2-convert 211.1 MiB (2.9x: the fp32 inputs of LayerNorm and GELU), and the
saved-tensor hooks alone bring it to 28.4.

Usage: PYTHONPATH=. python scripts/prenorm_block_memory.py [--nodes 10000] [--layers 5] [--hidden 512]
"""
from __future__ import annotations

import argparse
import copy

import dgl_exact
import torch
import torch.nn as nn
import torch.nn.functional as F
from dgl_exact.bench.user_models import PreNormNet, gcn_aggregate

import dgl  # noqa: E402  (after dgl_exact)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--degree", type=int, default=8)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--classes", type=int, default=40)
    ap.add_argument("--bits", type=int, default=2)
    ap.add_argument("--learned-edges", action="store_true",
                    help="edge weights that need a gradient: DGL's aggregation then keeps its fp32 input")
    ap.add_argument("--without-block-layers", action="store_true",
                    help="convert neither LayerNorm nor GELU (what compress_model did before they had versions)")
    args = ap.parse_args()
    if args.without_block_layers:
        from dgl_exact.nn import convert

        for cls in (nn.LayerNorm, nn.GELU):
            convert._CONVERSIONS.pop(cls)

    torch.manual_seed(0)
    n, m = args.nodes, args.nodes * args.degree
    g = dgl.graph((torch.randint(0, n, (m,)), torch.randint(0, n, (m,))), num_nodes=n)
    src, dst = g.edges()
    d_out, d_in = g.out_degrees().clamp(min=1).float(), g.in_degrees().clamp(min=1).float()
    w = (d_out[src] * d_in[dst]).rsqrt().requires_grad_(args.learned_edges)
    x = torch.randn(n, args.features)
    y = torch.randint(0, args.classes, (n,))
    cfg = dgl_exact.CompressionConfig(bits=args.bits)
    base = PreNormNet(args.features, args.hidden, args.classes, args.layers, lambda: gcn_aggregate)

    def measure(model):
        model.train()
        rep = dgl_exact.memory.measure(lambda: F.cross_entropy(model(g, x, w), y), modules=[model], exclude=[w, x])
        rep.result.backward()
        w.grad = None
        return rep.activation_bytes

    rows = {"dgl-fp32": measure(copy.deepcopy(base))}
    conv, report = dgl_exact.compress_model(copy.deepcopy(base), cfg, report=True)
    rows["int2-convert"] = measure(conv)
    rows["int2-convert+hooks"] = measure(dgl_exact.compress_model(copy.deepcopy(base), cfg, saved_tensors=True))
    exact = copy.deepcopy(base)
    for block in exact.blocks:
        block.agg = lambda g, x, w: dgl_exact.ops.u_mul_e_sum(g, x, w, config=cfg)
    rows["int2-convert+dgl_exact-agg"] = measure(dgl_exact.compress_model(exact, cfg))
    print(report)
    fp32 = rows["dgl-fp32"]
    edges = ", learned edge weights" if args.learned_edges else ""
    print(f"\n{args.layers} blocks, hidden {args.hidden}, {n} nodes, avg degree {args.degree}, INT{args.bits}{edges}")
    for name, b in rows.items():
        print(f"{name:28s} {b / 2 ** 20:9.1f} MiB   {fp32 / max(b, 1):5.2f}x")


if __name__ == "__main__":
    main()
