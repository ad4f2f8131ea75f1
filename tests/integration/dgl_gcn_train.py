"""DGL's GCN example, written the way DGL v2.1's ``examples/pytorch/gcn/train.py`` writes it: ``import dgl``
first, ``import dgl.nn as dglnn``, a two-layer ``dglnn.GraphConv`` model (ReLU activation, dropout 0.5 between
the layers), ``AddSelfLoop``, cross-entropy with Adam (lr 1e-2, weight decay 5e-4), validation accuracy printed
every epoch, test accuracy at the end.

Trimmed for tests (``tests/integration/test_dgl_gcn_example.py`` runs it): ``--epochs`` (DGL's loops 200) and
Cora read from dgl_exact's bundled arrays (``--cora-npz``; identical to DGL's ``CoraGraphDataset``, which
downloads) without importing dgl_exact, so that only the ``dglnn`` import line differs between the runs. The
bfloat16 option is left out.
"""
import argparse

import dgl
import dgl.nn as dglnn
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from dgl import AddSelfLoop


class GCN(nn.Module):
    def __init__(self, in_size, hid_size, out_size):
        super().__init__()
        self.layers = nn.ModuleList()
        # two-layer GCN
        self.layers.append(dglnn.GraphConv(in_size, hid_size, activation=F.relu))
        self.layers.append(dglnn.GraphConv(hid_size, out_size))
        self.dropout = nn.Dropout(0.5)

    def forward(self, g, features):
        h = features
        for i, layer in enumerate(self.layers):
            if i != 0:
                h = self.dropout(h)
            h = layer(g, h)
        return h


def evaluate(g, features, labels, mask, model):
    model.eval()
    with torch.no_grad():
        logits = model(g, features)
        logits = logits[mask]
        labels = labels[mask]
        _, indices = torch.max(logits, dim=1)
        correct = torch.sum(indices == labels)
        return correct.item() * 1.0 / len(labels)


def train(g, features, labels, masks, model, epochs):
    # define train/val samples, loss function and optimizer
    train_mask = masks[0]
    val_mask = masks[1]
    loss_fcn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=5e-4)

    # training loop
    for epoch in range(epochs):
        model.train()
        logits = model(g, features)
        loss = loss_fcn(logits[train_mask], labels[train_mask])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        acc = evaluate(g, features, labels, val_mask, model)
        print("Epoch {:05d} | Loss {:.4f} | Accuracy {:.4f} ".format(epoch, loss.item(), acc))


def cora_graph(path, transform):
    """DGL's ``CoraGraphDataset(transform=transform)[0]`` from dgl_exact's bundled arrays (same edges, features,
    labels and masks; see dgl_exact/data/cora.py)."""
    with np.load(path, allow_pickle=False) as z:
        n, f = (int(v) for v in z["feat_shape"])
        indptr = z["feat_indptr"].astype(np.int64)
        feat = np.zeros((n, f), dtype=np.float32)
        feat[np.repeat(np.arange(n), np.diff(indptr)), z["feat_indices"].astype(np.int64)] = 1.0
        rowsum = feat.sum(1, keepdims=True)
        np.divide(feat, rowsum, out=feat, where=rowsum > 0)
        g = dgl.graph((torch.from_numpy(z["edge_src"].astype(np.int64)),
                       torch.from_numpy(z["edge_dst"].astype(np.int64))), num_nodes=int(z["num_nodes"]))
        g.ndata["feat"] = torch.from_numpy(feat)
        g.ndata["label"] = torch.from_numpy(z["label"].astype(np.int64))
        for split in ("train", "val", "test"):
            mask = torch.zeros(g.num_nodes(), dtype=torch.bool)
            mask[torch.from_numpy(z[f"{split}_idx"].astype(np.int64))] = True
            g.ndata[f"{split}_mask"] = mask
        return transform(g), int(z["num_classes"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--cora-npz", type=str, required=True, help="dgl_exact/data/bundled/cora.npz")
    parser.add_argument("--epochs", type=int, default=200)
    args = parser.parse_args()
    print("Training with DGL built-in GraphConv module.")

    # load and preprocess dataset
    transform = AddSelfLoop()  # by default, it will first remove self-loops to prevent duplication
    g, num_classes = cora_graph(args.cora_npz, transform)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = g.int().to(device)
    features = g.ndata["feat"]
    labels = g.ndata["label"]
    masks = g.ndata["train_mask"], g.ndata["val_mask"], g.ndata["test_mask"]

    # create GCN model
    in_size = features.shape[1]
    hid_size = 16
    out_size = num_classes
    model = GCN(in_size, hid_size, out_size).to(device)

    # model training
    print("Training...")
    train(g, features, labels, masks, model, args.epochs)

    # test the model
    print("Testing...")
    acc = evaluate(g, features, labels, masks[2], model)
    print("Test accuracy {:.4f}".format(acc))
