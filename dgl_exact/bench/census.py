"""Which tensors are alive at the high-water mark of a training step (the analysis behind the step peak).

Runs one warm-up step, then a second step under a ``TorchDispatchMode`` that records every tensor storage of
at least 256 KiB that a torch operator creates (operator, the two innermost dgl_exact/dgl/optimizer frames,
phase, shape, dtype) and drops it when its last tensor dies. The largest total of live recorded storages is
the census peak; the storages alive then are printed, largest first. Only torch-dispatched allocations are
seen (DGL's own C++ kernels allocate outside torch on modern torch: its baseline is incomplete here), and
only storages created during the step (not the model, the data, or the caller's tensors from before).
The mode itself holds a reference to every tensor it sees while the operator returns, which stops autograd
from accumulating a gradient in place (``InputBuffer`` adds in place only into a tensor nobody else holds):
backward figures can show one extra layer-sized ``add`` that a run without the census does not allocate.
So the peak of each phase is printed, forward first; compare the backward with ``measure_step``.

    python -m dgl_exact.bench.census --model gcn2 --layers 16 --setting INT2
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import traceback
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

MIB = 2**20


class Census(TorchDispatchMode):
    def __init__(self, min_bytes: int = MIB // 4):
        super().__init__()
        self.min_bytes, self.phase = min_bytes, "forward"
        self.live, self.total, self.seq = {}, 0, 0
        self.best, self.snapshot = {}, {}  # per phase

    def _drop(self, key):
        entry = self.live.get(key)
        if entry is None:
            return
        entry["refs"] -= 1
        if entry["refs"] == 0:
            del self.live[key]
            self.total -= entry["bytes"]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.seq += 1
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if not isinstance(t, torch.Tensor) or t.untyped_storage().nbytes() < self.min_bytes:
                continue
            key = t.untyped_storage().data_ptr()
            if key in self.live:
                self.live[key]["refs"] += 1
            else:
                frames = [f for f in traceback.extract_stack()[:-1]
                          if "dgl_exact" in f.filename or "/dgl/" in f.filename or "torch/optim" in f.filename]
                where = " < ".join(f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno} {f.name}"
                                   for f in frames[-2:][::-1]) or "?"
                n = t.untyped_storage().nbytes()
                self.live[key] = {"bytes": n, "op": func.overloadpacket.__name__, "where": where,
                                  "phase": self.phase, "shape": tuple(t.shape), "dtype": str(t.dtype)[6:],
                                  "refs": 1}
                self.total += n
            weakref.finalize(t, self._drop, key)
        if self.total > self.best.get(self.phase, -1):
            self.best[self.phase] = self.total
            self.snapshot[self.phase] = (func.overloadpacket.__name__, self.seq, [dict(v) for v in self.live.values()])
        return out


def main(argv=None):
    from ..data import load_dataset
    from ..compression_config import config as compression_scope
    from .runner import Workload
    from ..planning.settings import select

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="synthetic-arxiv")
    ap.add_argument("--data-root", default="data")
    ap.add_argument("--model", default="sage", help="a project model or one of bench/user_models.py's")
    ap.add_argument("--layers", type=int, default=None, help="default: the model's own (3; user-block: 5)")
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--setting", default="INT2")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args(argv)
    work = Workload(load_dataset(a.dataset, a.data_root), "cpu", hidden=a.hidden, layers=a.layers)
    setting = select(a.setting)[0]
    model = work.build(a.model, setting.impl)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = work.step_fn(a.model, model, setting.impl)

    def run(census=None):
        opt.zero_grad(set_to_none=True)
        with compression_scope(setting.compression) if setting.compression else contextlib.nullcontext():
            with census or contextlib.nullcontext():
                loss, logits = step()
                del logits
                if census:
                    census.phase = "backward"
                loss.backward()
                if census:
                    census.phase = "optimizer"
                opt.step()

    run()
    census = Census()
    run(census)
    for phase, (op, seq, live) in census.snapshot.items():
        print(f"{a.model} {work.layers_for(a.model)} layers x {work.hidden_for(a.model)}, {setting.name}: {phase} peak "
              f"{census.best[phase] / MIB:.1f} MiB, at operator #{seq} ({op})")
        groups = collections.Counter()
        for e in live:
            groups[(e["op"], e["where"], e["phase"], e["shape"], e["dtype"])] += e["bytes"]
        print("| MiB | created by | at | phase | shape | dtype |\n|---|---|---|---|---|---|")
        for (op_name, where, ph, shape, dtype), n in groups.most_common(a.top):
            print(f"| {n / MIB:.1f} | {op_name} | {where} | {ph} | {shape} | {dtype} |")
        print()


if __name__ == "__main__":
    main()
