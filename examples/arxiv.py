"""ogbn-arxiv with EXACT's hyperparameters (GCN, GraphSAGE, GCNII, GAT; full batch).

    python examples/arxiv.py --model sage --bits 2 --kept-frac 0.125 --data-root data
"""
from dgl_exact.cli import example_main

if __name__ == "__main__":
    example_main("ogbn-arxiv", {("gcn", "full"): "arxiv_gcn", ("sage", "full"): "arxiv_sage",
                                ("gcn2", "full"): "arxiv_gcn2", ("gat", "full"): "arxiv_gat"})
