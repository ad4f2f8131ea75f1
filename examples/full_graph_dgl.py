"""Full-graph training of a plain DGL model, converted by dgl_exact so its activations are kept compressed.

The model is written with DGL's own modules (``dgl.nn.GraphConv`` or ``dgl.nn.SAGEConv``, batch norm, ReLU,
dropout); one call, ``dgl_exact.compress_model(model, config=...)``, converts it in place. The training loop
is plain PyTorch. Before training, the script measures the activation memory of one training forward of
the original model and of the converted one (``dgl_exact.memory.measure``) and prints what was saved.

    python examples/full_graph_dgl.py                           # Cora (bundled), GCN, INT2, 200 epochs
    python examples/full_graph_dgl.py --conv sage --bits 4 --epochs 50
    python examples/full_graph_dgl.py --dataset ogbn-arxiv --data-root data   # any `dgl-exact datasets` name
"""
import argparse
import copy
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import dgl_exact  # before dgl: makes PyPI's DGL 2.1.0 importable on newer torch (see the README)
import dgl  # noqa: E402  (after dgl_exact, see above)
import dgl.nn as dglnn  # noqa: E402


class GNN(nn.Module):
    """``layers`` graph convolutions; between them batch norm, ReLU and dropout, as DGL's examples do."""

    def __init__(self, conv, in_size, hidden, out_size, layers=2, dropout=0.5):
        super().__init__()
        sizes = [in_size] + [hidden] * (layers - 1) + [out_size]
        make = {"gcn": lambda i, o: dglnn.GraphConv(i, o),
                "sage": lambda i, o: dglnn.SAGEConv(i, o, "mean")}[conv]
        self.convs = nn.ModuleList(make(i, o) for i, o in zip(sizes[:-1], sizes[1:]))
        # BatchNorm1d -> ReLU -> Dropout in an nn.Sequential: compress_model runs it as one fused op
        self.between = nn.ModuleList(nn.Sequential(nn.BatchNorm1d(hidden), nn.ReLU(), nn.Dropout(dropout))
                                     for _ in range(layers - 1))

    def forward(self, g, x):
        for i, conv in enumerate(self.convs):
            x = conv(g, x)
            if i < len(self.between):
                x = self.between[i](x)
        return x


def accuracy(logits, labels, idx):
    return float((logits[idx].argmax(1) == labels[idx]).float().mean())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="cora", help="dataset name (default: the bundled Cora)")
    p.add_argument("--data-root", default=os.environ.get("DGL_EXACT_DATA", "data"))
    p.add_argument("--conv", choices=("gcn", "sage"), default="gcn")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--bits", type=int, choices=(1, 2, 4, 8), default=2)
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.layers < 1 or args.epochs < 1 or args.hidden < 1:
        p.error("--layers, --epochs and --hidden must be at least 1")

    torch.manual_seed(args.seed)
    try:
        ds = dgl_exact.data.load_dataset(args.dataset, args.data_root)
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e).splitlines()[0])
    g = dgl.add_self_loop(dgl.remove_self_loop(ds.graph))  # GraphConv refuses nodes without in-edges
    x, y = ds.features, ds.labels
    train_idx, val_idx, test_idx = ds.train_idx, ds.val_idx, ds.test_idx
    if ds.multilabel:
        p.error(f"{args.dataset} is multi-label; this example trains single-label node classification")

    model = GNN(args.conv, x.shape[1], args.hidden, ds.num_classes, layers=args.layers)
    original = copy.deepcopy(model)  # kept only to measure what the conversion saves

    # The one change to a DGL model: convert it. Every compressed op inside its forward runs at `config`.
    model, report = dgl_exact.compress_model(model, config=dgl_exact.CompressionConfig(bits=args.bits),
                                             report=True)
    print(report)

    # Activation memory of one training forward, before and after the conversion (bytes kept for backward).
    def step(m):
        return lambda: F.cross_entropy(m(g, x)[train_idx], y[train_idx])

    before = dgl_exact.memory.measure(step(original.train()), modules=[original], exclude=[x])
    after = dgl_exact.memory.measure(step(model.train()), modules=[model], exclude=[x])
    fmt = dgl_exact.memory.format_bytes
    print(f"activation memory: DGL fp32 {fmt(before.activation_bytes)}, dgl_exact INT{args.bits} "
          f"{fmt(after.activation_bytes)} ({before.activation_bytes / max(after.activation_bytes, 1):.1f}x less, "
          f"{fmt(before.activation_bytes - after.activation_bytes)} saved)")
    del original

    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=5e-4)
    for epoch in range(1, args.epochs + 1):
        model.train()
        loss = F.cross_entropy(model(g, x)[train_idx], y[train_idx])
        opt.zero_grad()
        loss.backward()  # gradients from the compressed activations
        opt.step()
        model.eval()
        with torch.no_grad():
            logits = model(g, x)
        print(f"epoch {epoch:4d} | loss {loss.item():.4f} | train acc {accuracy(logits, y, train_idx):.4f} "
              f"| val acc {accuracy(logits, y, val_idx):.4f}")
    print(f"test acc {accuracy(logits, y, test_idx):.4f}")


if __name__ == "__main__":
    main()
