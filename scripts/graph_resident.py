"""Resident memory of a full-graph training run on a CPU, stage by stage: after loading the dataset, after the
trainer prepared the graph, and after one epoch (training step and evaluation: DGL's sparse formats and
dgl_exact's structure cache exist by then), plus the high-water mark. Each case runs in a fresh interpreter
(the ``dgl_exact`` on ``PYTHONPATH`` is the one measured); prints one JSON line.

    python scripts/graph_resident.py [DATASET] [MODEL]   # default synthetic:num_nodes=200000,avg_degree=20 gcn
"""
import os
import subprocess
import sys

CHILD = r"""
import gc, json, sys
import torch
import dgl_exact
from dgl_exact import memory
from dgl_exact.data import load_dataset
from dgl_exact.training.config import TrainConfig
from dgl_exact.training.trainer import Trainer

def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key)) / 1024

dataset, model = sys.argv[1], sys.argv[2]
memory.prepare_cpu_peak()
out = {"dataset": dataset, "model": model, "dgl_exact": dgl_exact.__file__}
ds = load_dataset(dataset, "unused", quiet=True)
out["idtype"] = str(ds.graph.idtype)
out["loaded_MiB"] = round(status("VmRSS:"), 1)
cfg = TrainConfig(dataset=dataset, model=model, hidden=256, layers=3, epochs=1, runs=1, data_root="unused")
trainer = Trainer(cfg, dataset=ds, progress=False, log=None)
del ds
gc.collect()
out["prepared_MiB"] = round(status("VmRSS:"), 1)
trainer.fit()
gc.collect()
memory._release_free_heap()
out["after_epoch_MiB"] = round(status("VmRSS:"), 1)
out["peak_MiB"] = round(status("VmHWM:"), 1)
out["formats"] = trainer.graph.formats()["created"]
print(json.dumps(out))
"""


def main():
    dataset = sys.argv[1] if len(sys.argv) > 1 else "synthetic:num_nodes=200000,avg_degree=20"
    model = sys.argv[2] if len(sys.argv) > 2 else "gcn"
    # run from this folder: ``python -c`` puts the current folder first on sys.path, which would shadow
    # PYTHONPATH's dgl_exact with a checkout's when run from its root
    run = subprocess.run([sys.executable, "-c", CHILD, dataset, model], env={**os.environ, "OMP_NUM_THREADS": "2"},
                         capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
    if run.returncode:
        sys.exit(run.stderr)
    print(run.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
