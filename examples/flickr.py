"""Flickr with EXACT's hyperparameters: GCN, GraphSAGE, GCNII (full batch), GraphSAINT or ClusterGCN SAGE.

    python examples/flickr.py --model sage --sampler saint --bits 2 --data-root data
"""
from dgl_exact.cli import example_main

if __name__ == "__main__":
    example_main("flickr", {("gcn", "full"): "flickr_gcn", ("sage", "full"): "flickr_sage",
                           ("gcn2", "full"): "flickr_gcn2",
                           ("sage", "saint"): "flickr_saint_sage", ("sage", "cluster"): "flickr_cluster_sage"})
