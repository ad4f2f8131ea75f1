"""Which tensors are alive at the peaks of one neighbour-sampled mini-batch step (SAGE 3x256, fan-outs
15,10,5), as ``python -m dgl_exact.bench.census`` does for full-graph steps: one warm-up step, then a step
under :class:`dgl_exact.bench.census.Census` (torch-created storages of at least 256 KiB; DGL's C++
allocations and the blocks' sparse formats are not seen). A view of a tensor from before the step (the
batch's input features) shows as the whole storage it views.

    python scripts/minibatch_census.py --batch-size 800 --setting INT2
"""
from __future__ import annotations

import argparse
import collections

import torch

from dgl_exact.bench.census import MIB, Census
from dgl_exact.data import load_dataset
from dgl_exact.planning.minibatch import MinibatchPlanner
from dgl_exact.planning.settings import select


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="synthetic:num_nodes=200000,avg_degree=20")
    ap.add_argument("--data-root", default="data")
    ap.add_argument("--batch-size", type=int, default=800)
    ap.add_argument("--fanouts", default="15,10,5")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--setting", default="INT2")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    setting = select(a.setting)[0]
    planner = MinibatchPlanner(load_dataset(a.dataset, a.data_root), "sage",
                               [int(f) for f in a.fanouts.split(",")], num_batches=1, hidden=a.hidden)
    planner._step(setting, planner.batches(a.batch_size)[0], None)  # warm-up
    batch = planner.batches(a.batch_size)[0]
    print("blocks (src, dst, edges):", [(b.num_src_nodes(), b.num_dst_nodes(), b.num_edges()) for b in batch.blocks])
    census = Census()
    backward = torch.Tensor.backward

    def marked(self, *args, **kwargs):
        census.phase = "backward"
        return backward(self, *args, **kwargs)

    torch.Tensor.backward = marked
    try:
        planner._step(setting, batch, census)
    finally:
        torch.Tensor.backward = backward
    for phase, (op, seq, live) in census.snapshot.items():
        print(f"{setting.name}, batch {a.batch_size}: {phase} peak {census.best[phase] / MIB:.1f} MiB at operator "
              f"#{seq} ({op})")
        groups = collections.Counter()
        for e in live:
            groups[(e["op"], e["where"], e["phase"], e["shape"], e["dtype"])] += e["bytes"]
        print("| MiB | created by | at | phase | shape | dtype |\n|---|---|---|---|---|---|")
        for (name, where, ph, shape, dtype), n in groups.most_common(a.top):
            print(f"| {n / MIB:.1f} | {name} | {where} | {ph} | {shape} | {dtype} |")
        print()


if __name__ == "__main__":
    main()
