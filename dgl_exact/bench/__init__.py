"""Benchmarks: activation memory, speed, kernel throughput and accuracy grids (``dgl-exact bench``)."""
