"""Epoch time of one full-graph training step (forward, loss, backward, Adam step) on the same graph held four
ways, side by side in one process, alternating: the variants take turns within every repeat (the order
rotates), so load from other jobs falls on all of them alike. Prints a markdown table (median, min, ratio of
medians to the first variant) and one JSON line per (setting, variant).

    int64 coo      the graph as DGL loads it (int64 ids, COO; DGL creates CSC / CSR beside it on first use):
                   what training used before the graph was compacted
    int64 csc+csr  int64 ids, the COO dropped
    int32 all      int32 ids, every format (COO kept)
    int32 csc+csr  int32 ids, the COO dropped: what the trainer trained on before the CSC alone
    int32 csc      a symmetric graph's CSC alone, no edge ids, marked symmetric (training_graph): what the
                   trainer trains GCN, SAGE and GCNII on now (asymmetric graphs: the variant is left out)

    python scripts/graph_idtype_speed.py [--dataset synthetic-arxiv] [--model gcn] [--hidden 256] [--layers 3]
                                         [--settings "dgl_exact fp32,INT2"] [--repeats 7] [--warmup 2]
                                         [--variants "int32 csc+csr,int32 csc"]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time

import torch

import dgl_exact
from dgl_exact._compat import import_dgl
from dgl_exact.compression_config import config as compression_scope
from dgl_exact.bench.runner import Workload, training_step
from dgl_exact.data import load_dataset
from dgl_exact.data.compact import TRAINING_FORMATS, compact_graph, describe_structure, training_graph
from dgl_exact.planning.settings import select

dgl = import_dgl()


def variants(g64):
    """name -> graph (all share node data; the int32 ones their own structure)."""
    csc_csr_64 = g64.formats(["coo", "csr", "csc"])
    csc_csr_64.create_formats_()  # CSC from the COO (the edge order the int32 graphs get)
    return {
        "int64 coo": g64,
        "int64 csc+csr": csc_csr_64.formats(list(TRAINING_FORMATS)),
        "int32 all": compact_graph(g64),
        "int32 csc+csr": compact_graph(g64, TRAINING_FORMATS),
        **({"int32 csc": csc} if (csc := training_graph(g64)).formats()["created"] == ["csc"] else {}),
    }


def scope(setting):
    """The setting's compression scope (a fresh context manager per step: they are used once)."""
    return compression_scope(setting.compression) if setting.compression else contextlib.nullcontext()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="synthetic-arxiv")
    ap.add_argument("--model", default="gcn")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--settings", default="dgl_exact fp32,INT2")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--variants", default=None, help="comma-separated subset of the graphs (default: all)")
    a = ap.parse_args()
    ds = load_dataset(a.dataset, "unused", quiet=True)
    work = Workload(ds, "cpu", hidden=a.hidden, layers=a.layers)
    graphs = variants(work.graph_for(a.model))
    if a.variants:
        graphs = {name: graphs[name] for name in a.variants.split(",")}
    names = list(graphs)
    print(f"# {a.model} {a.layers}x{a.hidden} on {ds.summary()}")
    print(f"# dgl_exact {dgl_exact.__version__} ({dgl_exact.__file__}), torch {torch.__version__}, "
          f"dgl {dgl.__version__}, {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    for name, g in graphs.items():
        print(f"# {name}: {describe_structure(g)} before the first step")
    rows = []
    for setting in select(a.settings):
        steps = {}
        for name in names:  # one model per variant, the same initial weights
            work.graph_sl = work.graph_raw = graphs[name]
            model, one_step, _ = training_step(work, a.model, setting)
            steps[name] = (model, one_step)
        times = {name: [] for name in names}
        for r in range(a.warmup + a.repeats):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                _, one_step = steps[name]
                with scope(setting):
                    t0 = time.perf_counter()
                    one_step()
                    dt = time.perf_counter() - t0
                if r >= a.warmup:
                    times[name].append(dt)
        base = statistics.median(times[names[0]])
        print(f"\n{setting.name}: epoch time, {a.repeats} alternating repeats after {a.warmup} warm-up\n")
        print(f"| graph | structure after the steps | median ms | min ms | ratio vs {names[0]} (medians) |")
        print("|---|---|---|---|---|")
        for name in names:
            med = statistics.median(times[name])
            row = {"setting": setting.name, "graph": name, "structure": describe_structure(graphs[name]),
                   "median_ms": 1000 * med, "min_ms": 1000 * min(times[name]), "ratio": med / base,
                   "times_ms": [round(1000 * t, 1) for t in times[name]]}
            rows.append(row)
            print(f"| {name} | {row['structure']} | {row['median_ms']:.0f} | {row['min_ms']:.0f} "
                  f"| {row['ratio']:.3f} |")
        del steps
    print()
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
