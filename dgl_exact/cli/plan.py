"""``dgl-exact plan`` (predicted memory per setting), and the planner's experiments ``dgl-exact bench plan``
(predicted against measured) and ``dgl-exact bench budget`` (budgeted plans against uniform settings)."""
from __future__ import annotations

import json
import os
import time

import click

from .._files import atomic_write
from ._common import (DEFAULT_DEVICE, DEFAULT_MODEL, MODELS, Choice, UserError, check_outputs, check_names,
                      hold_outputs, hold_results, parse_size)
from ._common import MAX_COUNT as _MAX_COUNT
from ._common import (DATA_ROOT_SHOWN, PYG_MODELS, memory_budget_option, provenance_checked, record_results,
                      renamed)


@click.command("plan")
@renamed("--budget", "--memory-budget")
@click.option("--dataset", default=None, show_default="none: give --nodes ...",
              help="Dataset to plan for (synthetic presets are not generated: their preset counts are used).")
@click.option("--nodes", type=click.IntRange(min=2, max=2**63 - 1), default=None, show_default="none",
              help="Node count (instead of --dataset).")
@click.option("--edges", type=click.IntRange(min=0, max=2**63 - 1), default=None, show_default="none",
              help="Directed edges without self loops (with --nodes).")
@click.option("--features", type=click.IntRange(min=1, max=_MAX_COUNT), default=None, show_default="none",
              help="Input feature width (with --nodes).")
@click.option("--classes", type=click.IntRange(min=1, max=_MAX_COUNT), default=None, show_default="none",
              help="Classes (with --nodes).")
@click.option("--train-nodes", type=click.IntRange(min=1, max=2**63 - 1), default=None,
              show_default="the dataset's, or half the nodes", help="Training nodes.")
@click.option("--model", type=Choice(MODELS + PYG_MODELS), default=DEFAULT_MODEL, show_default=True,
              help="A model of the trainer, on DGL's layers, or on PyG's (pyg-*: its baseline is 'PyG fp32').")
@click.option("--hidden", type=click.IntRange(min=1, max=_MAX_COUNT), default=None,
              show_default="256 for gcn/gcn2, 128 otherwise, as `dgl-exact bench`", help="Hidden size.")
@click.option("--layers", type=click.IntRange(min=1, max=_MAX_COUNT), default=3, show_default=True)
@click.option("--dropout", type=click.FloatRange(0.0, 1.0, max_open=True), default=0.5, show_default=True)
@click.option("--batch-norm/--no-batch-norm", default=True, show_default=True)
@click.option("--heads", type=click.IntRange(min=1, max=_MAX_COUNT), default=3, show_default=True, help="GAT heads.")
@click.option("--device", default=DEFAULT_DEVICE, show_default=True,
              help="The memory to fit: auto (cuda if there is a GPU, else cpu), cpu (available memory), cuda / "
                   "cuda:N (its total memory), or a size such as 80GiB.")
@click.option("--settings", default="", show_default="the dgl_exact settings of `dgl-exact bench`",
              help="Comma-separated setting names.")
@click.option("--data-root", default=lambda: os.environ.get("DGL_EXACT_DATA", "data"), show_default=DATA_ROOT_SHOWN)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), show_default="none",
              help="Write one record per setting (setting, static_bytes, activation_bytes, step_peak_bytes, "
                   "total_bytes, fits, ...).")
@click.option("--sampler", type=click.Choice(["full", "neighbor"]), default="full", show_default=True,
              help="full: one full-graph step; neighbor: one neighbour-sampled mini-batch step (needs --dataset: "
                   "batches of the real graph are sampled).")
@click.option("--fanouts", default="15,10,5", show_default=True,
              help="--sampler neighbor: sampled in-edges per node, one per layer (sets --layers).")
@click.option("--batch-size", default="1024", show_default=True,
              help="--sampler neighbor: seed nodes per batch, or 'auto' (with --memory-budget): the largest batch "
                   "size whose predicted step peak fits.")
@memory_budget_option(help="As for `dgl-exact train`: --sampler full: also plan a per-tensor compression that fits "
                           "this memory (e.g. 2GiB; 'device': the device's memory; sensitivities are estimated on "
                           "the sample graph); --sampler neighbor --batch-size auto: the step peak to fit (e.g. "
                           "512MiB).")
def plan_command(dataset, nodes, edges, features, classes, train_nodes, model, hidden, layers, dropout, batch_norm,
                 heads, device, settings, data_root, json_path, sampler, fanouts, batch_size, memory_budget):
    """Predict, before training, the memory of one training step (full graph, or one neighbour-sampled
    mini-batch) per compression setting and whether it fits the device."""
    from .. import memory
    from ..planning import predict as P

    device = _resolve_device(device)
    if sampler == "neighbor":
        return _plan_minibatch(dataset, nodes, model, hidden, dropout, batch_norm, heads, device, settings, data_root,
                               json_path, fanouts, batch_size, memory_budget)
    if batch_size != "1024":
        raise UserError("--batch-size plans mini-batch steps: add --sampler neighbor")
    budget = memory_budget
    t0 = time.perf_counter()
    hyper = dict(hidden=hidden, layers=layers, dropout=dropout, batch_norm=batch_norm, heads=heads)
    if budget is not None and budget != "device":
        budget = parse_size(budget, "--memory-budget")
    if str(device).strip() != "cpu" and not str(device).strip().startswith("cuda"):
        parse_size(device, "--device")
    check_outputs(files={"--json": json_path})   # before any work, as train's --json
    hold_outputs({"--json": json_path})  # one writer per file, for the command's life
    try:
        if dataset is not None:
            if nodes is not None:
                raise ValueError("give either --dataset or --nodes/--edges/--features/--classes, not both")
            spec = P.spec_for_dataset(dataset, model, data_root, **hyper)
            if train_nodes is not None:
                spec = P.dataclasses.replace(spec, train_nodes=train_nodes)
        else:
            missing = [o for o, v in (("--nodes", nodes), ("--edges", edges), ("--features", features),
                                      ("--classes", classes)) if v is None]
            if missing:
                raise ValueError(f"give --dataset, or all of --nodes --edges --features --classes "
                                 f"(missing: {' '.join(missing)})")
            spec = P.PlanSpec(model=model, nodes=nodes, edges=edges, features=features, classes=classes,
                              train_nodes=train_nodes, name=f"{nodes:,}-node graph", **hyper)
        total, what = P.device_bytes(device)
        names = [s.strip() for s in settings.split(",") if s.strip()] or None
        records = P.plan(spec, device, names, on_record=_setting_lines())
        if budget is not None:
            from ..planning.budget import plan_row

            limit = total if budget == "device" else budget
            if limit is None:
                raise ValueError("--memory-budget device: this device's memory is unknown; give a size")
            records.append(plan_row(spec, limit, device, uniform={r.setting: r for r in records}))
    except (ValueError, FileNotFoundError) as e:
        raise UserError(str(e).splitlines()[0]) from None
    except (MemoryError, RuntimeError) as e:
        _out_of_memory(e)
    click.echo(f"{spec.describe()}; device {what}")
    click.echo(P.format_table(records))
    for r in records:
        if r.note:
            click.echo(f"{r.setting}: {r.note}")
    # one line per distinct static part (DGL's modules keep every sparse format, dgl_exact's the ones it reads)
    groups = {}
    for r in records:
        groups.setdefault(tuple(r.breakdown.items()), []).append(r.setting)
    for items, names in groups.items():
        click.echo(f"static memory ({', '.join(names)}): " + ", ".join(
            f"{k[:-6].replace('_', ' ')} {memory.format_bytes(v)}" for k, v in items))
    click.echo(f"predicted from recorded steps on two sample graphs in {time.perf_counter() - t0:.1f} s")
    if json_path:  # atomically, as train's --json
        with atomic_write(json_path, "w", encoding="utf-8", shared=True) as f:
            json.dump([r.to_dict() for r in records], f, indent=1)


def _setting_lines():
    """Without a terminal on stdout (a log file, a pipe), a function printing one line as each setting's plan is
    made (the table comes at the end, after all of them); on a terminal None."""
    if click.get_text_stream("stdout").isatty():
        return None
    from ..memory import format_bytes

    last = [time.perf_counter()]

    def line(record) -> None:
        d = record.to_dict() if hasattr(record, "to_dict") else {}
        parts = [f"{k.replace('_bytes', '').replace('_', ' ')} {format_bytes(d[k])}"
                 for k in ("step_peak_bytes", "total_bytes") if isinstance(d.get(k), int)]
        if "batch_size" in d:
            parts.insert(0, f"batch size {d['batch_size']}")
        if d.get("fits") is not None:
            parts.append("fits" if d["fits"] else "does NOT fit")
        now = time.perf_counter()
        click.echo(f"planned {d.get('setting', '?')}: {', '.join(parts)} ({now - last[0]:.1f} s)")
        last[0] = now

    return line


def _resolve_device(device: str) -> str:
    """``--device auto``: cuda if torch sees a GPU, else cpu (as `train` resolves it); anything else as given."""
    if str(device).strip().lower() != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _out_of_memory(e: BaseException):
    """A sample step that cannot be allocated (widths too large for this machine) is one line; anything
    else is a bug and goes on as a traceback."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if isinstance(e, MemoryError) or "allocate" in text or "overflow" in text.lower():
        raise UserError(f"the planner's sample step does not fit in this machine's memory ({text[:200]}); plan "
                        "smaller widths (--features, --hidden, --heads)") from None
    raise e


def _plan_minibatch(dataset, nodes, model, hidden, dropout, batch_norm, heads, device, settings, data_root, json_path,
                    fanouts, batch_size, memory_budget):
    """``dgl-exact plan --sampler neighbor``: per-batch predictions, or the largest batch size per setting."""
    from .. import memory
    from ..data import load_dataset
    from ..planning import predict as P
    from ..planning.minibatch import MinibatchPlanner, format_batch_table, largest_batch, refuse_recompute
    from ..planning.settings import select
    from ..training.neighbor import parse_fanouts

    t0 = time.perf_counter()
    check_outputs(files={"--json": json_path})
    hold_outputs({"--json": json_path})
    try:
        if dataset is None or nodes is not None:
            raise ValueError("--sampler neighbor samples batches of the real graph: give --dataset (not --nodes)")
        fan = parse_fanouts(fanouts)
        auto = str(batch_size).strip().lower() == "auto"
        if auto and memory_budget is None:
            raise ValueError("--batch-size auto needs --memory-budget SIZE (the step peak to fit), e.g. 512MiB")
        size = None
        if not auto:
            try:
                size = int(batch_size)
            except ValueError:
                size = 0
            if size < 1:
                raise ValueError(f"--batch-size must be a positive int or 'auto', got {batch_size!r}")
        limit = parse_size(memory_budget, "--memory-budget") if memory_budget is not None else None
        total, what = P.device_bytes(device)
        chosen = select(settings or "DGL fp32," + ",".join(P.DEFAULT_SETTINGS))
        refuse_recompute(chosen)
        P.check_depth(len(fan), len(chosen))
        planner = MinibatchPlanner(load_dataset(dataset, data_root), model, fan, hidden=hidden or 256,
                                   dropout=dropout, batch_norm=batch_norm, heads=heads)
        line = _setting_lines()
        if auto:
            rows = []
            for s in chosen:
                rows.append(largest_batch(planner, s, limit, log=lambda m: click.echo(m, err=True)))
                if line:
                    line(rows[-1])
        else:
            records = []
            for s in chosen:
                records.append(planner.record(s, size, total))
                if line:
                    line(records[-1])
    except (ValueError, FileNotFoundError) as e:
        raise UserError(str(e).splitlines()[0]) from None
    except (MemoryError, RuntimeError) as e:
        _out_of_memory(e)
    click.echo(f"{planner.spec.describe()}; neighbour sampler, fan-outs {','.join(map(str, fan))}; device {what}")
    if auto:
        click.echo(format_batch_table(rows))
        out = [r.to_dict() for r in rows]
    else:
        click.echo(f"one mini-batch step of {size:,} seed nodes (largest of {planner.num_batches} sampled batches)")
        click.echo(P.format_table(records))
        click.echo(records[0].note)
        click.echo("static memory: " + ", ".join(f"{k[:-6].replace('_', ' ')} {memory.format_bytes(v)}"
                                                  for k, v in records[0].breakdown.items()))
        out = [r.to_dict() for r in records]
    click.echo(f"predicted from recorded steps on sampled batches in {time.perf_counter() - t0:.1f} s")
    if json_path:
        with atomic_write(json_path, "w", encoding="utf-8", shared=True) as f:
            json.dump(out, f, indent=1)


@click.command("plan")
@provenance_checked
@renamed("--models", "--model", "models")
@click.option("--dataset", default="synthetic-arxiv", show_default=True)
@click.option("--model", "models", default="gcn,sage,gat,gcn2", show_default=True, help="Comma-separated models.")
@click.option("--settings", default="", show_default="the dgl_exact settings", help="Comma-separated setting names.")
@click.option("--hidden", type=click.IntRange(min=1, max=_MAX_COUNT), default=None,
              show_default="256 for gcn/gcn2, 128 otherwise")
@click.option("--layers", type=click.IntRange(min=1, max=_MAX_COUNT), default=3, show_default=True)
@click.option("--device", default="auto", show_default=True)
@click.option("--data-root", default=lambda: os.environ.get("DGL_EXACT_DATA", "data"), show_default=DATA_ROOT_SHOWN)
@click.option("--out", default="bench-results", show_default=True, type=click.Path(file_okay=False))
@click.option("--no-measure", is_flag=True, help="Predictions only.")
@click.option("--measured", "measured_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              show_default="none",
              help="plan.jsonl of an earlier run: reuse its measurements (same code, same machine), predict again.")
@click.option("--quiet", "-q", is_flag=True)
def bench_plan_command(dataset, models, settings, hidden, layers, device, data_root, out, no_measure, measured_files,
                       quiet):
    """Predicted (`dgl-exact plan`) against measured (`bench memory`) activation memory and step peak."""
    from ..bench.report import machine_line
    from ..bench.results import ResultSink
    from ..bench.runner import Workload
    from ..planning.settings import select
    from ..data import load_dataset
    from ..training.trainer import resolve_device
    from ..planning.predict import DEFAULT_SETTINGS, check_depth
    from ..bench.plan_validation import format_rows, validation_grid

    check_outputs(folders={"--out": out})
    hold_results(out, "plan")
    try:
        dev = resolve_device(device)
        chosen = select(settings or ",".join(DEFAULT_SETTINGS))
        check_depth(layers, len(chosen))
        model_list = check_names(models, MODELS, "--model")
        work = Workload(load_dataset(dataset, data_root), dev, hidden=hidden, layers=layers)
    except (ValueError, FileNotFoundError) as e:
        raise UserError(str(e).splitlines()[0]) from None
    os.makedirs(out, exist_ok=True)
    sink = ResultSink(out, "plan")
    earlier = []
    for path in measured_files:
        with open(path) as f:
            earlier += [json.loads(line) for line in f if line.strip()]
    rows = validation_grid(work, model_list, chosen, sink, measure=not no_measure, progress=not quiet,
                           measured=earlier)
    click.echo(f"plan vs measured on {work.dataset.summary()}; {machine_line(work.device)}")
    click.echo(format_rows(rows))
    record_results(sink.path, work.device)


@click.command("budget")
@provenance_checked
@renamed("--budgets", "--memory-budget", "budgets")
@click.option("--dataset", default="cora", show_default=True)
@click.option("--model", type=Choice(MODELS), default=DEFAULT_MODEL, show_default=True)
@click.option("--conf", default=None, show_default="none", help="YAML of training defaults (as for `train`).")
@click.option("--hidden", type=click.IntRange(min=1, max=_MAX_COUNT), default=None, show_default="as `train`")
@click.option("--layers", type=click.IntRange(min=1, max=_MAX_COUNT), default=None, show_default="as `train`")
@click.option("--batch-norm/--no-batch-norm", default=None, show_default="as `train`")
@click.option("--epochs", type=click.IntRange(min=1, max=_MAX_COUNT), default=200, show_default=True)
@click.option("--runs", type=click.IntRange(min=1, max=_MAX_COUNT), default=10, show_default=True,
              help="Seeds per setting.")
@click.option("--memory-budget", "budgets", default="INT2,INT1", show_default=True,
              help="Comma-separated budgets: the predicted totals of these uniform settings, or sizes (e.g. "
                   "INT2,80MiB).")
@click.option("--uniform", default="dgl_exact fp32,INT8,INT2,INT1", show_default=True,
              help="Uniform settings trained beside the plans (\"\": none).")
@click.option("--data-root", default=lambda: os.environ.get("DGL_EXACT_DATA", "data"), show_default=DATA_ROOT_SHOWN)
@click.option("--out", default="bench-results", show_default=True, type=click.Path(file_okay=False))
@click.option("--plot", is_flag=True, help="budget.png: accuracy vs step peak, uniform and budgeted (matplotlib).")
def bench_budget_command(dataset, model, conf, hidden, layers, batch_norm, epochs, runs, budgets, uniform, data_root,
                         out, plot):
    """Budgeted per-tensor plans against uniform settings at the same memory: accuracy, step peak, gradient
    variance."""
    from ..bench.results import ResultSink
    from ..data import load_dataset
    from ..training.config import TrainConfig, load_conf
    from .. import memory
    from ..bench.plan_accuracy import budget_comparison, format_rows

    check_outputs(folders={"--out": out})
    hold_results(out, "budget")  # and with it budget-runs.jsonl and budget.png
    memory.prepare_cpu_peak()  # before the dataset grows the heap: every row's step peak is measured here
    try:
        values = dict(load_conf(conf)) if conf else {}
        values.update({"dataset": dataset, "model": model, "epochs": epochs, "data_root": data_root, "device": "cpu"})
        values.update({k: v for k, v in (("hidden", hidden), ("layers", layers), ("batch_norm", batch_norm))
                       if v is not None})
        base = TrainConfig(**values)
        ds = load_dataset(dataset, data_root)
    except (ValueError, FileNotFoundError) as e:
        raise UserError(str(e).splitlines()[0]) from None
    os.makedirs(out, exist_ok=True)
    # written as they finish (an interrupted comparison keeps them): each seed's result, each setting's row
    sink, per_run = ResultSink(out, "budget"), ResultSink(out, "budget-runs")
    rows = budget_comparison(ds, base, runs=runs, budgets=[b.strip() for b in budgets.split(",") if b.strip()],
                             uniform=[u.strip() for u in uniform.split(",") if u.strip()],
                             log=lambda m: click.echo(m, err=True), on_run=per_run.add, on_row=sink.add)
    sink.replace_rows(rows)  # the finished rows, with delta_vs_fp32
    click.echo(f"budgeted plans vs uniform settings on {ds.summary()}, {base.model} {base.layers}x{base.hidden}, "
               f"{runs} seeds, {epochs} epochs")
    click.echo(format_rows(rows))
    record_results(sink.path, base.device)
    if plot:
        from ..bench.plan_accuracy import plot_budget

        click.echo(f"figure: {plot_budget(rows, os.path.join(out, 'budget.png'))}")
