"""Every bundled config (``dgl_exact/configs/*.yaml``) trains: one epoch of one step (one batch) on a small
synthetic graph of the same kind, with everything else the recipe sets (sampler, model, layers, widths,
edge_drop, use_labels, inductive, layer-wise evaluation, loss, optimizer): only the dataset, the epochs and the
sampler's sizes are made small. A config added to the folder is covered without changing this file."""
from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest
import torch

import dgl_exact  # noqa: F401  (before dgl: DGL compatibility shim)
from dgl_exact.data import DATASETS, load_dataset
from dgl_exact.training.config import CONFIG_DIR, TrainConfig, load_conf
from dgl_exact.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

#: the small graph every recipe trains on (its kind of labels decided by the recipe's own dataset)
SMALL = "synthetic:num_nodes=240,avg_degree=6,num_features=12,num_classes=4"

#: the sampler sizes made small, by sampler: one step per epoch (saint, cluster), a few batches (neighbour)
SMALL_SIZES = {
    "saint": {"saint_budget": 60, "saint_steps": 1},
    "cluster": {"num_parts": 4, "parts_per_batch": 4},
    "neighbor": {"batch_size": 128},
}

CONFIGS = sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))


def _multilabel(ds, seed=0):
    """``ds`` with multi-hot labels (its class, and each other class with probability 0.2): the kind of
    labels yelp has (BCE loss, micro-F1)."""
    gen = torch.Generator().manual_seed(seed)
    g = ds.graph.local_var()
    label = torch.nn.functional.one_hot(g.ndata["label"], ds.num_classes).float()
    g.ndata["label"] = torch.maximum(label, (torch.rand(label.shape, generator=gen) < 0.2).float())
    return dataclasses.replace(ds, graph=g, multilabel=True, metric="micro_f1", key=ds.key + "-multilabel")


@pytest.fixture(scope="module")
def datasets():
    single = load_dataset(SMALL, "unused")
    return {False: single, True: _multilabel(single)}


def _small_config(name, tmp_path) -> TrainConfig:
    values = load_conf(name)
    values.update(dataset=SMALL, epochs=1, runs=1, device="cpu", data_root=str(tmp_path),
                  **SMALL_SIZES.get(values.get("sampler", "full"), {}))
    if values.get("eval_batch_size") is not None:
        values["eval_batch_size"] = 64      # layer-wise evaluation in a few batches
    return TrainConfig(**values)


def test_every_config_is_covered():
    assert len(CONFIGS) >= 30 and "arxiv_gat" in CONFIGS    # the glob finds the bundled recipes


@pytest.mark.parametrize("name", CONFIGS)
def test_bundled_config_trains_one_step(name, datasets, tmp_path):
    recipe = load_conf(name)
    cfg = _small_config(name, tmp_path)
    dataset = datasets[DATASETS[recipe["dataset"]].multilabel]
    trainer = Trainer(cfg, dataset=dataset, progress=False, log=None)
    result = trainer.fit()
    (run,) = result.runs
    assert len(run.history) == 1 and math.isfinite(run.final_loss)
    assert result.metric == ("micro_f1" if dataset.multilabel else "acc") and 0.0 <= run.test <= 1.0
    # what the recipe sets is what ran
    for key in ("model", "sampler", "layers", "hidden", "edge_drop", "use_labels", "inductive", "loss"):
        if key in recipe:
            assert getattr(cfg, key) == recipe[key]


def test_the_cli_runs_a_bundled_recipe_on_another_dataset(tmp_path, capsys):
    """``dgl-exact train --conf NAME --dataset D --epochs 1``: the recipe with the dataset and epochs given."""
    from tests.cli._helpers import run

    args = ["train", "--conf", "cora_gcn", "--dataset", SMALL, "--epochs", "1", "--device", "cpu",
            "--data-root", tmp_path, "--json", tmp_path / "out.json", "-q"]
    code, out, err = run(args, capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "out.json").read_text())
    recipe = load_conf("cora_gcn")
    assert report["config"]["dataset"] == SMALL and report["config"]["epochs"] == 1
    assert all(report["config"][k] == v for k, v in recipe.items() if k not in ("dataset", "epochs"))
