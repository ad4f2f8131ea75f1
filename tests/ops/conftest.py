"""Fixtures shared by the op tests: ``exact_kept``, and ``graphs``, small graphs of every kind the ops take (a
random graph with self loops, zero in-degree nodes, a block, and their int32 CSC/CSR-only versions as the trainer
prepares them)."""
from __future__ import annotations

import pytest
import torch

from dgl_exact.data.compact import TRAINING_FORMATS, compact_graph


@pytest.fixture(scope="module")
def graphs():
    import dgl  # here: the tests of structures built without DGL (test_index_structure.py) run where it is absent

    torch.manual_seed(3)
    dgl.seed(3)  # rand_graph draws from DGL's own generator: unseeded, another graph in every process
    g = dgl.add_self_loop(dgl.rand_graph(24, 70))
    # zero in-degree nodes (0 and 7..9), a repeated edge, and edge ids not in CSC order
    zero = dgl.graph((torch.tensor([3, 1, 2, 3, 4, 5, 6, 1, 6]), torch.tensor([4, 2, 3, 4, 5, 6, 1, 2, 2])),
                     num_nodes=10)
    _, _, blocks = dgl.dataloading.MultiLayerFullNeighborSampler(1).sample_blocks(g, torch.tensor([1, 5, 9, 13]))
    # the same graphs as the trainer prepares them: int32 ids, CSC and CSR only (no COO)
    return {"graph": g, "zero_in": zero, "block": blocks[0],
            "graph-int32": compact_graph(g, TRAINING_FORMATS), "zero_in-int32": compact_graph(zero, TRAINING_FORMATS),
            "block-int32": blocks[0].int()}


@pytest.fixture
def exact_kept():
    """Every kept tensor exact (a copy where the op overwrites it), as a planner's fp32 slot keeps it."""
    from dgl_exact.ops import keep as keeping

    with keeping.keep_hook(lambda x, cfg, force: x.clone() if force else x):
        yield
