"""How much a measured CPU step peak moves from one fresh process to the next, with and without address
space layout randomisation: the nightly test ``tests/planning/test_minibatch.py::
test_prediction_matches_measured_step``'s step (SAGE 3x128 on neighbour-sampled batches of 128 seeds,
fan-outs 15,10,5, an 8,000-node synthetic graph, INT2), its three batches measured three times per process.

    python scripts/minibatch_peak_noise.py --processes 4      (one thread each; about 15 s per process)

Prints per process: the planner's prediction and the nine measured step peaks (MiB). Runs with ASLR off
through ``setarch -R`` (util-linux) with PYTHONHASHSEED=0, then with ASLR on.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile


def child(root: str) -> None:
    import torch

    import dgl_exact  # noqa: F401  (before dgl)
    from dgl_exact import memory
    from dgl_exact.compression_config import config
    from dgl_exact.data import load_dataset
    from dgl_exact.planning.minibatch import MinibatchPlanner
    from dgl_exact.planning.predict import loss_fn
    from dgl_exact.planning.settings import select

    planner = MinibatchPlanner(load_dataset("synthetic:num_nodes=8000,avg_degree=8", root, quiet=True), "sage",
                               [15, 10, 5], hidden=128)
    setting = select("INT2")[0]
    predicted = planner.record(setting, 128).step_peak_bytes
    memory.prepare_cpu_peak()
    peaks = []
    for _ in range(3):
        for b in planner.batches(128):
            model, opt = planner._model(setting)
            y = b.node_data["label"]
            idx, lf = torch.arange(y.shape[0]), loss_fn(setting.impl)
            with config(setting.compression):
                rep = memory.measure_step(lambda: lf(model(b.blocks, b.node_data["feat"]), y, idx), opt,
                                          modules=[model])
            peaks.append(rep.peak_bytes / 2**20)
    print(f"predicted {predicted / 2**20:.2f} | measured " + " ".join(f"{p:.2f}" for p in peaks), flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--child", metavar="DATA_ROOT", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(a.child)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as root:
        setarch = shutil.which("setarch")
        runs = [("ASLR off, PYTHONHASHSEED=0", [setarch, platform.machine(), "-R"], {"PYTHONHASHSEED": "0"})] \
            if setarch else []
        runs.append(("ASLR on", [], {}))
        for title, prefix, extra in runs:
            print(f"## {title}")
            for _ in range(a.processes):
                subprocess.run(prefix + [sys.executable, __file__, "--child", root], env={**env, **extra},
                               check=True)


if __name__ == "__main__":
    main()
