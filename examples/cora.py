"""Cora (bundled with dgl_exact, works offline): 2-layer GCN or GraphSAGE through `dgl-exact train`.

The hyperparameters are the bundled configs ``cora_gcn`` and ``cora_sage`` (both: 2 layers, hidden 64, dropout
0.5, lr 0.01, weight decay 5e-4, 200 epochs, no batch norm), not EXACT's: EXACT does not benchmark Cora.
For a plain Python training loop see ``full_graph_dgl.py``.

    python examples/cora.py --model gcn --bits 2 --runs 10
"""
from dgl_exact.cli import example_main

if __name__ == "__main__":
    example_main("cora", {("gcn", "full"): "cora_gcn", ("sage", "full"): "cora_sage"}, default_model="gcn")
