"""One measured full-graph training step of the trainer, to check `dgl-exact plan`'s static and total memory.

In this process (run it fresh): generate / load the dataset (timed), let the Trainer prepare its graph (the
dataset object the script loaded is dropped, as a user would), build the model, run one warm-up step, then
measure the second step with the project's meter (``Trainer._step(measure=True)``: activations, step peak
above the memory before the step, and the trainer's breakdown of model and data bytes). Resident sizes
(VmRSS, VmHWM) are read at each stage, each stage printing one JSON line as it ends. A watchdog ends
the process (exit 3) when its resident size passes ``--rss-limit`` GiB, so a shared machine is not pushed
into swap or the OOM killer.

    python scripts/measured_step.py [--dataset synthetic-products] [--model gcn] [--hidden 256] [--layers 3]
                                    [--setting INT2] [--rss-limit 16] [--static-only]

Compare with ``dgl-exact plan --dataset D --model M --hidden H --layers L --settings S`` (static, step peak,
total = static + step peak).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import threading
import time

GiB = 2 ** 30


def status(key: str) -> int:
    """``key`` of /proc/self/status (VmRSS:, VmHWM:), bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key)) * 1024


def reset_hwm() -> None:
    """VmHWM := VmRSS (Linux: 5 to /proc/self/clear_refs), to read one stage's high-water mark."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def watchdog(limit: int) -> None:
    def watch():
        while True:
            rss = status("VmRSS:")
            if rss > limit:
                print(json.dumps({"error": f"resident {rss / GiB:.2f} GiB passed the limit {limit / GiB:.1f} GiB"}),
                      flush=True)
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="synthetic-products")
    ap.add_argument("--model", default="gcn")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--setting", default="INT2")
    ap.add_argument("--rss-limit", type=float, default=16.0, help="GiB")
    ap.add_argument("--static-only", action="store_true", help="Stop after counting the static part.")
    a = ap.parse_args()
    watchdog(int(a.rss_limit * GiB))

    import torch

    import dgl_exact
    from dgl_exact import memory
    from dgl_exact.compression_config import config as compression_scope
    from dgl_exact.data import load_dataset
    from dgl_exact.data.compact import structure_bytes
    from dgl_exact.ops.structure import cached_static_tensors, structure_of
    from dgl_exact.planning.settings import select
    from dgl_exact.training.config import TrainConfig
    from dgl_exact.training.trainer import Trainer

    def release():
        gc.collect()
        memory._release_free_heap()

    setting = select(a.setting)[0]
    t_start = time.perf_counter()

    def stage(name, **values):  # one JSON line per stage, as it finishes: a run stopped later keeps them
        values = {k: v for k, v in values.items() if v is not None}
        line = {"stage": name, "wall_s": round(time.perf_counter() - t_start, 1), **values,
                "rss": status("VmRSS:"), "hwm": status("VmHWM:")}
        line["gib"] = {k: round(v / GiB, 3) for k, v in line.items() if isinstance(v, int) and k != "threads"}
        print(json.dumps(line), flush=True)

    memory.prepare_cpu_peak()
    stage("imports", dataset=a.dataset, model=f"{a.model} {a.layers}x{a.hidden} BN", setting=setting.name,
          dgl_exact=dgl_exact.__file__, threads=torch.get_num_threads())
    t0 = time.perf_counter()
    ds = load_dataset(a.dataset, "unused", quiet=True)
    stage("loaded", seconds=round(time.perf_counter() - t0, 1), summary=ds.summary())
    cfg = TrainConfig(dataset=a.dataset, model=a.model, hidden=a.hidden, layers=a.layers, dropout=0.5,
                      batch_norm=True, epochs=2, runs=1, data_root="unused", compression=setting.compression)
    reset_hwm()
    t0 = time.perf_counter()
    trainer = Trainer(cfg, dataset=ds, progress=False, log=None)
    del ds  # the user's copy goes; the trainer holds its own graph
    release()
    stage("prepared", seconds=round(time.perf_counter() - t0, 1), structure=trainer.structure_note)
    model, optimizer, scaler = trainer.build(cfg.seed)
    model.train()
    inputs = trainer._batch_inputs(None)
    # the structure cache as GCN's forward builds it (degrees; nothing per edge), to count the static part
    # before any step: the same tensors the step's first aggregation caches
    if a.model == "gcn":
        st = structure_of(trainer.graph, trainer.device)
        st.out_degrees()
        st.in_degrees()
    g = trainer.graph
    data = [trainer.feat, trainer.label, trainer.train_label, *trainer.split.values(),
            *(t for t in g.ndata.values() if isinstance(t, torch.Tensor))]
    params = list(model.parameters()) + list(model.buffers())
    release()
    stage("static", graph_bytes=structure_bytes(g), cache_bytes=memory.tensor_bytes(cached_static_tensors()),
          data_tensor_bytes=memory.tensor_bytes(data), parameter_bytes=memory.tensor_bytes(params))
    if a.static_only:
        return
    with compression_scope(cfg.compression):
        reset_hwm()
        t0 = time.perf_counter()
        trainer._step(model, optimizer, scaler, inputs)  # warm-up: Adam's state, the structure cache
        seconds = round(time.perf_counter() - t0, 1)
        release()
        stage("step1", seconds=seconds)
        t0 = time.perf_counter()
        _, report = trainer._step(model, optimizer, scaler, inputs, measure=True)
        seconds = round(time.perf_counter() - t0, 1)
    b = report.breakdown
    stage("step2", seconds=seconds, activation_bytes=report.activation_bytes, step_peak_bytes=report.peak_bytes,
          peak_method=report.peak_method, model_bytes=b["model_bytes"], data_bytes=b["data_bytes"],
          static_bytes=b["model_bytes"] + b["data_bytes"], total_bytes=b["total_bytes"])

if __name__ == "__main__":
    main()
