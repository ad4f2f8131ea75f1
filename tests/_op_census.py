"""A storage census for op-level memory tests: a ``TorchDispatchMode`` recording every tensor storage of at least
``min_bytes`` an operator creates, dropped when its last tensor dies; ``best[phase]`` is the largest total of live
recorded storages in each phase (the caller sets ``phase``), ``snapshot[phase]`` what was alive then.

Users' step-level census is :func:`dgl_exact.memory.census`; this one measures single ops (a forward or a backward
alone, with phases the test sets), as the tests under ``tests/ops`` need.
"""
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
