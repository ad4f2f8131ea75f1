"""The ``dgl-exact`` command: ``train``, ``datasets``, ``info`` and ``bench``.

``dgl-exact train`` with no options trains a 2-layer GCN with INT2 activations on the bundled Cora
graph. Options override a ``--conf`` YAML file, which overrides the defaults.
"""
from __future__ import annotations

import json
import os
import signal
import sys

import click
from click.core import ParameterSource

from .training.config import SAINT_MODES, SAMPLERS, TrainConfig, bundled_configs, load_conf
from .training.models import MODELS


class UserError(click.ClickException):
    """An error caused by the user's input: printed as one line, exit status 2."""

    exit_code = 2


def _train_options(f):
    opts = [
        click.option("--dataset", help="cora (bundled), ogbn-arxiv, ogbn-products, flickr, reddit, yelp, "
                                       "synthetic[-small|-arxiv|-products]. See `dgl-exact datasets`."),
        click.option("--model", type=click.Choice(MODELS), help="Architecture."),
        click.option("--sampler", type=click.Choice(SAMPLERS), help="full graph, GraphSAINT or ClusterGCN."),
        click.option("--bits", type=click.Choice(["1", "2", "4", "8"]), help="Bits per saved activation value."),
        click.option("--kept-frac", type=float, help="Random projection: fraction of columns kept, (0, 1]."),
        click.option("--block-rows", type=int, help="Rows sharing one min/scale (1 = per row; i-EXACT uses blocks)."),
        click.option("--levels", type=click.Choice(["uniform", "optimal"]), help="Quantization levels."),
        click.option("--act-fp", is_flag=True, default=None, help="No compression: the exact fp baseline."),
        click.option("--amp", is_flag=True, default=None, help="Mixed precision (fp16 on CUDA, bf16 on CPU)."),
        click.option("--grad-norm", type=float, help="Clip the gradient norm to this value."),
        click.option("--epochs", type=int), click.option("--lr", type=float),
        click.option("--weight-decay", type=float), click.option("--optimizer", type=click.Choice(["adam", "rmsprop", "sgd"])),
        click.option("--hidden", type=int), click.option("--layers", type=int), click.option("--dropout", type=float),
        click.option("--batch-norm/--no-batch-norm", default=None, help="BatchNorm between layers."),
        click.option("--heads", type=int, help="GAT attention heads."),
        click.option("--saint-mode", type=click.Choice(SAINT_MODES), help="GraphSAINT sampler."),
        click.option("--saint-budget", type=int, help="GraphSAINT nodes/edges/walk roots per subgraph."),
        click.option("--walk-length", type=int), click.option("--num-parts", type=int, help="ClusterGCN partitions."),
        click.option("--parts-per-batch", type=int, help="ClusterGCN partitions per batch."),
        click.option("--eval-every", type=int, help="Evaluate every N epochs."),
        click.option("--runs", type=int, help="Independent runs (seeds seed, seed+1, ...)."),
        click.option("--seed", type=int), click.option("--device", help="auto, cpu, cuda or cuda:N."),
        click.option("--data-root", type=click.Path(file_okay=False), help="Folder holding the datasets."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _config_from(ctx, params) -> TrainConfig:
    values = {}
    if params.get("conf"):
        try:
            values.update(load_conf(params["conf"]))
        except (FileNotFoundError, ValueError) as e:
            raise UserError(str(e)) from None
    for name in TrainConfig.fields():
        if name in params and params[name] is not None:
            source = ctx.get_parameter_source(name)
            if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT) or name not in values:
                values[name] = params[name]
    if "bits" in values:
        values["bits"] = int(values["bits"])
    if values.get("data_root") is None:
        values["data_root"] = os.environ.get("DGL_EXACT_DATA", "data")
    try:
        return TrainConfig(**values)
    except (TypeError, ValueError) as e:
        raise UserError(str(e)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dgl-exact", prog_name="dgl-exact")
def cli():
    """Train GNNs on DGL with compressed activations (EXACT / i-EXACT)."""


@cli.command()
@_train_options
@click.option("--conf", help=f"YAML file of defaults, or a bundled config: {', '.join(bundled_configs())}.")
@click.option("--debug-mem", is_flag=True, help="Measure activation memory (EXACT protocol) and peak memory.")
@click.option("--test-speed", type=int, default=None, metavar="N",
              help="Time N training epochs after 3 warm-up epochs (no evaluation) and report epochs/s.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write machine-readable results here.")
@click.option("--checkpoint", type=click.Path(dir_okay=False), help="Save a checkpoint here after every epoch.")
@click.option("--resume", is_flag=True, help="Continue from --checkpoint where it stopped.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
@click.option("--nproc", type=int, default=None, metavar="N",
              help="Data-parallel training in N processes on this machine (torch.distributed: NCCL, one GPU "
                   "each, or gloo on CPU); saint and cluster samplers. Under torchrun, leave it out.")
@click.option("--dist-timeout", type=float, default=None, metavar="SECONDS", envvar="DGL_EXACT_DIST_TIMEOUT",
              help="Multi-process runs: give up when another process is silent this long (default 60).")
@click.pass_context
def train(ctx, conf, debug_mem, test_speed, json_path, checkpoint, resume, quiet, nproc, dist_timeout, **params):
    """Train a model; with no options, a GCN with INT2 activations on the bundled Cora graph."""
    params["conf"] = conf
    cfg = _config_from(ctx, params)
    from .data import DatasetNotFoundError
    from .training import distributed
    from .training.trainer import Trainer

    if resume and not checkpoint:
        raise UserError("--resume needs --checkpoint PATH")
    if test_speed is not None and test_speed < 1:
        raise UserError("--test-speed needs a number of epochs >= 1")
    if nproc is not None and nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {nproc}")
    if dist_timeout is not None and dist_timeout <= 0:
        raise UserError(f"--dist-timeout must be > 0 seconds, got {dist_timeout}")
    worker = distributed.in_distributed_env()
    if ((nproc or 1) > 1 or worker) and cfg.sampler == "full":
        raise UserError(distributed.FULL_GRAPH_ERROR)
    if worker and (nproc or 1) > 1 and not distributed.is_launched_child():
        raise UserError("--nproc starts the processes itself; under torchrun (WORLD_SIZE set) leave it out")
    # Ctrl-C and kill both stop at once, keeping the last finished epoch's checkpoint. SIGINT is installed
    # explicitly: a shell starting us in the background (``cmd &``) leaves it ignored.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    if not worker and (nproc or 1) > 1:
        args = [a for a, on in (("--debug-mem", debug_mem), ("--resume", resume), ("--quiet", quiet)) if on]
        for option, value in (("--test-speed", test_speed), ("--json", json_path), ("--checkpoint", checkpoint),
                              ("--dist-timeout", dist_timeout)):
            args += [option, str(value)] if value is not None else []
        try:
            code = distributed.launch(nproc, cfg, args, log=lambda m: click.echo(m, err=True))
        except ValueError as e:
            raise UserError(str(e)) from None
        sys.exit(code)
    try:
        if worker:
            trainer = distributed.DistributedTrainer(cfg, progress=False if quiet else None, log=click.echo,
                                                     timeout=dist_timeout)
        else:
            trainer = Trainer(cfg, progress=False if quiet else None, log=click.echo)
        if trainer.rank == 0:
            click.echo(f"{trainer.dataset.summary()}")
            click.echo(f"model {cfg.model}, {cfg.layers} layers x {cfg.hidden}, sampler {cfg.sampler}, "
                       f"activations {cfg.compression.describe()}, device {trainer.device}"
                       + (f", {trainer.ctx.describe()}" if worker else ""))
        results = trainer.fit(checkpoint=checkpoint, resume=resume, debug_mem=debug_mem, test_speed=test_speed)
    except KeyboardInterrupt:
        where = f"; the last finished epoch is saved in {checkpoint}: rerun with --resume" if checkpoint else ""
        click.echo(f"interrupted{where}", err=True)
        _exit(130, worker)
    except distributed.DistributedError as e:
        click.echo(f"error: {e}", err=True)
        _exit(1, worker)
    except (DatasetNotFoundError, FileNotFoundError, ValueError, FloatingPointError) as e:
        raise UserError(str(e).splitlines()[0] if not isinstance(e, DatasetNotFoundError) else str(e)) from None
    if not worker:
        _report(results, json_path)
        return
    code = 1
    try:
        if trainer.rank == 0:
            _report(results, json_path)
        code = 0
    finally:
        distributed.exit_worker(code)


def _exit(code: int, worker: bool) -> None:
    if worker:
        from .training import distributed

        distributed.exit_worker(code)
    sys.exit(code)


def _report(results, json_path) -> None:
    """The summary table, and the JSON results file if asked for."""
    from .memory import format_bytes

    _print_summary(results, format_bytes)
    if json_path:
        folder = os.path.dirname(os.path.abspath(json_path))
        os.makedirs(folder, exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(results.to_dict(), f, indent=2, default=str)
        click.echo(f"results written to {json_path}")


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _print_summary(results, format_bytes):
    metric = results.metric
    rows = [("run", "best epoch", f"train {metric}", f"val {metric}", f"test {metric}", "ms/epoch")]
    for r in results.runs:
        rows.append((str(r.run + 1), str(r.best_epoch), f"{r.train:.4f}", f"{r.val:.4f}", f"{r.test:.4f}",
                     f"{r.epoch_time * 1000:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    click.echo("")
    for i, row in enumerate(rows):
        click.echo("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
        if i == 0:
            click.echo("  ".join("-" * w for w in widths))
    s = results.summary()
    click.echo(f"test {metric}: {s['test']['mean']:.4f} ± {s['test']['std']:.4f} over {len(results.runs)} run(s); "
               f"val {s['val']['mean']:.4f} ± {s['val']['std']:.4f}; {s['epoch_time']['mean'] * 1000:.1f} ms/epoch")
    if "activation_bytes" in s:
        peak = f", peak {format_bytes(s['peak_bytes'])}" if "peak_bytes" in s else ""
        click.echo(f"activation memory: {format_bytes(s['activation_bytes'])}{peak}")
    if "epochs_per_second" in s:
        e = s["epochs_per_second"]
        click.echo(f"speed: {e['mean']:.3f} ± {e['std']:.3f} epochs/s")


@cli.command()
@click.option("--data-root", type=click.Path(file_okay=False), default=lambda: os.environ.get("DGL_EXACT_DATA", "data"),
              show_default="data (or $DGL_EXACT_DATA)")
def datasets(data_root):
    """What datasets are known, which are present under --data-root, and how to get the rest."""
    from .data import DATASETS, dataset_status

    for name in DATASETS:
        present, message = dataset_status(name, data_root)
        click.echo(f"{'[x]' if present else '[ ]'} {name:14s} {message}")


@cli.command()
def info():
    """Versions, devices and the active kernel backend."""
    import platform

    import torch

    from . import __version__, backend
    from ._compat import graphbolt_stubbed, import_dgl

    dgl = import_dgl()
    click.echo(f"dgl_exact {__version__}")
    click.echo(f"python    {platform.python_version()} ({platform.machine()})")
    click.echo(f"torch     {torch.__version__} (CUDA {torch.version.cuda or 'none'}, {torch.get_num_threads()} CPU threads)")
    click.echo(f"dgl       {dgl.__version__}" + (" (graphbolt unavailable for this torch: placeholder installed)"
                                                  if graphbolt_stubbed() else ""))
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            click.echo(f"cuda:{i}    {torch.cuda.get_device_name(i)}")
    else:
        click.echo("cuda      not available")
    click.echo(str(backend()))


# ------------------------------------------------------------------------------------------------------
# benchmarks
# ------------------------------------------------------------------------------------------------------
def _bench_options(f):
    opts = [
        click.option("--dataset", default="synthetic-arxiv", show_default=True,
                     help="Graph to measure on (any dataset name; synthetic-arxiv is ogbn-arxiv-sized)."),
        click.option("--models", default="sage,gcn", show_default=True, help="Comma-separated: gcn,sage,gat,gcn2."),
        click.option("--settings", default="", help="Comma-separated setting names (default: all standard ones)."),
        click.option("--hidden", type=int, default=None, help="Hidden size (default: 256 for GCN/GCNII, 128 otherwise)."),
        click.option("--layers", type=int, default=3, show_default=True),
        click.option("--device", default="auto", show_default=True),
        click.option("--data-root", default=lambda: os.environ.get("DGL_EXACT_DATA", "data"), show_default="data"),
        click.option("--out", default="bench-results", show_default=True, type=click.Path(file_okay=False),
                     help="Folder for JSONL/CSV/Markdown results and figures."),
        click.option("--plot", is_flag=True, help="Also write PNG figures (needs matplotlib)."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bars."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _bench_setup(dataset, models, settings, hidden, layers, device, data_root):
    from .bench.runner import Workload
    from .bench.settings import PYG, select
    from .data import load_dataset
    from .training.trainer import resolve_device

    try:
        dev = resolve_device(device)
        chosen = select(settings)
        model_list = [m.strip() for m in models.split(",") if m.strip()]
        bad = [m for m in model_list if m not in MODELS]
        if bad:
            raise ValueError(f"unknown model(s) {', '.join(bad)}; choose from {', '.join(MODELS)}")
        if not settings:
            chosen = chosen + [PYG]
        ds = load_dataset(dataset, data_root)
    except (ValueError, FileNotFoundError) as e:
        raise UserError(str(e)) from None
    return Workload(ds, dev, hidden=hidden, layers=layers), model_list, chosen


def _bench_header(kind, work, extra=""):
    from .bench.report import machine_line

    return f"{kind} on {work.dataset.summary()}; {machine_line(work.device)}{extra}"


@cli.group()
def bench():
    """Benchmarks: memory, speed, kernels, accuracy (side by side in one process)."""


@bench.command("memory")
@_bench_options
def bench_memory(dataset, models, settings, hidden, layers, device, data_root, out, plot, quiet):
    """Activation memory per setting and model."""
    from .bench import plot as plots
    from .bench.results import ResultSink
    from .bench.runner import MEMORY_COLUMNS, memory_grid

    work, model_list, chosen = _bench_setup(dataset, models, settings, hidden, layers, device, data_root)
    sink = ResultSink(out, "memory")
    rows = memory_grid(work, model_list, chosen, sink, progress=not quiet)
    click.echo(sink.finish(MEMORY_COLUMNS + ["note"], "Activation memory", _bench_header("memory", work)))
    if plot:
        click.echo("figure: " + plots.plot_memory(rows, os.path.join(out, "memory.png")))


@bench.command("speed")
@_bench_options
@click.option("--epochs", type=int, default=5, show_default=True, help="Timed epochs per setting.")
@click.option("--warmup", type=int, default=2, show_default=True, help="Untimed warm-up epochs.")
def bench_speed(dataset, models, settings, hidden, layers, device, data_root, out, plot, quiet, epochs, warmup):
    """Epoch time per setting and its ratio to the DGL fp32 baseline."""
    from .bench import plot as plots
    from .bench.results import ResultSink
    from .bench.runner import SPEED_COLUMNS, speed_grid

    work, model_list, chosen = _bench_setup(dataset, models, settings, hidden, layers, device, data_root)
    sink = ResultSink(out, "speed")
    rows = speed_grid(work, model_list, chosen, sink, epochs=epochs, warmup=warmup, progress=not quiet)
    click.echo(sink.finish(SPEED_COLUMNS + ["note"], "Epoch time", _bench_header("speed", work)))
    if plot:
        click.echo("figure: " + plots.plot_speed(rows, os.path.join(out, "speed.png")))


@bench.command("profile")
@_bench_options
@click.option("--steps", type=int, default=3, show_default=True, help="Profiled training steps per setting.")
@click.option("--warmup", type=int, default=2, show_default=True, help="Unprofiled warm-up steps.")
def bench_profile(dataset, models, settings, hidden, layers, device, data_root, out, plot, quiet, steps, warmup):
    """Where a training step's time goes: wall vs GPU kernel time, launches, syncs, top ops per setting."""
    from .bench.results import ResultSink
    from .bench.runner import PROFILE_COLUMNS, profile_grid

    if steps < 1 or warmup < 0:
        raise UserError("--steps must be >= 1 and --warmup >= 0")
    if plot:
        raise UserError("bench profile writes tables, not figures: leave out --plot")
    work, model_list, chosen = _bench_setup(dataset, models, settings, hidden, layers, device, data_root)
    sink = ResultSink(out, "profile")
    profile_grid(work, model_list, chosen, sink, out, steps=steps, warmup=warmup, progress=not quiet)
    click.echo(sink.finish(PROFILE_COLUMNS + ["note"], "Step profile", _bench_header("profile", work)))
    click.echo(f"per-op tables: {os.path.join(out, 'profile_*.txt')}")


@bench.command("kernels")
@click.option("--rows", type=int, default=169343, show_default=True)
@click.option("--cols", type=int, default=128, show_default=True)
@click.option("--repeats", type=int, default=5, show_default=True)
@click.option("--device", default="auto", show_default=True)
@click.option("--out", default="bench-results", show_default=True, type=click.Path(file_okay=False))
@click.option("--quiet", "-q", is_flag=True)
def bench_kernels(rows, cols, repeats, device, out, quiet):
    """compress/decompress throughput (GB/s of fp32 input) per available backend."""
    from .bench.report import machine_line
    from .bench.results import ResultSink
    from .bench.runner import KERNEL_COLUMNS, kernel_grid
    from .training.trainer import resolve_device

    try:
        dev = resolve_device(device)
    except ValueError as e:
        raise UserError(str(e)) from None
    sink = ResultSink(out, "kernels")
    kernel_grid(sink, dev, rows=rows, cols=cols, repeats=repeats, progress=not quiet)
    click.echo(sink.finish(KERNEL_COLUMNS, "Kernel throughput", f"best of {repeats}; {machine_line(dev)}"))


@bench.command("accuracy")
@click.option("--dataset", default="cora", show_default=True)
@click.option("--models", default="gcn,sage", show_default=True)
@click.option("--settings", default="dgl_exact fp32,INT8,INT2,INT2 + RP(0.125),INT2 + RP(0.125) + blocks(64) + optimal",
              show_default=True)
@click.option("--runs", type=int, default=10, show_default=True, help="Seeds per setting.")
@click.option("--epochs", type=int, default=200, show_default=True)
@click.option("--conf", default=None, help="YAML of training defaults (as for `train`).")
@click.option("--device", default="auto", show_default=True)
@click.option("--data-root", default=lambda: os.environ.get("DGL_EXACT_DATA", "data"), show_default="data")
@click.option("--out", default="bench-results", show_default=True, type=click.Path(file_okay=False))
@click.option("--plot", is_flag=True, help="Accuracy vs memory figure (uses memory.jsonl in --out if present).")
@click.option("--quiet", "-q", is_flag=True)
def bench_accuracy(dataset, models, settings, runs, epochs, conf, device, data_root, out, plot, quiet):
    """Test metric over several seeds per setting, and its difference to fp32."""
    from .bench import plot as plots
    from .bench.report import machine_line
    from .bench.results import ResultSink, read_rows
    from .bench.runner import ACCURACY_COLUMNS, accuracy_grid
    from .bench.settings import select
    from .data import load_dataset

    try:
        chosen = select(settings)
        ds = load_dataset(dataset, data_root)
        base = load_conf(conf) if conf else {}
    except (ValueError, FileNotFoundError) as e:
        raise UserError(str(e)) from None
    sink = ResultSink(out, "accuracy")
    rows = []
    for model in [m.strip() for m in models.split(",") if m.strip()]:
        try:
            cfg = TrainConfig(**{**base, "dataset": dataset, "model": model, "epochs": epochs, "device": device,
                                 "data_root": data_root})
        except ValueError as e:
            raise UserError(str(e)) from None
        rows += accuracy_grid(ds, cfg, chosen, runs, sink, progress=not quiet)
    click.echo(sink.finish(ACCURACY_COLUMNS, "Accuracy", f"{ds.summary()}; {runs} seeds per setting; "
                                                           f"{machine_line(cfg.device)}"))
    mem_path = os.path.join(out, "memory.jsonl")
    if plot and os.path.exists(mem_path):
        click.echo("figure: " + plots.plot_tradeoff(rows, read_rows(mem_path), os.path.join(out, "tradeoff.png")))


@bench.command("all")
@click.option("--label", default="cpu", show_default=True, help="Machine label: results go to benchmarks/LABEL/.")
@click.option("--dataset", default="synthetic-arxiv", show_default=True, help="Graph for memory and speed.")
@click.option("--models", default="sage,gcn", show_default=True)
@click.option("--accuracy-dataset", default="cora", show_default=True)
@click.option("--runs", type=int, default=10, show_default=True, help="Seeds per accuracy setting.")
@click.option("--speed-epochs", type=int, default=3, show_default=True)
@click.option("--device", default="auto", show_default=True)
@click.option("--data-root", default=lambda: os.environ.get("DGL_EXACT_DATA", "data"), show_default="data")
@click.option("--root", default="benchmarks", show_default=True, type=click.Path(file_okay=False))
@click.option("--benchmarks-md", default="BENCHMARKS.md", show_default=True, type=click.Path(dir_okay=False))
@click.option("--quiet", "-q", is_flag=True)
def bench_all(label, dataset, models, accuracy_dataset, runs, speed_epochs, device, data_root, root, benchmarks_md,
              quiet):
    """Run every benchmark, write benchmarks/LABEL/REPORT.md with figures, and rebuild BENCHMARKS.md."""
    from .bench import plot as plots
    from .bench.report import assemble, write_report
    from .bench.results import ResultSink
    from .bench.runner import (ACCURACY_COLUMNS, KERNEL_COLUMNS, MEMORY_COLUMNS, SPEED_COLUMNS, accuracy_grid,
                               kernel_grid, memory_grid, speed_grid)
    from .bench.settings import select
    from .data import load_dataset

    out = os.path.join(root, label)
    work, model_list, chosen = _bench_setup(dataset, models, "", None, 3, device, data_root)
    progress = not quiet
    sections = []
    mem_sink = ResultSink(out, "memory")
    mem = memory_grid(work, model_list, chosen, mem_sink, progress=progress)
    sections.append(mem_sink.finish(MEMORY_COLUMNS + ["note"], "Activation memory", _bench_header("memory", work)))
    spd_sink = ResultSink(out, "speed")
    spd = speed_grid(work, model_list, chosen, spd_sink, epochs=speed_epochs, warmup=1, progress=progress)
    sections.append(spd_sink.finish(SPEED_COLUMNS + ["note"], "Epoch time",
                                    _bench_header("speed", work, f"; {speed_epochs} timed epochs after 1 warm-up")))
    k_sink = ResultSink(out, "kernels")
    kernel_grid(k_sink, work.device, progress=progress)
    sections.append(k_sink.finish(KERNEL_COLUMNS, "Kernel throughput", "best of 5, 169343 x 128 fp32"))
    acc_ds = load_dataset(accuracy_dataset, data_root)
    a_sink = ResultSink(out, "accuracy")
    acc = []
    acc_settings = select("dgl_exact fp32,INT8,INT2,INT2 + RP(0.125),INT2 + RP(0.125) + blocks(64) + optimal,INT1")
    for model in model_list:
        cfg = TrainConfig(dataset=accuracy_dataset, model=model, device=device, data_root=data_root)
        acc += accuracy_grid(acc_ds, cfg, acc_settings, runs, a_sink, progress=progress)
    sections.append(a_sink.finish(ACCURACY_COLUMNS, "Accuracy", f"{acc_ds.summary()}; {runs} seeds per setting, "
                                                                  "default `dgl-exact train` hyperparameters"))
    figures = []
    try:
        figures = plots.save_all(out, memory_rows=mem, speed_rows=spd, accuracy_rows=acc)
    except ImportError as e:
        click.echo(f"no figures: {e}", err=True)
    command = "dgl-exact bench all " + " ".join(a for a in sys.argv[3:] if a not in ("-q", "--quiet"))
    report = write_report(out, label, command.strip(), sections, figures, device=str(work.device))
    click.echo(f"report: {report}")
    click.echo(f"rebuilt {assemble(root, benchmarks_md)}")


def main(argv=None):
    """Entry point: click errors become one line on stderr and exit status 2 (no traceback)."""
    try:
        cli.main(args=argv, prog_name="dgl-exact", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        click.echo(f"error: {e.format_message()}", err=True)
        sys.exit(e.exit_code if e.exit_code else 2)
    except SystemExit:
        raise


def example_main(dataset: str, confs: dict, default_model: str = "sage", argv=None) -> None:
    """Entry point of the per-dataset example scripts in ``examples/``: ``--model``/``--sampler`` choose a
    bundled config (``confs[(model, sampler)]``) and every other option goes to ``dgl-exact train``."""

    @click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                     "help_option_names": ["-h", "--help"]},
                   help=f"Train on {dataset} with the EXACT benchmark hyperparameters; other options are "
                        "those of `dgl-exact train` (see `dgl-exact train --help`).")
    @click.option("--model", type=click.Choice(sorted({m for m, _ in confs})), default=default_model,
                  show_default=True)
    @click.option("--sampler", type=click.Choice(sorted({s for _, s in confs})), default="full", show_default=True)
    @click.pass_context
    def command(ctx, model, sampler):
        conf = confs.get((model, sampler))
        if conf is None:
            raise UserError(f"no bundled {dataset} config for model {model} with sampler {sampler}; available: "
                            + ", ".join(f"{m}/{s}" for m, s in sorted(confs)))
        main(["train", "--conf", conf, "--dataset", dataset, *ctx.args])

    try:
        command.main(args=argv, standalone_mode=False)
    except click.ClickException as e:
        click.echo(f"error: {e.format_message()}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
