"""PNG figures of benchmark rows (matplotlib is an optional extra: ``pip install dgl-exact[plot]``)."""
from __future__ import annotations

import os
from typing import Dict, List

from .._files import atomic_write


def pyplot():
    """matplotlib's ``pyplot`` on the Agg backend; ``ImportError`` saying how to install it where it is not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'dgl-exact[plot]'") from None
    return plt


def save_figure(fig, path: str) -> str:
    """Write ``fig`` to ``path`` (format from its extension), atomically (a failure leaves an earlier file as
    it was: :class:`~dgl_exact.errors.WriteError`), and close it; returns ``path``."""
    plt = pyplot()
    try:
        with atomic_write(path, shared=True) as f:
            fig.savefig(f, format=os.path.splitext(path)[1][1:] or "png", dpi=120)
    finally:
        plt.close(fig)
    return path


def _by_model(rows):
    out: Dict[str, List[Dict]] = {}
    for r in rows:
        out.setdefault(r["model"], []).append(r)
    return out


def plot_memory(rows: List[Dict], path: str) -> str:
    """Activation memory and step peak per setting side by side (log scale), one panel per model; the
    ratio to the baseline (DGL fp32) written on each bar."""
    plt = pyplot()
    groups = {m: [r for r in g if r.get("activation_MiB")] for m, g in _by_model(rows).items()}
    groups = {m: g for m, g in groups.items() if g}
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.8), squeeze=False)
    width = 0.4
    for ax, (model, g) in zip(axes[0], groups.items()):
        names = [r["setting"] for r in g]
        x = list(range(len(g)))
        series = [("activation_MiB", "ratio_vs_baseline", "activations (kept for backward)", "#1f77b4", -width / 2)]
        if any(r.get("step_peak_MiB") for r in g):
            series.append(("step_peak_MiB", "peak_ratio_vs_baseline", "step peak (forward + backward + Adam)",
                           "#d62728", width / 2))
        for key, ratio_key, label, color, dx in series:
            pts = [(i + dx, r[key], r.get(ratio_key)) for i, r in zip(x, g) if r.get(key)]
            bars = ax.bar([p[0] for p in pts], [p[1] for p in pts], width=width, color=color, label=label)
            for bar, (_, _, ratio) in zip(bars, pts):
                if ratio:
                    ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() * 1.08, f"{ratio:.1f}x",
                            ha="center", va="bottom", fontsize=7)
        ax.set_yscale("log")
        ax.set_xticks(x)
        ax.set_xticklabels([n.replace(" + ", "\n+") for n in names], rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("MiB (log)")
        shape = f" {g[0]['layers']}x{g[0]['hidden']}" if g[0].get("layers") and g[0].get("hidden") else ""
        ax.set_title(f"{model}{shape}: activations and step peak per setting")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_speed(rows: List[Dict], path: str) -> str:
    """Epoch time per setting with its standard deviation, one panel per model."""
    plt = pyplot()
    groups = {m: [r for r in g if r.get("epoch_ms")] for m, g in _by_model(rows).items()}
    groups = {m: g for m, g in groups.items() if g}
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    for ax, (model, g) in zip(axes[0], groups.items()):
        ax.bar(range(len(g)), [r["epoch_ms"] for r in g], yerr=[r.get("epoch_ms_std", 0) for r in g], capsize=3)
        ax.set_xticks(range(len(g)))
        ax.set_xticklabels([r["setting"].replace(" + ", "\n+") for r in g], rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("epoch time (ms)")
        ax.set_title(f"{model}: epoch time per setting")
        for i, r in enumerate(g):
            if r.get("ratio_vs_baseline"):
                ax.text(i, r["epoch_ms"] * 1.02, f"{r['ratio_vs_baseline']:.2f}x", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_tradeoff(accuracy_rows: List[Dict], memory_rows: List[Dict], path: str) -> str:
    """Accuracy (mean ± std over seeds) against activation memory: the trade-off curve."""
    plt = pyplot()
    mem = {(r["model"], r["setting"]): r.get("activation_MiB") for r in memory_rows}
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for model, g in _by_model(accuracy_rows).items():
        pts = [(mem.get((model, r["setting"])), r["test_mean"], r["test_std"], r["setting"]) for r in g]
        pts = sorted((p for p in pts if p[0]), key=lambda p: p[0])
        if not pts:
            continue
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                    label=model)
        for x, y, _, name in pts:
            ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("activation memory (MiB, log)")
    ax.set_ylabel("test metric")
    ax.set_title("accuracy vs activation memory")
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, path)

