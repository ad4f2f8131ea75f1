"""Reddit with EXACT's hyperparameters: GCN, GraphSAGE, GCNII (full batch), GraphSAINT or ClusterGCN SAGE.

    python examples/reddit.py --model sage --sampler saint --bits 2 --data-root data
"""
from dgl_exact.cli import example_main

if __name__ == "__main__":
    example_main("reddit", {("gcn", "full"): "reddit_gcn", ("sage", "full"): "reddit_sage",
                           ("gcn2", "full"): "reddit_gcn2",
                           ("sage", "saint"): "reddit_saint_sage", ("sage", "cluster"): "reddit_cluster_sage"})
