"""``dgl-exact bench``: memory, speed, profile, kernels, accuracy and the full report (``bench all``); the
planner's own experiments (``bench plan``, ``bench budget``) are in :mod:`.plan`."""
from __future__ import annotations

import json
import os
import shlex

import click

from .._files import atomic_write
from ._common import MAX_COUNT as _MAX_COUNT
from ._common import (DATA_ROOT_SHOWN, DEFAULT_DEVICE, MODELS, PYG_MODELS, UserError, check_dataset,
                      check_outputs, check_names, hold_outputs, hold_results, provenance_checked, record_results,
                      renamed)

_COUNT, _COUNT0 = click.IntRange(1, _MAX_COUNT), click.IntRange(0, _MAX_COUNT)  # counts and sizes (int32)


def _bench_options(f):
    opts = [
        click.option("--dataset", default="synthetic-arxiv", show_default=True,
                     help="Graph to measure on (any dataset name; synthetic-arxiv is ogbn-arxiv-sized)."),
        click.option("--model", "models", default="sage,gcn", show_default=True,
                     help="Comma-separated: gcn,sage,gat,gcn2, or user-sage,user-sage-donate,user-block-gcn,"
                          "user-block-sage,user-block-gat,user-block-gat-ops,arxiv-gcn-user,arxiv-gat-user,user-gcn2,"
                          "user-gcn2-donate (bench/user_models.py), or PyG models "
                          "pyg-gcn,pyg-sage,pyg-gat,pyg-gcn2,pyg-gatv2 (bench/pyg_models.py; baseline PyG fp32)."),
        click.option("--settings", default="", show_default="all standard ones",
                     help="Comma-separated setting names."),
        click.option("--hidden", type=_COUNT, default=None,
                     show_default="256 for gcn/gcn2, 512 for the user-block models, 128 otherwise",
                     help="Hidden size."),
        click.option("--layers", type=_COUNT, default=None,
                     show_default="5 blocks for the user-block models, 3 layers otherwise",
                     help="Layers; for the user-block models, residual blocks."),
        click.option("--device", default=DEFAULT_DEVICE, show_default=True),
        click.option("--data-root", default=lambda: os.environ.get("DGL_EXACT_DATA", "data"),
                     show_default=DATA_ROOT_SHOWN),
        click.option("--out", default="bench-results", show_default=True, type=click.Path(file_okay=False),
                     help="Folder for JSONL/CSV/Markdown results and figures."),
        click.option("--plot", is_flag=True, help="Also write PNG figures (needs matplotlib)."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bars."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return renamed("--models", "--model", "models")(f)


def _bench_prechecks(out=None, plot=False, files=None, datasets=(), out_option="--out", suites=()) -> None:
    """Before a benchmark does any work: its output folder ``out`` and ``files`` can be written,
    matplotlib is there if figures are asked for, and each of ``datasets`` (name, data root) can be loaded;
    then ``files`` and the results of ``suites`` in ``out`` are locked for the command's life
    (:func:`~._common.hold_results`: one run of a suite per folder)."""
    check_outputs(files=files, folders={out_option: out})
    if plot:
        from ..bench import plot as plots

        try:
            plots.pyplot()
        except ImportError as e:
            raise UserError(f"--plot: {e}") from None
    for name, data_root in datasets:
        check_dataset(name, data_root)
    hold_outputs(files or {})
    if suites:
        hold_results(out, *suites, option=out_option)


def _bench_setup(dataset, models, settings, hidden, layers, device, data_root, budgets=False, quiet=False):
    from ..bench.runner import Workload
    from ..planning.settings import PYG, select
    from ..data import load_dataset
    from ..training.trainer import resolve_device

    try:
        dev = resolve_device(device)
        chosen = select(settings, budgets=budgets)
        from ..bench.user_models import USER_MODELS

        model_list = check_names(models, MODELS + tuple(USER_MODELS) + PYG_MODELS, "--model")
        if not settings:
            chosen = chosen + [PYG]
        ds = load_dataset(dataset, data_root, quiet=quiet)
    except (ValueError, FileNotFoundError) as e:
        raise UserError(str(e)) from None
    return Workload(ds, dev, hidden=hidden, layers=layers), model_list, chosen


def _bench_header(kind, work, extra=""):
    from ..bench.report import machine_line

    return f"{kind} on {work.dataset.summary()}; {machine_line(work.device)}{extra}"


@click.group()
def bench():
    """Benchmarks: memory, speed, kernels, accuracy (side by side in one process)."""


@bench.command("memory")
@provenance_checked
@_bench_options
def bench_memory(dataset, models, settings, hidden, layers, device, data_root, out, plot, quiet):
    """Activation memory and step peak (forward + backward + optimizer step) per setting and model."""
    from ..bench import plot as plots
    from ..bench.results import ResultSink
    from ..bench.runner import MEMORY_COLUMNS, memory_grid, memory_note

    _bench_prechecks(out, plot, suites=["memory"])
    work, model_list, chosen = _bench_setup(dataset, models, settings, hidden, layers, device, data_root, budgets=True,
                                            quiet=quiet)
    sink = ResultSink(out, "memory")
    rows = memory_grid(work, model_list, chosen, sink, progress=not quiet)
    click.echo(sink.finish(MEMORY_COLUMNS + ["note"], "Activation memory and step peak",
                           _bench_header("memory", work, memory_note(rows))))
    record_results(sink.path, work.device, columns=MEMORY_COLUMNS)
    if plot:
        click.echo("figure: " + plots.plot_memory(rows, os.path.join(out, "memory.png")))


@bench.command("census")
@_bench_options
@click.option("--top", type=_COUNT, default=20, show_default=True, help="Rows printed per peak (the JSON has all).")
@click.option("--min-kib", type=_COUNT, default=256, show_default=True, help="Smallest storage followed, KiB.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), show_default="none",
              help="Also write every model's report (dgl_exact.memory.CensusReport.to_dict) here.")
def bench_census(dataset, models, settings, hidden, layers, device, data_root, out, plot, quiet, top, min_kib,
                 json_path):
    """Which source lines hold each model's forward and backward peak (dgl_exact.memory.census) under one
    setting (--settings, one name; INT2 if not given): the tensors alive at each peak, by the line that made them,
    fp32 or compressed, largest first."""
    from ..bench.census import model_census

    if plot:
        raise UserError("bench census writes tables, not figures: leave out --plot")
    _bench_prechecks(files={"--json": json_path})
    work, model_list, chosen = _bench_setup(dataset, models, settings or "INT2", hidden, layers, device, data_root,
                                            quiet=quiet)
    if len(chosen) != 1:
        raise UserError(f"bench census runs one setting: give --settings one name, got {len(chosen)}: "
                        f"{', '.join(s.name for s in chosen)}")
    setting = chosen[0]
    records = []
    for model_name in model_list:
        why = work.runnable(setting.impl, model_name, recompute=setting.recompute)
        if why:
            click.echo(f"{model_name}, {setting.name}: {why}")
            continue
        report = model_census(work, model_name, setting, top=top, min_bytes=min_kib * 1024)
        click.echo(f"{model_name} ({work.layers_for(model_name)} layers x {work.hidden_for(model_name)}), "
                   f"{setting.name}, {_bench_header('census', work)}")
        click.echo(str(report) + "\n")
        records.append({"model": model_name, "setting": setting.name, "dataset": dataset,
                        "layers": work.layers_for(model_name), "hidden": work.hidden_for(model_name),
                        **report.to_dict()})
    if json_path:
        with atomic_write(json_path, "w", encoding="utf-8", shared=True) as f:
            json.dump(records, f, indent=1)
        click.echo(f"records: {json_path}")


@bench.command("minibatch")
@click.option("--dataset", default="synthetic-products", show_default=True)
@click.option("--settings", default="DGL fp32,dgl_exact fp32,INT2,INT2 + RP(0.125) + blocks(64) + optimal",
              show_default=True)
@click.option("--fanouts", default="15,10,5", show_default=True, help="Sampled in-edges per node, one per layer.")
@click.option("--hidden", type=_COUNT, default=256, show_default=True)
@click.option("--memory-budget", default="512MiB", show_default=True, metavar="SIZE",
              help="The step peak every setting's batch must fit (the planner picks the batch size).")
@click.option("--max-batches", type=_COUNT, default=10, show_default=True,
              help="Timed batches per setting (the epoch time is extrapolated).")
@click.option("--data-root", default=lambda: os.environ.get("DGL_EXACT_DATA", "data"), show_default=DATA_ROOT_SHOWN)
@click.option("--out", default="bench-results", show_default=True, type=click.Path(file_okay=False))
@click.option("--quiet", "-q", is_flag=True)
def bench_minibatch(dataset, settings, fanouts, hidden, memory_budget, max_batches, data_root, out, quiet):
    """SAGE on neighbour-sampled batches: per setting, the largest batch size within --memory-budget (as
    `dgl-exact plan --sampler neighbor --batch-size auto` picks it), its measured step peak and epoch time."""
    from .. import memory
    from ..bench.minibatch import MINIBATCH_COLUMNS, minibatch_rows
    from ..bench.report import machine_line
    from ..bench.results import ResultSink
    from ..data import load_dataset
    from ..planning.minibatch import MinibatchPlanner, refuse_recompute
    from ..planning.settings import select
    from ..training.neighbor import parse_fanouts
    from ._common import parse_size

    _bench_prechecks(out, suites=["minibatch"])
    memory.prepare_cpu_peak()  # before the dataset grows the heap: every step peak is measured in this process
    try:
        budget = parse_size(memory_budget, "--memory-budget")
        chosen = select(settings)
        refuse_recompute(chosen)
        fan = parse_fanouts(fanouts)
        ds = load_dataset(dataset, data_root)
        planner = MinibatchPlanner(ds, "sage", fan, hidden=hidden)
        sink = ResultSink(out, "minibatch")
        minibatch_rows(planner, chosen, budget, max_batches, sink, log=None if quiet else
                       (lambda m: click.echo(m, err=True)))
    except (ValueError, FileNotFoundError) as e:
        raise UserError(str(e).splitlines()[0]) from None
    header = (f"sage {len(fan)}x{hidden} on {ds.summary()}, fan-outs {','.join(map(str, fan))}, step-peak budget "
              f"{memory.format_bytes(budget)}; batch size: the planner's pick; step peak measured (resident "
              f"high-water mark) over its sampled batches; epoch time extrapolated from {max_batches} timed batches; "
              f"{machine_line(torch_device())}")
    click.echo(sink.finish(MINIBATCH_COLUMNS, "Largest mini-batch within a memory budget", header))
    record_results(sink.path, torch_device(), columns=MINIBATCH_COLUMNS)


def torch_device():
    """The CPU device (the mini-batch benchmark runs on the CPU)."""
    import torch

    return torch.device("cpu")


@bench.command("speed")
@provenance_checked
@_bench_options
@click.option("--epochs", type=_COUNT, default=5, show_default=True, help="Timed epochs per setting.")
@click.option("--warmup", type=_COUNT0, default=2, show_default=True, help="Untimed warm-up epochs.")
def bench_speed(dataset, models, settings, hidden, layers, device, data_root, out, plot, quiet, epochs, warmup):
    """Epoch time per setting and its ratio to the DGL fp32 baseline."""
    from ..bench import plot as plots
    from ..bench.results import ResultSink
    from ..bench.runner import SPEED_COLUMNS, speed_grid

    _bench_prechecks(out, plot, suites=["speed"])
    work, model_list, chosen = _bench_setup(dataset, models, settings, hidden, layers, device, data_root, quiet=quiet)
    sink = ResultSink(out, "speed")
    rows = speed_grid(work, model_list, chosen, sink, epochs=epochs, warmup=warmup, progress=not quiet)
    click.echo(sink.finish(SPEED_COLUMNS + ["note"], "Epoch time", _bench_header("speed", work)))
    record_results(sink.path, work.device, columns=SPEED_COLUMNS)
    if plot:
        click.echo("figure: " + plots.plot_speed(rows, os.path.join(out, "speed.png")))


@bench.command("profile")
@provenance_checked
@_bench_options
@click.option("--steps", type=int, default=3, show_default=True, help="Profiled training steps per setting.")
@click.option("--warmup", type=int, default=2, show_default=True, help="Unprofiled warm-up steps.")
@click.option("--emulate-gpu", is_flag=True,
              help="Count (not time) what one step asks of a GPU: operator calls, host syncs and bytes along the "
                   "CUDA code path, on the CPU.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), show_default="none",
              help="With --emulate-gpu: write one record per setting (setting, ops, syncs, bytes, ...) here.")
def bench_profile(dataset, models, settings, hidden, layers, device, data_root, out, plot, quiet, steps, warmup,
                  emulate_gpu, json_path):
    """Where a training step's time goes: wall vs GPU kernel time, launches, syncs, top ops per setting.

    With --emulate-gpu: operator calls, host synchronisations and bytes read + written by one training step
    on the GPU code path, counted on the CPU (counts, not times; see dgl_exact.bench.opcount)."""
    from ..bench.results import ResultSink
    from ..bench.runner import PROFILE_COLUMNS, profile_grid

    if not (1 <= steps <= _MAX_COUNT and 0 <= warmup <= _MAX_COUNT):
        raise UserError(f"--steps must be in [1, {_MAX_COUNT}] and --warmup in [0, {_MAX_COUNT}]")
    if plot:
        raise UserError("bench profile writes tables, not figures: leave out --plot")
    if json_path and not emulate_gpu:
        raise UserError("--json goes with --emulate-gpu (the timed profile writes its rows to --out)")
    _bench_prechecks(out, files={"--json": json_path}, suites=["opcount" if emulate_gpu else "profile"])
    work, model_list, chosen = _bench_setup(dataset, models, settings, hidden, layers, device, data_root, quiet=quiet)
    if emulate_gpu:
        from ..bench.opcount import COLUMNS, count_grid, records_for_json

        if work.device.type != "cpu":
            raise UserError("--emulate-gpu counts on the CPU: add --device cpu (on a GPU, leave it out)")
        sink = ResultSink(out, "opcount")
        rows = count_grid(work, model_list, chosen, sink, out, warmup=max(warmup, 1), progress=not quiet)
        click.echo(sink.finish(COLUMNS, "Per-step counts on the GPU code path (counts, not times)",
                               _bench_header("profile --emulate-gpu", work)))
        record_results(sink.path, work.device, columns=COLUMNS)
        click.echo(f"per-op tables: {os.path.join(out, 'opcount_*.txt')}")
        if json_path:
            with atomic_write(json_path, "w", encoding="utf-8", shared=True) as f:
                json.dump(records_for_json(rows), f, indent=1)
            click.echo(f"records: {json_path}")
        return
    sink = ResultSink(out, "profile")
    profile_grid(work, model_list, chosen, sink, out, steps=steps, warmup=warmup, progress=not quiet)
    click.echo(sink.finish(PROFILE_COLUMNS + ["note"], "Step profile", _bench_header("profile", work)))
    record_results(sink.path, work.device, columns=PROFILE_COLUMNS)
    click.echo(f"per-op tables: {os.path.join(out, 'profile_*.txt')}")


@bench.command("kernels")
@provenance_checked
@click.option("--rows", type=_COUNT, default=169343, show_default=True)
@click.option("--cols", type=_COUNT, default=128, show_default=True)
@click.option("--repeats", type=_COUNT, default=5, show_default=True)
@click.option("--device", default=DEFAULT_DEVICE, show_default=True)
@click.option("--out", default="bench-results", show_default=True, type=click.Path(file_okay=False))
@click.option("--quiet", "-q", is_flag=True)
def bench_kernels(rows, cols, repeats, device, out, quiet):
    """compress/decompress throughput (GB/s of fp32 input) per available backend, and the graph kernels'
    weighted sum (ROWS nodes with 14 in-edges each, COLS features) per backend serving it, beside DGL's CPU kernel
    given the same weights and the unweighted sum."""
    from ..bench.graph_kernels import graph_kernel_grid
    from ..bench.report import machine_line
    from ..bench.results import ResultSink
    from ..bench.runner import KERNEL_COLUMNS, kernel_grid
    from ..training.trainer import resolve_device

    _bench_prechecks(out, suites=["kernels"])
    try:
        dev = resolve_device(device)
    except ValueError as e:
        raise UserError(str(e)) from None
    sink = ResultSink(out, "kernels")
    kernel_grid(sink, dev, rows=rows, cols=cols, repeats=repeats, progress=not quiet)
    graph_kernel_grid(sink, dev, nodes=rows, cols=cols, repeats=repeats, progress=not quiet)
    click.echo(sink.finish(KERNEL_COLUMNS, "Kernel throughput", f"best of {repeats}; {machine_line(dev)}"))
    record_results(sink.path, dev, columns=KERNEL_COLUMNS)


@bench.command("accuracy")
@provenance_checked
@renamed("--models", "--model", "models")
@click.option("--dataset", default="cora", show_default=True)
@click.option("--model", "models", default="gcn,sage", show_default=True,
              help="Comma-separated: gcn,sage,gat,gcn2 (trained as `train` trains them); on PyG's layers pyg-gcn, "
                   "pyg-sage, pyg-gat, pyg-gcn2, pyg-gatv2 (baseline 'PyG fp32'); or the user models of "
                   "bench/user_models.py, "
                   "e.g. arxiv-gcn-user,arxiv-gat-user,user-gcn2 (DGL's layers for DGL fp32, converted by "
                   "compress_model alone otherwise).")
@click.option("--settings", default="dgl_exact fp32,INT8,INT2,INT2 + RP(0.125),INT2 + RP(0.125) + blocks(64) + optimal",
              show_default=True, help="Comma-separated setting names; each model is compared with its DGL fp32 "
                                      "(else dgl_exact fp32) row: within noise when |difference of means| <= 2 "
                                      "standard errors of the difference.")
@click.option("--runs", type=_COUNT, default=10, show_default=True, help="Seeds per setting.")
@click.option("--epochs", type=_COUNT, default=200, show_default=True)
@click.option("--conf", default=None, show_default="none",
              help="YAML of training defaults (as for `train`); for the user models its lr, weight_decay, seed and, "
                   "where set, hidden, layers, dropout and batch_norm.")
@click.option("--device", default=DEFAULT_DEVICE, show_default=True)
@click.option("--data-root", default=lambda: os.environ.get("DGL_EXACT_DATA", "data"), show_default=DATA_ROOT_SHOWN)
@click.option("--out", default="bench-results", show_default=True, type=click.Path(file_okay=False))
@click.option("--plot", is_flag=True, help="Accuracy vs memory figure (uses memory.jsonl in --out if present).")
@click.option("--quiet", "-q", is_flag=True)
def bench_accuracy(dataset, models, settings, runs, epochs, conf, device, data_root, out, plot, quiet):
    """Test metric over several seeds per setting, its difference to fp32 and whether that is within noise."""
    from ..bench import plot as plots
    from ..training.config import TrainConfig, load_conf
    from ..bench.accuracy import ACCURACY_COLUMNS, user_accuracy_grid
    from ..bench.report import machine_line
    from ..bench.results import ResultSink, read_rows
    from ..bench.runner import accuracy_grid
    from ..bench.user_models import USER_MODELS
    from ..training.trainer import resolve_device
    from ..planning.settings import select
    from ..data import load_dataset

    _bench_prechecks(out, plot, suites=["accuracy"])
    try:
        chosen = select(settings)
        base = load_conf(conf) if conf else {}
        ds = load_dataset(dataset, data_root)
    except (ValueError, FileNotFoundError) as e:
        raise UserError(str(e)) from None
    sink = ResultSink(out, "accuracy")
    rows, names = [], check_names(models, MODELS + PYG_MODELS + USER_MODELS, "--model")
    for model in names:
        framework = "pyg" if model in PYG_MODELS else "dgl"  # pyg-<model>: the trainer's model on PyG's layers
        try:
            cfg = TrainConfig(**{**base, "dataset": dataset, "epochs": epochs, "device": device,
                                 "data_root": data_root, "framework": framework,
                                 "model": "gcn" if model in USER_MODELS else model.split("-", 1)[-1]})
        except ValueError as e:
            raise UserError(str(e)) from None
        if model in USER_MODELS:  # --conf's width, depth, dropout and batch norm where it sets them
            shape = {k: base[k] for k in ("hidden", "layers", "dropout", "batch_norm") if k in base}
            rows += user_accuracy_grid(ds, [model], chosen, runs, epochs, sink, seed=cfg.seed, lr=cfg.lr,
                                       weight_decay=cfg.weight_decay, device=resolve_device(cfg.device),
                                       progress=not quiet, **shape)
        else:
            rows += accuracy_grid(ds, cfg, chosen, runs, sink, progress=not quiet)
    click.echo(sink.finish(ACCURACY_COLUMNS, "Accuracy", f"{ds.summary()}; {runs} seeds per setting; "
                                                           f"{machine_line(cfg.device)}"))
    record_results(sink.path, cfg.device, columns=ACCURACY_COLUMNS)
    mem_path = os.path.join(out, "memory.jsonl")
    if plot and os.path.exists(mem_path):
        click.echo("figure: " + plots.plot_tradeoff(rows, read_rows(mem_path), os.path.join(out, "tradeoff.png")))


@bench.command("all")
@provenance_checked
@renamed("--models", "--model", "models")
@renamed("--root", "--out", "root", type=click.Path(file_okay=False))
@click.option("--label", default="cpu", show_default=True,
              help="Machine label: the runs recorded in OUT/LABEL/*/runs.json are rerun (with --measure: the "
                   "results go to OUT/LABEL/SUITE/; the options from --dataset to --data-root are --measure's).")
@click.option("--dataset", default="synthetic-arxiv", show_default=True, help="Graph for memory and speed.")
@click.option("--model", "models", default="sage,gcn", show_default=True, help="Comma-separated models.")
@click.option("--accuracy-dataset", default="cora", show_default=True)
@click.option("--runs", type=_COUNT, default=10, show_default=True, help="Seeds per accuracy setting.")
@click.option("--speed-epochs", type=_COUNT, default=3, show_default=True)
@click.option("--device", default=DEFAULT_DEVICE, show_default=True)
@click.option("--data-root", default=lambda: os.environ.get("DGL_EXACT_DATA", "data"), show_default=DATA_ROOT_SHOWN)
@click.option("--out", "root", default="benchmarks", show_default=True, type=click.Path(file_okay=False),
              help="Folder of the results of every machine (this one's: OUT/LABEL/SUITE/).")
@click.option("--benchmarks-md", default=None, show_default="none", type=click.Path(dir_okay=False),
              help="Also rebuild this file from every suite's README.md under --out (the repository's "
                   "BENCHMARKS.md is built so: `--benchmarks-md BENCHMARKS.md`; `bench report` rebuilds it without "
                   "measuring).")
@click.option("--measure", is_flag=True,
              help="Measure memory, speed, kernels and accuracy with the options above (what a LABEL without "
                   "runs.json gets) instead of rerunning the recorded runs.")
@click.option("--suites", "only", default="", show_default="every suite with a runs.json",
              help="Comma-separated suites to rerun (memory, speed, kernels, accuracy, profile, plan, budget, "
                   "minibatch, checks).")
@click.option("--dry-run", is_flag=True, help="List the runs it would rerun (and those it refuses); run nothing.")
@click.option("--quiet", "-q", is_flag=True)
def bench_all(label, dataset, models, accuracy_dataset, runs, speed_epochs, device, data_root, root, benchmarks_md,
              measure, only, dry_run, quiet):
    """Rerun every recorded run of OUT/LABEL/ (each SUITE/runs.json) by the command it records, suite by suite
    (memory, speed, kernels, accuracy, profile, plan, budget, minibatch, checks), one line per run, then regenerate
    each suite's README.md (and, with --benchmarks-md, that file). Only `dgl-exact ...`, `python -m dgl_exact ...`
    and scripts/ commands are run; others are refused. A failed or refused run is reported, the others go on, and
    the command exits 1 at the end.

    With --measure, or for a LABEL without any runs.json: run the memory, speed, kernels and accuracy suites with
    the options given and write each one's results, figures and README.md to OUT/LABEL/SUITE/."""
    from ..bench.rerun import plan

    if measure or not os.path.isdir(os.path.join(root, label)) or not _recorded(os.path.join(root, label)):
        if only or dry_run:
            raise UserError(f"--suites and --dry-run rerun recorded runs: {os.path.join(root, label)} has no "
                            "runs.json" if not measure else "--suites and --dry-run go without --measure")
        return _measure_all(label, dataset, models, accuracy_dataset, runs, speed_epochs, device, data_root, root,
                            benchmarks_md, quiet)
    _bench_prechecks(files={"--benchmarks-md": benchmarks_md})
    try:
        items = plan(root, label, [s.strip() for s in only.split(",") if s.strip()] or None)
    except ValueError as e:
        raise UserError(str(e).splitlines()[0]) from None
    if dry_run:
        for i, item in enumerate(items, 1):
            what = (f"refused: {item.refused}" if item.refused else
                    f"not rerun: {item.skipped}" if item.skipped else f"with run {items.index(item.same_as) + 1}"
                    if item.same_as else shlex.join([k + "=" + v for k, v in item.env.items()] + item.argv))
            click.echo(f"[{i}/{len(items)}] {item.suite}: {item.command}\n    {what}")
        return None
    return _rerun_all(items, root, label, benchmarks_md)


def _recorded(machine_dir: str) -> bool:
    from ..bench.suites import MANIFEST

    return any(os.path.isfile(os.path.join(machine_dir, d, MANIFEST)) for d in os.listdir(machine_dir))


def _rerun_all(items, root, label, benchmarks_md):
    from ..bench.report import SUITES, assemble
    from ..bench.rerun import rerun
    from ..bench.suites import write_suite

    if click.get_current_context().params.get("allow_dirty"):  # the runs measure the same uncommitted code
        for item in items:
            item.env.setdefault("DGL_EXACT_ALLOW_DIRTY", "1")
    failures = rerun(items, lambda line: click.echo(line))
    for suite, folder in dict((item.suite, item.folder) for item in items).items():  # one README each, come what may
        try:
            click.echo(f"report: {write_suite(folder, suite, SUITES.get(suite, suite))}")
        except (ValueError, OSError) as e:
            failures.append(f"report of {folder}: {str(e).splitlines()[0]}")
            click.echo(failures[-1])
    if benchmarks_md:
        click.echo(f"rebuilt {assemble(root, benchmarks_md)}")
    if failures:
        click.echo(f"{len(failures)} failed or refused (of {len(items)} runs):", err=True)
        for line in failures:
            click.echo("  " + line, err=True)
        raise SystemExit(1)


def _measure_all(label, dataset, models, accuracy_dataset, runs, speed_epochs, device, data_root, root,
                 benchmarks_md, quiet):
    """`bench all --measure`: the memory, speed, kernels and accuracy suites, measured here with these options."""
    from ..bench import plot as plots
    from ..bench.report import SUITES, assemble
    from ..bench.suites import write_suite
    from ..bench.results import ResultSink
    from ..bench.accuracy import ACCURACY_COLUMNS
    from ..bench.runner import (KERNEL_COLUMNS, MEMORY_COLUMNS, SPEED_COLUMNS, accuracy_grid,
                                kernel_grid, memory_grid, memory_note, speed_grid)
    from ..training.config import TrainConfig
    from ..planning.settings import select
    from ..data import load_dataset

    machine = os.path.join(root, label)
    _bench_prechecks(machine, files={"--benchmarks-md": benchmarks_md}, datasets=[(accuracy_dataset, data_root)],
                     out_option="--out/--label")
    for suite in ("memory", "speed", "kernels", "accuracy"):  # as `bench SUITE --out OUT/LABEL/SUITE` locks them
        hold_results(os.path.join(machine, suite), suite, option="--out/--label")
    work, model_list, chosen = _bench_setup(dataset, models, "", None, 3, device, data_root)
    progress = not quiet
    mem_sink = ResultSink(os.path.join(machine, "memory"), "memory")
    mem = memory_grid(work, model_list, chosen, mem_sink, progress=progress)
    mem_sink.finish(MEMORY_COLUMNS + ["note"], "Activation memory and step peak",
                    _bench_header("memory", work, memory_note(mem)))
    spd_sink = ResultSink(os.path.join(machine, "speed"), "speed")
    spd = speed_grid(work, model_list, chosen, spd_sink, epochs=speed_epochs, warmup=1, progress=progress)
    spd_sink.finish(SPEED_COLUMNS + ["note"], "Epoch time",
                    _bench_header("speed", work, f"; {speed_epochs} timed epochs after 1 warm-up"))
    k_sink = ResultSink(os.path.join(machine, "kernels"), "kernels")
    kernel_grid(k_sink, work.device, progress=progress)
    k_sink.finish(KERNEL_COLUMNS, "Kernel throughput", "best of 5, 169343 x 128 fp32")
    acc_ds = load_dataset(accuracy_dataset, data_root)
    a_sink = ResultSink(os.path.join(machine, "accuracy"), "accuracy")
    acc = []
    acc_settings = select("dgl_exact fp32,INT8,INT2,INT2 + RP(0.125),INT2 + RP(0.125) + blocks(64) + optimal,INT1")
    for model in model_list:
        cfg = TrainConfig(dataset=accuracy_dataset, model=model, device=device, data_root=data_root)
        acc += accuracy_grid(acc_ds, cfg, acc_settings, runs, a_sink, progress=progress)
    a_sink.finish(ACCURACY_COLUMNS, "Accuracy", f"{acc_ds.summary()}; {runs} seeds per setting, "
                                                  "default `dgl-exact train` hyperparameters")
    try:  # each suite's README.md shows the figures in its folder
        plots.plot_memory(mem, os.path.join(machine, "memory", "memory.png"))
        plots.plot_speed(spd, os.path.join(machine, "speed", "speed.png"))
        if acc and mem:
            plots.plot_tradeoff(acc, mem, os.path.join(machine, "accuracy", "tradeoff.png"))
    except ImportError as e:
        click.echo(f"no figures: {e}", err=True)
    sinks = {"memory": (mem_sink, MEMORY_COLUMNS), "speed": (spd_sink, SPEED_COLUMNS),
             "kernels": (k_sink, KERNEL_COLUMNS), "accuracy": (a_sink, ACCURACY_COLUMNS)}
    for suite, (sink, columns) in sinks.items():
        record_results(sink.path, work.device, columns=columns)
        click.echo(f"report: {write_suite(os.path.dirname(sink.path), suite, SUITES[suite])}")
    if benchmarks_md:
        click.echo(f"rebuilt {assemble(root, benchmarks_md)}")


@bench.command("report")
@click.option("--label", default="cpu", show_default=True, help="Machine label: the suites of OUT/LABEL/.")
@click.option("--out", "root", default="benchmarks", show_default=True, type=click.Path(file_okay=False),
              help="Folder of the results of every machine.")
@click.option("--benchmarks-md", default=None, show_default="none", type=click.Path(dir_okay=False),
              help="Also rebuild this file from every suite's README.md under --out.")
def bench_report(label, root, benchmarks_md):
    """Regenerate each suite's README.md of OUT/LABEL/ from its result files and runs.json (the command, machine
    and code of each run), without measuring; with --benchmarks-md, rebuild that file too."""
    from ..bench.report import assemble, report_machine

    _bench_prechecks(files={"--benchmarks-md": benchmarks_md})
    try:
        written, left = report_machine(root, label)
    except (ValueError, OSError) as e:
        raise UserError(str(e).splitlines()[0]) from None
    for path in written:
        click.echo(f"report: {path}")
    if left:
        click.echo(f"left as written (no runs.json): {', '.join(left)}", err=True)
    if benchmarks_md:
        click.echo(f"rebuilt {assemble(root, benchmarks_md)}")
