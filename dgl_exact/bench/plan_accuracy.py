"""Budgeted plans against uniform settings at the same memory: ``dgl-exact bench budget``.

Per dataset and model: the predicted step peak and total of the uniform settings (:func:`~.predict.plan`);
for each budget equal to a uniform setting's predicted total (default: INT2's and INT1's), the per-tensor
plan (:func:`~.budget.budget_plan`, sensitivities from probe steps on the training graph); then for every
uniform setting and plan: test accuracy over ``runs`` seeds (the same seeds for all), the step peak the
trainer measures (``--debug-mem``), and the gradient variance each adds, measured against the fp32 gradient
of a freshly initialised model with the dropout masks fixed (mean over ``draws`` compression draws):
``grad_rel_variance``, relative to each parameter tensor's exact gradient and summed over tensors (what the
plan minimises, :func:`~.budget.relative_weights`), and ``grad_variance``, ``||g - g_fp32||^2`` summed over
parameters.
"""
from __future__ import annotations

import contextlib
import dataclasses
import statistics
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..compression_config import CompressionConfig
from ..ops import keep as keeping
from ..planning.budget import FP, BudgetPlan, budget_plan, keep, per_parameter_steps, relative_weights
from ..planning.predict import plan as predict_plan
from ..planning.predict import spec_from_graph
from ..units import parse_bytes

COLUMNS = ["dataset", "model", "setting", "runs", "test_mean", "test_std", "delta_vs_fp32", "peak_pred_MiB",
           "peak_meas_MiB", "grad_rel_variance", "grad_variance"]


def _forked(hook, seed: int):
    """``hook`` with every compression drawing its random numbers from its own seeded generator state, so the
    model's dropout masks do not depend on what was compressed."""
    count = [0]

    def forked(x, cfg, force):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed * 1_000_003 + count[0])
            count[0] += 1
            return hook(x, cfg, force)

    return forked


def gradient_variances(make_model: Callable[[], torch.nn.Module], data, make_hook: Callable[[], Callable],
                       draws: int = 4, seed: int = 0, scope: CompressionConfig = FP) -> Tuple[float, float]:
    """``(relative, plain)`` gradient variance a setting adds, for a fresh model (same initialisation and
    dropout masks) against its fp32 gradient, mean over ``draws``: ``plain`` is ``||g - g_fp32||^2``,
    ``relative`` weighs each parameter tensor by its own exact gradient's squared norm
    (:func:`~.budget.relative_weights`, what the plan minimises). ``make_hook()`` gives the keep hook of the
    setting measured, run under the compression ``scope``."""
    from .. import ops
    from ..compression_config import config as compression_scope

    graph, feat, label, idx = data
    model = make_model()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]

    def grad(hook) -> List[torch.Tensor]:
        for p in params:
            p.grad = None
        torch.manual_seed(seed)
        with keeping.keep_hook(hook), compression_scope(scope):
            loss = ops.cross_entropy(model(graph, feat), label, idx)
        loss.backward()
        return [(p.grad if p.grad is not None else torch.zeros_like(p)) for p in params]

    parts = grad(lambda x, cfg, force: keep(x, cfg, FP, force))
    weight = relative_weights(parts)
    exact = torch.cat([g.flatten() for g in parts])
    rel = plain = 0.0
    for r in range(draws):
        err = (torch.cat([g.flatten() for g in grad(_forked(make_hook(), 1 + r))]) - exact) ** 2
        rel += float((weight * err).sum())
        plain += float(err.sum())
    return rel / draws, plain / draws


def gradient_variance(make_model: Callable[[], torch.nn.Module], data, make_hook: Callable[[], Callable],
                      draws: int = 4, seed: int = 0, scope: CompressionConfig = FP) -> float:
    """The relative gradient variance of :func:`gradient_variances` (the plan's objective)."""
    return gradient_variances(make_model, data, make_hook, draws, seed, scope)[0]


def _scope_hook():
    """The plain keep: the configuration the op derived from the scope in force."""
    return lambda x, c, force: keeping.default_keep(x, c, force)


def budget_comparison(dataset, base_config, runs: int = 10, budgets: Sequence[str] = ("INT2", "INT1"),
                      uniform: Sequence[str] = ("dgl_exact fp32", "INT8", "INT2", "INT1"), replicas: int = 2,
                      draws: int = 4, log: Callable[[str], None] = print,
                      on_run: Optional[Callable[[Dict], None]] = None,
                      on_row: Optional[Callable[[Dict], None]] = None) -> List[Dict]:
    """Rows of :data:`COLUMNS` (see the module docstring). As they finish, each seed's result is logged and
    passed to ``on_run`` (``setting``, ``run``, ``seed``, ``test``, ``val``, ``best_epoch``, ``peak_MiB``), and
    each setting's row to ``on_row`` (without ``delta_vs_fp32``, known only at the end): an interrupted
    comparison keeps what it measured."""
    from ..planning.settings import select
    from ..training.models import build_model
    from ..training.trainer import Trainer

    cfg = base_config.replace(runs=runs)
    probe = Trainer(cfg, dataset=dataset, progress=False, log=None)
    idx = probe.split["train"]
    data = (probe.graph, probe.feat, probe.label[idx], idx)
    spec = spec_from_graph(dataset.graph, dataset.num_features, dataset.num_classes, int(idx.numel()), cfg.model,
                           name=dataset.name, hidden=cfg.hidden, layers=cfg.layers, dropout=cfg.dropout,
                           batch_norm=cfg.batch_norm, heads=cfg.heads)
    sizes = {b: _size(b) for b in budgets}  # a budget is a uniform setting's name or a size ("80MiB")
    names = list(dict.fromkeys(list(uniform) + [b for b in budgets if sizes[b] is None]))
    predicted = {r.setting: r for r in predict_plan(spec, "cpu", names)}

    def make_model():
        torch.manual_seed(cfg.seed)
        return build_model(cfg.model, dataset.num_features, dataset.num_classes, hidden=cfg.hidden,
                           layers=cfg.layers, dropout=cfg.dropout, batch_norm=cfg.batch_norm, heads=cfg.heads)

    rows, fp32 = [], None
    for setting in (select(",".join(uniform)) if uniform else []):  # none given: none (select("") is all)
        row = {"kind": "budget", "dataset": dataset.name, "model": cfg.model, "setting": setting.name, "runs": runs,
               "peak_pred_MiB": predicted[setting.name].step_peak_bytes / 2**20,
               "total_pred_bytes": predicted[setting.name].total_bytes}
        row.update(_train_setting(cfg, dataset, setting.name, setting.compression, contextlib.nullcontext(),
                                  log, on_run))
        row["grad_rel_variance"], row["grad_variance"] = gradient_variances(make_model, data, _scope_hook, draws,
                                                                           cfg.seed, setting.compression)
        if not setting.compression.enabled:
            fp32 = row["test_mean"]
        rows.append(row)
        log(_line(row))
        if on_row is not None:
            on_row(dict(row))
    for ref in budgets:
        budget = predicted[ref].total_bytes if sizes[ref] is None else sizes[ref]
        plan: BudgetPlan = budget_plan(spec, budget, data=data, replicas=replicas, seed=cfg.seed, log=log,
                                       uniform=predicted, relative=per_parameter_steps(cfg.optimizer))
        name = f"budget = {ref} total" if sizes[ref] is None else f"budget = {ref}"
        log(f"{name}: {plan.summary()}")
        log(plan.table())
        row = {"kind": "budget", "dataset": dataset.name, "model": cfg.model, "setting": name, "runs": runs,
               "peak_pred_MiB": plan.record.step_peak_bytes / 2**20,
               "total_pred_bytes": plan.record.total_bytes,
               "budget_bytes": budget, "plan": plan.record.note}
        # under the scope its slots were recorded in (ops choose what to keep from the configuration in
        # force: GAT keeps a second copy only when compressing), for training and for the variance probe
        row.update(_train_setting(cfg, dataset, name, plan.scope, plan.active(), log, on_run))
        row["grad_rel_variance"], row["grad_variance"] = gradient_variances(make_model, data, plan.hook, draws,
                                                                           cfg.seed, plan.scope)
        rows.append(row)
        log(_line(row))
        if on_row is not None:
            on_row(dict(row))
    for row in rows:
        row["delta_vs_fp32"] = None if fp32 is None else row["test_mean"] - fp32
    return rows


def _train_setting(cfg, dataset, name: str, setting_cfg: CompressionConfig, scope, log: Callable[[str], None],
                   on_run: Optional[Callable[[Dict], None]]) -> Dict:
    """``cfg.runs`` runs of ``cfg`` at ``setting_cfg`` under ``scope``, each logged and passed to ``on_run``;
    the test scores' mean, deviation and values, and the largest measured step peak (MiB)."""
    from ..training.trainer import Trainer

    trainer = Trainer(cfg.replace(compression=setting_cfg), dataset=dataset, progress=False, log=None)
    results = []
    with scope:
        for run in range(cfg.runs):
            r = trainer.run(run, debug_mem=True, completed=[dataclasses.asdict(x) for x in results])
            results.append(r)
            peak = getattr(r, "peak_bytes", None)
            rec = {"setting": name, "run": r.run, "seed": r.seed, "test": r.test, "val": r.val,
                   "best_epoch": r.best_epoch, "peak_MiB": None if peak is None else peak / 2**20}
            log(f"{name}: run {r.run + 1}/{cfg.runs} (seed {r.seed}): test {r.test:.4f}, val {r.val:.4f}, "
                f"best epoch {r.best_epoch}" + ("" if peak is None else f", step peak {peak / 2**20:.1f} MiB"))
            if on_run is not None:
                on_run(rec)
    tests = [r.test for r in results]
    peaks = [r.peak_bytes for r in results if getattr(r, "peak_bytes", None)]
    return {"test_mean": statistics.fmean(tests), "test_std": statistics.stdev(tests) if len(tests) > 1 else 0.0,
            "tests": tests, "peak_meas_MiB": max(peaks) / 2**20 if peaks else None}


def _size(budget: str):
    """Bytes of a budget given as a size, None for a uniform setting's name."""
    try:
        return parse_bytes(budget)
    except ValueError:
        return None


def _line(row: Dict) -> str:
    meas = row.get("peak_meas_MiB")
    return (f"{row['setting']}: test {row['test_mean']:.4f} +- {row['test_std']:.4f}, step peak predicted "
            f"{row['peak_pred_MiB']:.1f} MiB, measured {'n/a' if meas is None else f'{meas:.1f} MiB'}, "
            f"gradient variance relative {row['grad_rel_variance']:.3g}, plain {row['grad_variance']:.3g}"
            + (f" [{row['plan']}]" if row.get("plan") else ""))


def format_rows(rows: Sequence[Dict]) -> str:
    def cell(k, v):
        if v is None:
            return "n/a"
        if k in ("grad_variance", "grad_rel_variance"):
            return f"{v:.3g}"
        if isinstance(v, float):
            return f"{v:+.4f}" if k == "delta_vs_fp32" else (f"{v:.4f}" if k.startswith("test") else f"{v:.1f}")
        return str(v)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(c, r.get(c)) for c in COLUMNS) + " |" for r in rows]
    plans = [f"{r['setting']}: {r['plan']}" for r in rows if r.get("plan")]
    return "\n".join(lines + ([""] + plans if plans else []))


def plot_budget(rows: Sequence[Dict], path: str) -> str:
    """Test accuracy (mean and std over seeds) against the step peak (measured where available, else
    predicted) for uniform settings and budgeted plans."""
    from .plot import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for budgeted, marker, color, label in ((False, "o", "#1f77b4", "uniform"), (True, "*", "#d62728", "budgeted plan")):
        pts = [r for r in rows if r["setting"].startswith("budget") == budgeted]
        xs = [r.get("peak_meas_MiB") or r["peak_pred_MiB"] for r in pts]
        ax.errorbar(xs, [r["test_mean"] for r in pts], yerr=[r["test_std"] for r in pts], fmt=marker, color=color,
                    label=label, markersize=9 if budgeted else 6, capsize=3)
        for x, r in zip(xs, pts):
            ax.annotate(r["setting"].replace("dgl_exact ", ""), (x, r["test_mean"]), fontsize=7,
                        xytext=(4, 4), textcoords="offset points")
    if rows:
        ax.set_title(f"{rows[0]['dataset']} {rows[0]['model']}: accuracy vs step peak", fontsize=10)
    ax.set_xlabel("step peak (MiB; measured, else predicted)")
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
