"""Forward + backward time of a first SAGE layer with batch norm, ReLU and dropout on a neighbour-sampled block
(200,000-node random graph, 42,000 seeds, fan-out 15, 100 -> 256, INT2, one thread): the fused op
(``SAGEConv.forward_bn_relu_dropout``) against the composed modules, alternated in one process, best of 5.

    python scripts/first_layer_speed.py
"""
import time

import torch

import dgl_exact
import dgl  # noqa: E402  (after dgl_exact: it makes DGL importable on new torch)


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    g = dgl.rand_graph(200000, 4000000)
    dgl.seed(0)
    _, _, blocks = dgl.dataloading.NeighborSampler([15]).sample_blocks(g, torch.arange(42000))
    b = blocks[0]
    x = torch.randn(b.num_src_nodes(), 100)
    cfg = dgl_exact.CompressionConfig(bits=2)
    conv = dgl_exact.SAGEConv(100, 256, "mean", compression=cfg)
    bn = dgl_exact.nn.BatchNorm1d(256, compression=cfg)

    def fused():
        out = conv.forward_bn_relu_dropout(b, x, bn, 0.5)
        out.backward(torch.ones_like(out))

    def composed():
        out = dgl_exact.ops.relu_dropout(bn(conv(b, x)), 0.5)
        out.backward(torch.ones_like(out))

    fused(), composed()  # warm-up (kernel compilation)
    times = {"fused": [], "composed": []}
    for _ in range(5):
        for name, f in (("fused", fused), ("composed", composed)):
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    print(f"block {b.num_src_nodes()} -> {b.num_dst_nodes()} nodes; best of 5, s:",
          {k: round(min(v), 3) for k, v in times.items()})


if __name__ == "__main__":
    main()
