"""The census-guided edits of docs/guide/census.md, measured as ``dgl-exact bench memory`` measures a row.

One edit per process (the CPU step peak is a resident high-water mark): the model of
``dgl_exact/bench/user_models.py`` with the edit, converted by ``compress_model``, INT2, a fresh Adam, one
warm-up step, then ``dgl_exact.memory.measure_step`` on the second. Prints one JSON line (saved for backward
and step peak, MiB); with ``--census`` the census of the edited model's step first.

    PYTHONPATH=. python scripts/census_edits_memory.py gcn-relu-module [--dataset synthetic-arxiv] [--census]

Edits: ``gcn-relu-module`` (``nn.ReLU()`` passed as the activation instead of ``F.relu``), ``gcn-sequential``
(batch norm, ``nn.ReLU()`` and dropout as one ``nn.Sequential`` per layer), ``gcn-saved-tensors`` and
``gat-saved-tensors`` (``compress_model(model, saved_tensors=True)``), ``gcn-add-in-place`` (the three lines
``conv = ...``, ``linear = ...``, ``h = conv + linear`` as ``h = self.convs[i](graph, h).add_(self.linears[i](h))``),
``gcn-plus-linear`` (the same three lines as one call, ``h = dgl_exact.nn.conv_plus_linear(self.convs[i],
self.linears[i], graph, h)``), ``gat-in-place`` (four lines of the attention layer's ``forward``: see
:func:`_in_place_gat_conv`).
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

from dgl_exact import memory

EDITS = ("gcn-relu-module", "gcn-sequential", "gcn-saved-tensors", "gcn-add-in-place", "gcn-plus-linear",
         "gat-saved-tensors", "gat-in-place")


def _in_place_gat_conv():
    from dgl_exact.bench import user_models as um

    fn, edge_softmax = um.fn, um.edge_softmax

    class InPlaceGATConv(um.ArxivGATConv):
        """ArxivGATConv with 4 lines edited: ``ft`` not kept by the layer once the graph holds it, the aggregation
        taken from the graph (not kept there), the residual linear's output and the bias added to it in place."""

        def forward(self, graph, feat):
            with graph.local_scope():
                ft = self.fc(feat).view(-1, self.heads, self.out_feats)
                el = (ft * self.attn_l).sum(dim=-1).unsqueeze(-1)
                er = (ft * self.attn_r).sum(dim=-1).unsqueeze(-1)
                graph.srcdata.update({"ft": ft, "el": el})
                del ft  # edit 1 (added): update_all replaces the graph's "ft" with its output
                graph.dstdata.update({"er": er})
                graph.apply_edges(fn.u_add_v("el", "er", "e"))
                e = self.leaky_relu(graph.edata.pop("e"))
                graph.edata["a"] = self.attn_drop(edge_softmax(graph, e))
                graph.update_all(fn.u_mul_e("ft", "a", "m"), fn.sum("m", "ft"))
                rst = graph.dstdata.pop("ft")  # edit 2: was rst = graph.dstdata["ft"]
                rst += self.res_fc(feat).view(-1, self.heads, self.out_feats)  # edit 3: was rst = rst + ...
                return rst.add_(self.bias)  # edit 4: was return rst + self.bias

    return InPlaceGATConv


def _residual_edited_gcn(edit: str):
    """ArxivGCN with its three residual lines (``conv = ...``, ``linear = ...``, ``h = conv + linear``) written
    as one: the linear's output added in place to the conv's (``gcn-add-in-place``), or one
    ``dgl_exact.nn.conv_plus_linear`` call (``gcn-plus-linear``)."""
    import dgl_exact
    from dgl_exact.bench import user_models as um

    def residual(conv, linear, graph, h):
        if edit == "gcn-add-in-place":
            return conv(graph, h).add_(linear(h))
        return dgl_exact.nn.conv_plus_linear(conv, linear, graph, h)

    class EditedGCN(um.ArxivGCN):
        def forward(self, graph, feat):
            h = self.input_drop(feat)
            for i in range(self.layers):
                h = residual(self.convs[i], self.linears[i], graph, h)  # the edited line
                if i < self.layers - 1:
                    h = self.norms[i](h)
                    h = self.activation(h)
                    h = self.dropout(h)
            return h

    return EditedGCN


def build(edit: str, num_features: int, classes: int):
    """(benchmark model name, the edited model converted by compress_model)."""
    import dgl_exact
    from dgl_exact.bench import user_models as um

    if edit == "gcn-relu-module":
        return "arxiv-gcn-user", dgl_exact.compress_model(um.ArxivGCN(num_features, 256, classes, 3, nn.ReLU(), 0.5))
    if edit == "gcn-sequential":
        class SequentialGCN(um.ArxivGCN):
            def __init__(self, *args):
                super().__init__(*args)
                self.posts = nn.ModuleList(nn.Sequential(norm, nn.ReLU(), nn.Dropout(0.5)) for norm in self.norms)

            def forward(self, graph, feat):
                h = self.input_drop(feat)
                for i in range(self.layers):
                    h = self.convs[i](graph, h) + self.linears[i](h)
                    if i < self.layers - 1:
                        h = self.posts[i](h)
                return h

        return "arxiv-gcn-user", dgl_exact.compress_model(SequentialGCN(num_features, 256, classes, 3, nn.ReLU(), 0.5))
    if edit == "gcn-saved-tensors":
        return "arxiv-gcn-user", dgl_exact.compress_model(um.ArxivGCN(num_features, 256, classes, 3, F.relu, 0.5),
                                                          saved_tensors=True)
    if edit in ("gcn-add-in-place", "gcn-plus-linear"):
        return "arxiv-gcn-user", dgl_exact.compress_model(_residual_edited_gcn(edit)(num_features, 256, classes, 3,
                                                                                     F.relu, 0.5))
    if edit == "gat-in-place":
        model = um.ArxivGAT(num_features, 128, classes, 3, um.ARXIV_GAT_HEADS, F.relu, 0.5)
        for conv in model.convs:
            conv.__class__ = _in_place_gat_conv()  # the layer with its forward edited as below
        return "arxiv-gat-user", dgl_exact.compress_model(model)
    if edit == "gat-saved-tensors":
        return "arxiv-gat-user", dgl_exact.compress_model(
            um.ArxivGAT(num_features, 128, classes, 3, um.ARXIV_GAT_HEADS, F.relu, 0.5), saved_tensors=True)
    raise SystemExit(f"error: unknown edit {edit!r}; use one of {', '.join(EDITS)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("edit", choices=EDITS)
    ap.add_argument("--dataset", default="synthetic-arxiv")
    ap.add_argument("--data-root", default="data")
    ap.add_argument("--census", action="store_true", help="print the census of the edited model's step first")
    a = ap.parse_args(argv)
    memory.prepare_cpu_peak()
    from dgl_exact.bench.runner import Workload
    from dgl_exact.compression_config import config as scope
    from dgl_exact.data import load_dataset
    from dgl_exact.planning.settings import select

    work = Workload(load_dataset(a.dataset, a.data_root, quiet=True), "cpu")
    torch.manual_seed(0)
    name, model = build(a.edit, work.dataset.num_features, work.dataset.num_classes)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    forward = work.step_fn(name, model, "exact")
    with scope(select("INT2")[0].compression):
        if a.census:
            def step():
                opt.zero_grad(set_to_none=True)
                loss, logits = forward()
                del logits
                loss.backward()
                opt.step()
            print(memory.census(step, top=8), flush=True)
        for warm in (True, False):
            opt.zero_grad(set_to_none=True)
            report = memory.measure_step(forward, opt, modules=[model], cpu_method="none" if warm else "auto",
                                         exclude=[work.feat, work.train_idx, work.train_label])
            report.result = None
    print(json.dumps({"edit": a.edit, "saved_MiB": report.activation_bytes / 2**20, "step_peak_MiB": report.peak_mib,
                      "peak_method": report.peak_method}))


if __name__ == "__main__":
    main()
