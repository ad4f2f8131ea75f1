"""Cora (bundled with dgl_exact, works offline): 2-layer GCN or GraphSAGE.

    python examples/cora.py --model gcn --bits 2 --runs 10
"""
from dgl_exact.cli import example_main

if __name__ == "__main__":
    example_main("cora", {("gcn", "full"): "cora_gcn", ("sage", "full"): "cora_sage"}, default_model="gcn")
