"""Accuracy of models as users write them (``dgl-exact bench accuracy --model arxiv-gcn-user,...``), and the
verdict every accuracy row carries: is its mean within noise of the fp32 baseline's?

The user models (:data:`~dgl_exact.bench.user_models.USER_MODELS`) are trained here as a user trains them: the
model built from seed ``seed + run`` (DGL's layers for ``DGL fp32``; converted by
:func:`dgl_exact.compress_model` alone for dgl_exact's settings, built and trained inside the setting's
compression scope), full graph, Adam, cross-entropy on the training nodes, the test metric at the epoch of the
best validation metric. The project's own models go through :class:`~dgl_exact.training.trainer.Trainer`
(:func:`~dgl_exact.bench.runner.accuracy_grid`); both end in :func:`compare_to_baseline`.

**Within noise.** With ``n_a``, ``n_b`` seeds, test means ``m_a``, ``m_b`` and sample standard deviations
``s_a``, ``s_b``, the standard error of the difference of means is ``se = sqrt(s_a^2/n_a + s_b^2/n_b)``
(Welch's, unpaired: dropout draws differ between the settings, so the same seed does not pair the runs). A row
is within noise of the baseline when ``|m_a - m_b| <= 2 se`` (:data:`NOISE_SE`): a two-sided test at about
the 5 % level for a normal difference (at 5 seeds per side Student's t with ~8 degrees of freedom puts the
5 % point at 2.3 se, so 2 se is slightly stricter).
"""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from typing import Dict, List, Sequence

import torch

from .._progress import progress_bar
from ..compression_config import config as compression_scope
from ..data.base import compute_metric
from ..planning.settings import Setting
from .results import ResultSink
from .runner import Workload

__all__ = ["ACCURACY_COLUMNS", "BASELINES", "NOISE_SE", "compare_to_baseline", "user_accuracy_grid",
           "train_user_model"]

#: the accuracy table's columns (``se_delta``: the standard error of ``delta_vs_fp32``)
ACCURACY_COLUMNS = ["dataset", "model", "setting", "runs", "test_mean", "test_std", "delta_vs_fp32", "se_delta",
                    "verdict", "epoch_ms"]
#: the settings a row is compared with, the first present in a model's rows
BASELINES = ("DGL fp32", "PyG fp32", "dgl_exact fp32")
#: a difference of means is within noise when at most this many standard errors of the difference
NOISE_SE = 2.0


def compare_to_baseline(rows: Sequence[Dict]) -> None:
    """Add ``delta_vs_fp32``, ``se_delta`` and ``verdict`` to each row of ``rows`` (each with ``model``,
    ``setting`` and its per-seed ``tests``), against the same model's baseline row (:data:`BASELINES`); None
    and no verdict where the model has no baseline row or a side has fewer than 2 seeds."""
    for row in rows:
        base = next((b for name in BASELINES for b in rows if b["model"] == row["model"] and b["setting"] == name),
                    None)
        row["delta_vs_fp32"] = row["se_delta"] = None
        row["verdict"] = ""
        if base is None:
            continue
        row["delta_vs_fp32"] = row["test_mean"] - base["test_mean"]
        if base is row:
            row["verdict"] = "baseline"
            continue
        a, b = row["tests"], base["tests"]
        if len(a) < 2 or len(b) < 2:
            continue
        row["se_delta"] = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
        within = abs(row["delta_vs_fp32"]) <= NOISE_SE * row["se_delta"]
        row["verdict"] = "within noise" if within else f"outside noise (> {NOISE_SE:g} SE)"


def train_user_model(work: Workload, model_name: str, setting: Setting, seed: int, epochs: int, lr: float,
                     weight_decay: float) -> Dict:
    """One run: ``{"test", "val", "best_epoch", "epoch_ms"}`` of ``model_name`` trained ``epochs`` full-graph
    epochs under ``setting`` from ``seed`` (the module's docstring says how)."""
    g, x, label = work.graph_for(model_name), work.feat, work.dataset.graph.ndata["label"].to(work.device)
    split = {"val": work.dataset.val_idx.to(work.device), "test": work.dataset.test_idx.to(work.device)}
    scope = compression_scope(setting.compression) if setting.compression else contextlib.nullcontext()
    best = {"val": -math.inf, "test": math.nan, "best_epoch": -1}
    train_s = 0.0
    with scope:
        model = work.build(model_name, setting.impl, seed=seed)
        opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
        step = work.step_fn(model_name, model, setting.impl)
        for epoch in range(epochs):
            t0 = time.perf_counter()
            model.train()
            opt.zero_grad(set_to_none=True)
            step()[0].backward()
            opt.step()
            train_s += time.perf_counter() - t0
            model.eval()
            with torch.no_grad():
                logits = model(g, x).float()
            metrics = {s: compute_metric(work.dataset.metric, logits[idx], label[idx]) for s, idx in split.items()}
            if metrics["val"] > best["val"]:
                best = {**metrics, "best_epoch": epoch}
    return {**best, "epoch_ms": 1000 * train_s / epochs}


def user_accuracy_grid(dataset, models: Sequence[str], settings: Sequence[Setting], runs: int, epochs: int,
                       sink: ResultSink, *, seed: int = 0, lr: float = 0.01, weight_decay: float = 5e-4,
                       device="cpu", progress: bool = True, **model_options) -> List[Dict]:
    """Test metric of each user model over ``runs`` seeds (``seed``, ``seed + 1``, ...; the same for every
    setting) per setting, compared with its baseline (:func:`compare_to_baseline`). PyG settings are skipped.
    ``model_options``: :class:`~dgl_exact.bench.runner.Workload`'s ``hidden``, ``layers``, ``dropout`` and
    ``batch_norm`` (each model's benchmark default where not given)."""
    work = Workload(dataset, device, **model_options)
    rows = []
    for model_name in models:
        model_rows = []
        for setting in progress_bar(settings, progress, desc=f"accuracy {model_name}", unit="setting"):
            if setting.impl == "pyg":
                continue
            results = [train_user_model(work, model_name, setting, seed + run, epochs, lr, weight_decay)
                       for run in range(runs)]
            tests = [r["test"] for r in results]
            row = {"kind": "accuracy", "dataset": dataset.name, "model": model_name, "setting": setting.name,
                   "runs": runs, "seed": seed, "metric": dataset.metric, "epochs": epochs,
                   "test_mean": statistics.fmean(tests), "test_std": statistics.stdev(tests) if runs > 1 else 0.0,
                   "tests": tests, "best_epochs": [r["best_epoch"] for r in results],
                   "epoch_ms": statistics.fmean(r["epoch_ms"] for r in results)}
            model_rows.append(row)
            sink.add(row)  # as it comes: a run cut short keeps what it measured
        compare_to_baseline(model_rows)
        sink.replace_rows(sink.rows)  # the same rows, completed
        rows += model_rows
    return rows
