"""Resident memory the first training step adds on a CPU, DGL's GraphConv against dgl_exact's at INT2 (the
fixed cost: code pages, Numba's LLVM JIT where dgl_exact's Numba kernels serve). Each measurement runs in a
fresh interpreter; prints one JSON line per case.

    python scripts/first_step_resident.py            # DGL, dgl_exact (auto backend), dgl_exact with torch kernels
"""
import os
import subprocess
import sys

CHILD = r"""
import json, os, resource, sys
import torch
import dgl_exact, dgl

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024

impl = sys.argv[1]
torch.manual_seed(0)
g = dgl.add_self_loop(dgl.rand_graph(100, 500))
x = torch.randn(100, 16)
conv = (dgl.nn.GraphConv(16, 8) if impl == "dgl" else dgl_exact.GraphConv(16, 8)).train()
before = rss()
with dgl_exact.config(bits=2):
    conv(g, x).relu().sum().backward()
after = rss()
print(json.dumps({"impl": impl, "backend": os.environ.get("DGL_EXACT_BACKEND", "auto"),
                  "first_step_MiB": round(after - before, 1), "resident_MiB": round(after, 1)}))
"""


def main():
    cases = [("dgl", {}), ("exact", {}), ("exact", {"DGL_EXACT_BACKEND": "torch"})]
    for impl, env in cases:
        out = subprocess.run([sys.executable, "-c", CHILD, impl], env={**os.environ, **env, "OMP_NUM_THREADS": "1"},
                             capture_output=True, text=True, check=True)
        print(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
