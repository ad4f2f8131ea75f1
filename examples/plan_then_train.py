"""Plan, then train: ask the planner which compression setting fits a memory budget, then train with it.

``dgl_exact.planning.plan`` predicts, for each standard setting (``dgl_exact fp32``, ``INT8``, ``INT4``,
``INT2``, ...), a full-graph training step's static memory (graph, features, parameters, optimizer state),
activation memory, step peak and total, from one recorded step of the model on each of two small random graphs
of the dataset's shape (nothing is allocated at full size). The script picks the least compressed setting whose
predicted total fits ``--budget``, builds the model the planner planned (``dgl_exact.training.models``), trains
it at that setting and measures one step's memory (``dgl_exact.memory.measure_step``) beside the prediction.

    python examples/plan_then_train.py                          # Cora (bundled), SAGE 3x256, budget 40MiB
    python examples/plan_then_train.py --budget 30MiB --model gcn --hidden 128 --epochs 50
    python examples/plan_then_train.py --dataset ogbn-arxiv --data-root data --budget 2GiB
"""
import argparse
import os

import torch
import torch.nn.functional as F

import dgl_exact  # before dgl: makes PyPI's DGL 2.1.0 importable on newer torch (see the README)
import dgl  # noqa: E402  (after dgl_exact, see above)
from dgl_exact import planning  # noqa: E402
from dgl_exact.planning import settings as presets  # noqa: E402
from dgl_exact.training.models import build_model  # noqa: E402

#: tried in this order: the first that fits is used (least compressed first: the least gradient noise)
SETTINGS = ("dgl_exact fp32", "INT8", "INT4", "INT2", "INT2 + RP(0.125) + blocks(64) + optimal")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="cora", help="dataset name (default: the bundled Cora)")
    p.add_argument("--data-root", default=os.environ.get("DGL_EXACT_DATA", "data"))
    p.add_argument("--model", choices=("gcn", "sage", "gat"), default="sage")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--budget", default="40MiB", help="memory for the whole training step: static + step peak "
                                                      "(a size: 512MiB, 2GiB, 8e9)")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.layers < 1 or args.epochs < 2 or args.hidden < 1:
        p.error("--layers and --hidden must be at least 1, --epochs at least 2 (the second step is measured)")
    try:
        budget = planning.parse_bytes(args.budget, "--budget")
        ds = dgl_exact.data.load_dataset(args.dataset, args.data_root)
        spec = planning.spec_for_dataset(args.dataset, args.model, args.data_root, hidden=args.hidden,
                                         layers=args.layers)
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e).splitlines()[0])
    if ds.multilabel:
        p.error(f"{args.dataset} is multi-label; this example trains single-label node classification")

    # 1. Plan: predicted memory per setting, against the budget (the "device" may be a size).
    fmt = dgl_exact.memory.format_bytes
    print(f"planning {spec.describe()} within {fmt(budget)}")
    records = planning.plan(spec, device=str(budget), settings=SETTINGS)
    for r in records:
        print(f"  {r.setting:42s} static {fmt(r.static_bytes):>10s}  activations {fmt(r.activation_bytes):>10s}  "
              f"step peak {fmt(r.step_peak_bytes):>10s}  total {fmt(r.total_bytes):>10s}  "
              f"{'fits' if r.fits else 'over'}")
    chosen = next((r for r in records if r.fits), None)
    if chosen is None:
        smallest = min(records, key=lambda r: r.total_bytes)
        p.error(f"no setting fits --budget {args.budget}; the smallest, {smallest.setting}, needs "
                f"{fmt(smallest.total_bytes)}: raise --budget or lower --hidden/--layers")
    compression = presets.select(chosen.setting)[0].compression
    print(f"training with {chosen.setting} (predicted total {fmt(chosen.total_bytes)})")

    # 2. Train the model the planner planned, at the chosen setting.
    torch.manual_seed(args.seed)
    g = ds.graph
    if spec.self_loops:  # GCN and GAT run on the graph with one self loop per node, as planned
        g = dgl.add_self_loop(dgl.remove_self_loop(g))
    x, y, train_idx = ds.features, ds.labels, ds.train_idx
    model = build_model(spec.model, spec.features, spec.classes, hidden=spec.hidden_size, layers=spec.layers,
                        dropout=spec.dropout, batch_norm=spec.batch_norm, heads=spec.heads)
    model = dgl_exact.compress_model(model, config=compression)  # its modules are dgl_exact's: sets the config
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=5e-4)

    def forward():
        return F.cross_entropy(model(g, x)[train_idx], y[train_idx])

    for epoch in range(1, args.epochs + 1):
        model.train()
        opt.zero_grad()
        if epoch == 2:  # the second step (Adam's state exists): measured
            step = dgl_exact.memory.measure_step(forward, opt, modules=[model], exclude=[x])
            loss = step.result
            measured = step.peak_bytes
            print(f"epoch 2 step: activations {fmt(step.activation_bytes)} (predicted "
                  f"{fmt(chosen.activation_bytes)}), step peak {fmt(measured)} (predicted "
                  f"{fmt(chosen.step_peak_bytes)}; {step.peak_method or 'not measured here'})")
        else:
            loss = forward()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(g, x).argmax(1)
        val = float((pred[ds.val_idx] == y[ds.val_idx]).float().mean())
        print(f"epoch {epoch:4d} | loss {loss.item():.4f} | val acc {val:.4f}")
    print(f"test acc {float((pred[ds.test_idx] == y[ds.test_idx]).float().mean()):.4f}")


if __name__ == "__main__":
    dgl_exact.memory.prepare_cpu_peak()  # first thing in the process: the CPU step peak is then measured right
    main()
