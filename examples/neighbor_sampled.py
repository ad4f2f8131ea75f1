"""Mini-batch training on neighbour-sampled blocks (DGL's ``dgl.dataloading`` pipeline) with dgl_exact's modules.

The model is built from dgl_exact's drop-ins for DGL's convolutions and torch's layers (``dgl_exact.SAGEConv``,
``dgl_exact.nn.BatchNorm1d``, ``ReLU``, ``Dropout``: same constructors and forward as DGL's and torch's); the
sampler and data loader are DGL's own. The training steps run inside ``dgl_exact.config(bits=...)``, so every
activation kept for the backward pass is stored compressed; evaluation samples full neighbourhoods.

    python examples/neighbor_sampled.py                         # Cora (bundled), INT2, fan-outs 10,10
    python examples/neighbor_sampled.py --fanouts 15,10,5 --batch-size 1024 --dataset ogbn-products --data-root data
"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import dgl_exact  # before dgl: makes PyPI's DGL 2.1.0 importable on newer torch (see the README)
import dgl  # noqa: E402  (after dgl_exact, see above)


class SAGE(nn.Module):
    """GraphSAGE-mean over blocks: one block per layer, batch norm, ReLU and dropout between layers."""

    def __init__(self, in_size, hidden, out_size, layers, dropout=0.5):
        super().__init__()
        sizes = [in_size] + [hidden] * (layers - 1) + [out_size]
        self.convs = nn.ModuleList(dgl_exact.SAGEConv(i, o, "mean") for i, o in zip(sizes[:-1], sizes[1:]))
        self.between = nn.ModuleList(
            nn.Sequential(dgl_exact.nn.BatchNorm1d(hidden), dgl_exact.nn.ReLU(), dgl_exact.nn.Dropout(dropout))
            for _ in range(layers - 1))

    def forward(self, blocks, x):
        for i, (conv, block) in enumerate(zip(self.convs, blocks)):
            x = conv(block, x)
            if i < len(self.between):
                x = self.between[i](x)
        return x


def evaluate(model, g, nids, layers, batch_size):
    """Accuracy on ``nids`` with every in-edge of every layer (no sampling)."""
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(layers)
    loader = dgl.dataloading.DataLoader(g, nids, sampler, batch_size=batch_size, shuffle=False)
    model.eval()
    correct = 0
    with torch.no_grad():
        for input_nodes, output_nodes, blocks in loader:
            logits = model(blocks, g.ndata["feat"][input_nodes])
            correct += int((logits.argmax(1) == g.ndata["label"][output_nodes]).sum())
    return correct / len(nids)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="cora", help="dataset name (default: the bundled Cora)")
    p.add_argument("--data-root", default=os.environ.get("DGL_EXACT_DATA", "data"))
    p.add_argument("--fanouts", default="10,10", help="sampled in-edges per node, one per layer, first layer first")
    p.add_argument("--batch-size", type=int, default=32, help="training nodes per batch")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--bits", type=int, choices=(1, 2, 4, 8), default=2)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        fanouts = [int(f) for f in args.fanouts.split(",")]
    except ValueError:
        p.error(f"--fanouts {args.fanouts!r}: expected comma-separated integers such as 15,10,5")
    if not fanouts or any(f == 0 or f < -1 for f in fanouts):
        p.error(f"--fanouts {args.fanouts!r}: each fan-out is a positive count, or -1 for every in-edge")
    if args.epochs < 1 or args.batch_size < 1 or args.hidden < 1:
        p.error("--epochs, --batch-size and --hidden must be at least 1")

    torch.manual_seed(args.seed)
    dgl.seed(args.seed)
    try:
        ds = dgl_exact.data.load_dataset(args.dataset, args.data_root)
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e).splitlines()[0])
    if ds.multilabel:
        p.error(f"{args.dataset} is multi-label; this example trains single-label node classification")
    g = ds.graph
    model = SAGE(ds.num_features, args.hidden, ds.num_classes, len(fanouts))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=5e-4)

    sampler = dgl.dataloading.NeighborSampler(fanouts)
    loader = dgl.dataloading.DataLoader(g, ds.train_idx, sampler, batch_size=args.batch_size, shuffle=True,
                                        drop_last=False)
    for epoch in range(1, args.epochs + 1):
        model.train()
        total_loss, correct, seen = 0.0, 0, 0
        for input_nodes, output_nodes, blocks in loader:
            x = g.ndata["feat"][input_nodes]
            y = g.ndata["label"][output_nodes]
            with dgl_exact.config(bits=args.bits):  # activations kept for backward: compressed
                logits = model(blocks, x)
                loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total_loss += loss.item() * len(output_nodes)
            correct += int((logits.argmax(1) == y).sum())
            seen += len(output_nodes)
        val = evaluate(model, g, ds.val_idx, len(fanouts), 4096)
        print(f"epoch {epoch:4d} | loss {total_loss / seen:.4f} | train acc {correct / seen:.4f} | val acc {val:.4f}")
    print(f"test acc {evaluate(model, g, ds.test_idx, len(fanouts), 4096):.4f}")


if __name__ == "__main__":
    main()
