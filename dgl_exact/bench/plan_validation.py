"""Predicted against measured memory: ``dgl-exact bench plan``.

Per (model, setting): :func:`dgl_exact.planning.predict.predict` for the dataset's exact counts, and the
activation memory and step peak ``dgl-exact bench memory`` measures (each setting in a fresh process on the
CPU: one warm-up step, then :func:`dgl_exact.memory.measure_step` on the second), with the relative error
of the prediction.
"""
from __future__ import annotations

import time
from typing import Dict, List, Sequence

from ..planning.settings import Setting
from ..planning.predict import PlanSpec, predict, samples_for, single_thread, spec_from_graph

COLUMNS = ["model", "setting", "act_pred_MiB", "act_meas_MiB", "act_err_pct", "peak_pred_MiB", "peak_meas_MiB",
           "peak_err_pct", "predict_s"]


def spec_for_workload(work, model: str) -> PlanSpec:
    ds = work.dataset
    return spec_from_graph(ds.graph, ds.num_features, ds.num_classes, len(ds.train_idx), model, name=ds.name,
                           hidden=work.hidden_for(model), layers=work.layers, dropout=work.dropout,
                           batch_norm=work.batch_norm, heads=work.heads)


def _err(pred, meas):
    return None if not meas else 100.0 * (pred - meas) / meas


def validation_grid(work, models: Sequence[str], settings: Sequence[Setting], sink=None, measure: bool = True,
                    progress: bool = True, measured: Sequence[Dict] = ()) -> List[Dict]:
    """One row per (model, setting): predicted and measured activation memory and step peak. ``measured``:
    rows of an earlier run (``plan.jsonl``) whose measurements are reused for the same (model, setting)
    instead of measuring again (the measurement does not depend on the predictor)."""
    earlier = {(r["model"], r["setting"]): r for r in measured if r.get("peak_meas_bytes") is not None}
    from tqdm.auto import tqdm

    from .runner import in_fresh_process, memory_row

    rows = []
    gpu = work.device.type == "cuda"
    for model in models:
        spec = spec_for_workload(work, model)
        with single_thread():
            samples = samples_for(spec, gpu)
        for setting in tqdm(settings, disable=not progress, desc=f"plan {model}", unit="setting"):
            t0 = time.perf_counter()
            with single_thread():
                rec = predict(spec, setting, None, gpu, samples=samples)
            row = {"kind": "plan", "model": model, "setting": setting.name, "device": str(work.device),
                   "act_pred_bytes": rec.activation_bytes, "peak_pred_bytes": rec.step_peak_bytes,
                   "static_pred_bytes": rec.static_bytes, "predict_s": time.perf_counter() - t0,
                   "act_pred_MiB": rec.activation_bytes / 2**20, "peak_pred_MiB": rec.step_peak_bytes / 2**20}
            if (model, setting.name) in earlier:
                old = earlier[(model, setting.name)]
                meas = {"activation_bytes": old["act_meas_bytes"], "step_peak_bytes": old["peak_meas_bytes"],
                        "peak_method": f"{old.get('peak_method')} (earlier run"
                                       + (f"; measured code: {old['code']})" if old.get("code") else ")")}
            elif measure:
                meas = (in_fresh_process(memory_row, work, model, setting, "auto") if work.device.type == "cpu"
                        else memory_row(work, model, setting, "auto"))
            else:
                meas = None
            if meas is not None:
                act, peak = meas.get("activation_bytes"), meas.get("step_peak_bytes")
                row.update(act_meas_bytes=act, peak_meas_bytes=peak,
                           act_meas_MiB=None if act is None else act / 2**20,
                           peak_meas_MiB=None if peak is None else peak / 2**20,
                           act_err_pct=_err(rec.activation_bytes, act), peak_err_pct=_err(rec.step_peak_bytes, peak),
                           peak_method=meas.get("peak_method"))
            rows.append(row)
            if sink is not None:
                sink.add(row)
    return rows


def format_rows(rows: Sequence[Dict]) -> str:
    def cell(key, v):
        if v is None:
            return "n/a"
        if isinstance(v, float):
            return f"{v:+.1f}" if key.endswith("_pct") else f"{v:.1f}"
        return str(v)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(cell(c, r.get(c)) for c in COLUMNS) + " |")
    worst = [abs(r[k]) for r in rows for k in ("act_err_pct", "peak_err_pct") if r.get(k) is not None]
    if worst:
        measured = [r for r in rows if r.get("peak_err_pct") is not None]
        within = sum(1 for r in measured if all(abs(r.get(k) or 0) <= 10 for k in ("act_err_pct", "peak_err_pct")))
        lines.append(f"\nlargest |error| {max(worst):.1f} %; measured rows within 10 %: {within} of {len(measured)}"
                     + (f" ({len(rows) - len(measured)} rows not measured)" if len(measured) < len(rows) else ""))
    return "\n".join(lines)


def measure_spec(spec: PlanSpec, setting: Setting, seed: int = 5) -> Dict:
    """Activation memory and step peak of ``spec`` measured on a random graph of its full size, as
    ``dgl-exact bench memory`` measures them (warm-up step, then :func:`dgl_exact.memory.measure_step`).
    Call it in a fresh process (``dgl_exact.bench.runner.in_fresh_process``) for a CPU peak."""
    import contextlib

    import torch

    from .. import memory
    from ..compression_config import config as compression_scope
    from ..planning.predict import sample_graph, build_for, loss_fn

    memory.prepare_cpu_peak()
    g, feat, y, idx = sample_graph(spec, spec.nodes, spec.edges, seed, setting.impl)
    model = build_for(spec, setting.impl, recompute=setting.recompute)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_of = loss_fn(setting.impl)

    def step():
        logits = model(g, feat)
        return loss_of(logits, y, idx), logits

    with compression_scope(setting.compression) if setting.compression else contextlib.nullcontext():
        for warm in (True, False):
            opt.zero_grad(set_to_none=True)
            report = memory.measure_step(step, opt, modules=[model], exclude=[feat, y, idx],
                                         cpu_method="none" if warm else "auto")
            report.result = None
    return {"activation_bytes": report.activation_bytes, "step_peak_bytes": report.peak_bytes}
