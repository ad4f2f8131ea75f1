"""ogbn-products with EXACT's hyperparameters: GraphSAGE full batch, ClusterGCN or GraphSAINT.

    python examples/products.py --sampler cluster --bits 2 --data-root data
"""
from dgl_exact.cli import example_main

if __name__ == "__main__":
    example_main("ogbn-products", {("sage", "full"): "products_sage", ("sage", "cluster"): "products_cluster_sage",
                                   ("sage", "saint"): "products_saint_sage"})
