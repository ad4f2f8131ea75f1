"""Epoch time of neighbour-sampled SAGE training at given batch sizes, settings side by side in one process:
the timed batches of each setting (``dgl_exact.bench.minibatch.time_batches``: sampling, forward, backward
and Adam step, after one untimed step) extrapolated to an epoch. For comparing the picks of ``dgl-exact bench
minibatch`` on a quiet machine, where that command's own timing ran beside other jobs.

    python scripts/minibatch_epoch_time.py --dataset synthetic-products "DGL fp32=1248" "INT2=5120"
"""
from __future__ import annotations

import argparse
import math

import torch

from dgl_exact.bench.minibatch import time_batches
from dgl_exact.data import load_dataset
from dgl_exact.planning.minibatch import MinibatchPlanner
from dgl_exact.planning.settings import select


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("picks", nargs="+", help='"SETTING=BATCH_SIZE", e.g. "INT2=5120"')
    ap.add_argument("--dataset", default="synthetic-products")
    ap.add_argument("--data-root", default="data")
    ap.add_argument("--fanouts", default="15,10,5")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batches", type=int, default=5, help="timed batches per setting")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    picks = []
    for p in a.picks:
        name, _, size = p.rpartition("=")
        if not name or not size.isdigit():
            ap.error(f"expected SETTING=BATCH_SIZE, got {p!r}")
        picks.append((select(name)[0], int(size)))
    ds = load_dataset(a.dataset, a.data_root)
    planner = MinibatchPlanner(ds, "sage", [int(f) for f in a.fanouts.split(",")], hidden=a.hidden)
    n_train = len(ds.train_idx)
    print(f"{a.dataset}: {n_train:,} training nodes, fan-outs {a.fanouts}, SAGE 3x{a.hidden}, {a.threads} threads")
    print("| setting | batch size | s per batch | batches per epoch | epoch |")
    print("|---|---|---|---|---|")
    for setting, size in picks:
        per, timed = time_batches(planner, setting, size, a.batches)
        n = math.ceil(n_train / size)
        print(f"| {setting.name} | {size:,} | {per:.2f} | {n} | {per * n:.0f} s |", flush=True)


if __name__ == "__main__":
    main()
