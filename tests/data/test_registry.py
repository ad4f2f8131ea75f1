"""The dataset registry (dgl_exact.data.registry): every dataset's spec, unknown names and arguments refused, and
the metrics. Each format's loading is tested in tests/data/test_<module>.py (cora, ogbn, dgl_builtin, pyg_layout,
synthetic)."""
import pytest
import torch

from dgl_exact._compat import import_dgl
from dgl_exact.data import DATASETS, compute_metric, dataset_status, load_dataset

dgl = import_dgl()


pytestmark = pytest.mark.usefixtures("closed_stdin")


# ---------------------------------------------------------------------------------------------------
# registry, metrics
# ---------------------------------------------------------------------------------------------------
def test_registry():
    for name in ("cora", "ogbn-arxiv", "ogbn-products", "flickr", "reddit", "yelp", "synthetic"):
        spec = DATASETS[name]
        assert spec.name == name and spec.source and spec.layout and spec.instructions
    assert DATASETS["yelp"].multilabel and DATASETS["yelp"].metric == "micro_f1"
    assert dataset_status("cora", "/nonexistent")[0] and dataset_status("synthetic-arxiv", None)[0]
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("nope")
    with pytest.raises(TypeError):
        load_dataset("ogbn-arxiv", "/nonexistent", bogus=1)


def test_metrics():
    logits = torch.tensor([[2.0, -1.0], [-1.0, 1.0], [1.0, 0.5]])
    assert compute_metric("acc", logits, torch.tensor([0, 1, 1])) == pytest.approx(2 / 3)
    multi = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    tp, fp, fn = 2, 2, 1  # predicted (logits > 0): tp (0,0) (1,1); fp (2,0) (2,1); fn (1,0)
    assert compute_metric("micro_f1", logits, multi) == pytest.approx(2 * tp / (2 * tp + fp + fn))
    with pytest.raises(ValueError):
        compute_metric("auc", logits, multi)
