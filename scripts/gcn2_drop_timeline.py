"""Step-2 resident-memory timeline of GCNII 16x256 on synthetic-arxiv: peak (VmHWM) per interval."""
import contextlib
import gc
import os
import sys

import torch
from dgl_exact import memory
from dgl_exact.data import load_dataset
from dgl_exact.compression_config import config as compression_scope
from dgl_exact.bench.runner import Workload
from dgl_exact.planning.settings import select
from dgl_exact.ops import gcn2

setting = select(sys.argv[1])[0]
if os.environ.get("GCN2_HOLD_TO_END"):
    gcn2.graph_freed_after_backward = lambda: False
torch.set_num_threads(1)
work = Workload(load_dataset("synthetic-arxiv", "data"), "cpu", layers=16)
model = work.build("gcn2", setting.impl)
model.train()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
step = work.step_fn("gcn2", model, setting.impl)
MiB = 2**20
marks = []
state = {}
def mark(name):
    if not state.get("on"):
        return
    hwm = memory._status_bytes("VmHWM:") - state["before"]
    rss = memory._status_bytes("VmRSS:") - state["before"]
    marks.append((name, hwm / MiB, rss / MiB))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
real = gcn2._layer_backward
def spy(g, items, rec, *a):
    mark(f"before layer {rec.step.index} bwd")
    out = real(g, items, rec, *a)
    return out
gcn2._layer_backward = spy
def run():
    opt.zero_grad(set_to_none=True)
    with compression_scope(setting.compression) if setting.compression else contextlib.nullcontext():
        loss, logits = step()
        del logits
        mark("forward")
        loss.backward()
        mark("backward end")
        opt.step()
        mark("optimizer")
run()
memory._fix_mmap_threshold()
gc.collect()
memory._release_free_heap()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
state["before"] = memory._status_bytes("VmRSS:")
state["on"] = True
run()
print(setting.name, "drop" if not os.environ.get("GCN2_HOLD_TO_END") else "nodrop")
for n, h, r in marks:
    print(f"{n:24s} peak-in-interval {h:8.1f}  rss-at-mark {r:8.1f}")
print("STEP PEAK", max(h for _, h, _ in marks))
