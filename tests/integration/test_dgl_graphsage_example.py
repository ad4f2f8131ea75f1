"""DGL's mini-batch GraphSAGE example as a client: the pattern of DGL v2.1's
``examples/pytorch/graphsage/node_classification.py`` (a 3-layer ``SAGEConv('mean')`` model over blocks,
``NeighborSampler([10, 10, 10])`` prefetching ``feat`` and ``label``, ``DataLoader``, cross-entropy with Adam,
layer-wise full-neighbour inference with ``MultiLayerFullNeighborSampler(1)``), written here from that
example's structure (trimmed: fewer epochs, smaller batches for the bundled Cora's 140 training nodes), runs
unchanged with ``import dgl_exact as dglnn`` in place of ``import dgl.nn as dglnn`` plus one line of
configuration (``dglnn.set_config(bits=2)``), and reaches DGL's test accuracy at the same seeds."""
import statistics

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dgl_exact
from dgl_exact._compat import import_dgl
from dgl_exact.data import load_dataset

dgl = import_dgl()

pytestmark = pytest.mark.usefixtures("one_thread")

# 20 epochs (100 steps): both converged. At 8 epochs INT2 is still behind (measured over 8 seeds: dgl.nn 80.3 +-
# 1.4, INT2 78.5 +- 2.8, one run at 73.0): the 3-point margin over 3 seeds failed there in CI (2026-12-03); at
# 20 epochs dgl.nn 79.8 +- 1.5, INT2 79.6 +- 1.2 (this module's run_pair(cora, range(8), epochs), one thread).
EPOCHS = 20
BATCH = 32
SEEDS = (0, 1, 2, 3, 4)


# ---- the example's pattern: only ``dglnn`` differs between the runs -----------------------------------
def make_sage(dglnn, in_size, hid_size, out_size):
    class SAGE(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList()
            # three-layer GraphSAGE-mean
            self.layers.append(dglnn.SAGEConv(in_size, hid_size, "mean"))
            self.layers.append(dglnn.SAGEConv(hid_size, hid_size, "mean"))
            self.layers.append(dglnn.SAGEConv(hid_size, out_size, "mean"))
            self.dropout = nn.Dropout(0.5)
            self.hid_size, self.out_size = hid_size, out_size

        def forward(self, blocks, x):
            h = x
            for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                h = layer(block, h)
                if i != len(self.layers) - 1:
                    h = F.relu(h)
                    h = self.dropout(h)
            return h

        def inference(self, g, device, batch_size):
            """Layer-wise inference over all nodes, one layer at a time with full neighbourhoods."""
            feat = g.ndata["feat"]
            sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1, prefetch_node_feats=["feat"])
            dataloader = dgl.dataloading.DataLoader(g, torch.arange(g.num_nodes()).to(g.device), sampler,
                                                    device=device, batch_size=batch_size, shuffle=False,
                                                    drop_last=False, num_workers=0)
            for i, layer in enumerate(self.layers):
                y = torch.empty(g.num_nodes(), self.hid_size if i != len(self.layers) - 1 else self.out_size)
                feat = feat.to(device)
                for input_nodes, output_nodes, blocks in dataloader:
                    h = layer(blocks[0], feat[input_nodes])
                    if i != len(self.layers) - 1:
                        h = F.relu(h)
                        h = self.dropout(h)
                    y[output_nodes[0]:output_nodes[-1] + 1] = h  # output nodes are contiguous
                feat = y
            return y

    return SAGE()


def layerwise_infer(device, graph, nid, model, batch_size):
    model.eval()
    with torch.no_grad():
        pred = model.inference(graph, device, batch_size)[nid]
        label = graph.ndata["label"][nid]
        return float((pred.argmax(1) == label).float().mean())


def train(device, g, train_idx, model, epochs):
    sampler = dgl.dataloading.NeighborSampler([10, 10, 10], prefetch_node_feats=["feat"], prefetch_labels=["label"])
    train_dataloader = dgl.dataloading.DataLoader(g, train_idx, sampler, device=device, batch_size=BATCH,
                                                  shuffle=True, drop_last=False, num_workers=0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=5e-4)
    for _ in range(epochs):
        model.train()
        for input_nodes, output_nodes, blocks in train_dataloader:
            x = blocks[0].srcdata["feat"]
            y = blocks[-1].dstdata["label"]
            y_hat = model(blocks, x)
            loss = F.cross_entropy(y_hat, y)
            opt.zero_grad()
            loss.backward()
            opt.step()


def example(dglnn, g, split, num_classes, seed, epochs=EPOCHS):
    """The example's main: build, train, test accuracy by layer-wise inference."""
    torch.manual_seed(seed)
    dgl.seed(seed)
    model = make_sage(dglnn, g.ndata["feat"].shape[1], 64, num_classes)
    train("cpu", g, split["train"], model, epochs)
    return layerwise_infer("cpu", g, split["test"], model, 4096)


# ---- the comparison ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cora():
    ds = load_dataset("cora", "data")
    g = ds.graph  # DGL's int64 ids, as DGL's own loaders give them (the example passes torch.arange seeds)
    return g, {s: ds.idx(s) for s in ("train", "test")}, ds.num_classes


def run_pair(cora, seeds, epochs):
    """Test accuracies of the example with ``dgl.nn`` and with ``dgl_exact`` at INT2, per seed."""
    import dgl.nn as dgl_nn

    g, split, num_classes = cora
    reference = [example(dgl_nn, g, split, num_classes, s, epochs) for s in seeds]
    previous = dgl_exact.set_config(bits=2)  # the one line of configuration: INT2 (dgl_exact's default)
    try:
        int2 = [example(dgl_exact, g, split, num_classes, s, epochs) for s in seeds]
    finally:
        dgl_exact.set_config(previous)
    return reference, int2


def test_example_runs_with_dgl_exact_in_place_of_dgl_nn(cora):
    """Quick: the pattern runs with ``dgl_exact`` at INT2 (one seed, two epochs) and keeps compressed
    activations; the accuracy comparison is the slow test below (the example's own randomness is not
    reproducible: the same seed gave 0.41 and 0.28 after two epochs with ``dgl.nn`` alone)."""
    g, split, num_classes = cora
    previous = dgl_exact.set_config(bits=2)
    try:
        acc = example(dgl_exact, g, split, num_classes, 0, epochs=2)
    finally:
        dgl_exact.set_config(previous)
    assert 0.0 <= acc <= 1.0
    model = make_sage(dgl_exact, g.ndata["feat"].shape[1], 8, num_classes)
    assert all(isinstance(layer, dgl_exact.SAGEConv) for layer in model.layers)


@pytest.mark.slow
def test_example_reaches_dgl_accuracy(cora):
    """Five seeds, twenty epochs (about 40 s): INT2's mean test accuracy within 3 points of DGL's. The margin
    from the spread: one run's standard deviation at 20 epochs is about 1.5 points (measured, see EPOCHS), so
    the difference of two 5-seed means has a standard error of about 1.5 * sqrt(2 / 5) = 0.95 points and 3
    points is 3.2 of them (a false failure about once in 1,400 runs where INT2 matches DGL)."""
    reference, int2 = run_pair(cora, SEEDS, EPOCHS)
    print(f"test accuracy, dgl.nn: {reference}; dgl_exact INT2: {int2}")
    assert statistics.fmean(reference) > 0.7, reference  # the pattern trains (about 0.8 on Cora)
    assert statistics.fmean(int2) >= statistics.fmean(reference) - 0.03, (reference, int2)
