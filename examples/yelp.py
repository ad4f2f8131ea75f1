"""Yelp with EXACT's hyperparameters: GCN, GraphSAGE, GCNII (full batch), GraphSAINT or ClusterGCN SAGE.
Yelp is multi-label (BCE loss, micro-F1).

    python examples/yelp.py --model sage --sampler saint --bits 2 --data-root data
"""
from dgl_exact.cli import example_main

if __name__ == "__main__":
    example_main("yelp", {("gcn", "full"): "yelp_gcn", ("sage", "full"): "yelp_sage", ("gcn2", "full"): "yelp_gcn2",
                           ("sage", "saint"): "yelp_saint_sage", ("sage", "cluster"): "yelp_cluster_sage"})
