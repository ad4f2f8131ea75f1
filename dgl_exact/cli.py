"""The ``dgl-exact`` command: ``train``, ``datasets``, ``info`` and ``bench``.

``dgl-exact train`` with no options trains a 2-layer GCN with INT2 activations on the bundled Cora
graph. Options override a ``--conf`` YAML file, which overrides the defaults.
"""
from __future__ import annotations

import contextlib
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


def _int_choice(ctx, param, value):
    """A ``click.Choice`` of numbers as the int it names (None stays None)."""
    return None if value is None else int(value)


def _train_options(f):
    opts = [
        click.option("--dataset", help="cora (bundled), ogbn-arxiv, ogbn-products, flickr, reddit, reddit2, yelp, "
                                       "synthetic[-small|-arxiv|-products]. See `dgl-exact datasets`."),
        click.option("--model", type=click.Choice(MODELS), help="Architecture."),
        click.option("--sampler", type=click.Choice(SAMPLERS), help="full graph, GraphSAINT or ClusterGCN."),
        click.option("--bits", type=click.Choice(["1", "2", "4", "8"]), callback=_int_choice,
                     help="Bits per saved activation value."),
        click.option("--kept-frac", type=float, help="Random projection: fraction of columns kept, (0, 1]."),
        click.option("--block-rows", type=int, help="Rows sharing one min/scale (1 = per row; i-EXACT uses blocks)."),
        click.option("--levels", type=click.Choice(["uniform", "optimal"]), help="Quantization levels."),
        click.option("--act-fp", is_flag=True, default=None, help="No compression: the exact fp baseline."),
        click.option("--amp", is_flag=True, default=None, help="Mixed precision (fp16 on CUDA, bf16 on CPU)."),
        click.option("--grad-norm", type=float, help="Clip the gradient norm to this value."),
        click.option("--loss", type=click.Choice(["ce", "exact_log"]),
                     help="Training objective: cross-entropy, or EXACT's arxiv log(eps + CE) - log(eps)."),
        click.option("--epochs", type=int), click.option("--lr", type=float),
        click.option("--lr-warmup", type=int, metavar="N",
                     help="Linear learning-rate warm-up over the first N epochs (EXACT's adjust_lr: 50)."),
        click.option("--weight-decay", type=float),
        click.option("--optimizer", type=click.Choice(["adam", "rmsprop", "sgd"])),
        click.option("--hidden", type=int), click.option("--layers", type=int), click.option("--dropout", type=float),
        click.option("--batch-norm/--no-batch-norm", default=None, help="BatchNorm between layers."),
        click.option("--dropout2/--no-dropout2", default=None,
                     help="EXACT's --dropout2: non-inverted dropout (kept values unscaled in training, x (1 - p) "
                          "in evaluation)."),
        click.option("--heads", type=int, help="GAT attention heads."),
        click.option("--edge-drop", type=float,
                     help="Fraction of edges dropped in each training forward (EXACT's arxiv GAT: 0.7)."),
        click.option("--use-attn-dst/--no-use-attn-dst", default=None,
                     help="GAT: separate attention vector for the destination (without: one vector, as EXACT)."),
        click.option("--use-labels/--no-use-labels", default=None,
                     help="Training labels as input features (EXACT's arxiv GAT; full-graph, single-label)."),
        click.option("--mask-rate", type=float,
                     help="--use-labels: fraction of training nodes showing their label each epoch (0.5)."),
        click.option("--shared-weights/--no-shared-weights", default=None,
                     help="GCNII: one weight for the propagated and the initial representation (EXACT: no)."),
        click.option("--residual/--no-residual", default=None,
                     help="GCNII: add each layer's input to its output; GAT: add a linear map of it (EXACT)."),
        click.option("--identity-mapping/--no-identity-mapping", default=None,
                     help="GCNII: beta_l = log(lambda / l + 1); without it beta = 1 (EXACT's arxiv GCNII)."),
        click.option("--saint-mode", type=click.Choice(SAINT_MODES), help="GraphSAINT sampler."),
        click.option("--saint-budget", type=int, help="GraphSAINT nodes/edges/walk roots per subgraph."),
        click.option("--walk-length", type=int), click.option("--num-parts", type=int, help="ClusterGCN partitions."),
        click.option("--parts-per-batch", type=int, help="ClusterGCN partitions per batch."),
        click.option("--saint-steps", type=int,
                     help="GraphSAINT subgraphs per epoch (EXACT: int(num_nodes / roots / walk length))."),
        click.option("--sample-coverage", type=int,
                     help="GraphSAINT pre-sampling for loss normalisation, x num_nodes (0: none, as EXACT)."),
        click.option("--standardize/--no-standardize", default=None,
                     help="(x - mean) / std of the features over all nodes (EXACT's recipe for yelp and reddit2)."),
        click.option("--inductive/--no-inductive", default=None,
                     help="Train on the subgraph induced by the training nodes; evaluate on the full graph (EXACT's "
                          "--inductive; GraphSAINT steps then come from --saint-steps as given)."),
        click.option("--eval-every", type=int, help="Evaluate every N epochs."),
        click.option("--eval-batch-size", type=int, metavar="N",
                     help="Evaluate layer by layer in batches of N destination nodes (full in-neighbourhood: the "
                          "same result as full-graph evaluation, less memory; EXACT's products scripts)."),
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
    if values.get("data_root") is None:
        values["data_root"] = os.environ.get("DGL_EXACT_DATA", "data")
    try:
        return TrainConfig(**values)
    except (TypeError, ValueError) as e:
        raise UserError(str(e)) from None


def _check_outputs(files=None, folders=None) -> None:
    """Refuse, before any work is done, output paths that could not be written when the results are:
    ``files`` and ``folders`` map an option name to the path it was given (None: not given).

    A file path must not be a folder and a folder path not a file; the folders to be created must not
    pass through a file; the nearest existing folder must take a new file (tried: a temporary file is
    created there and removed; ``os.access`` says yes to root on a read-only mount); an existing file
    must be writable; and no two options may name the same file (compared as resolved real paths)."""
    import tempfile

    given = [(option, path, False) for option, path in (files or {}).items() if path is not None]
    given += [(option, path, True) for option, path in (folders or {}).items() if path is not None]
    seen = {}
    for option, path, is_folder in given:
        full = os.path.abspath(path)
        if not is_folder and os.path.isdir(full):
            raise UserError(f"{option} {path}: is a folder; give a file path")
        if is_folder and os.path.lexists(full) and not os.path.isdir(full):
            raise UserError(f"{option} {path}: is a file; give a folder")
        folder = full if is_folder else os.path.dirname(full)
        existing = folder
        while not os.path.lexists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            raise UserError(f"{option} {path}: cannot create the folder {folder}: {existing} is not a folder")
        try:
            fd, probe = tempfile.mkstemp(prefix=".dgl-exact-write-test-", dir=existing)
            os.close(fd)
            os.remove(probe)
        except OSError as e:
            raise UserError(f"{option} {path}: cannot write in {existing} ({e.strerror or e}); "
                            "give a path in a writable folder") from None
        if not is_folder and os.path.isfile(full) and not os.access(full, os.W_OK):
            raise UserError(f"{option} {path}: the file exists and is not writable")
        real = os.path.realpath(full)
        if not is_folder and real in seen:
            raise UserError(f"{seen[real]} and {option} name the same file ({path}): give two different paths")
        seen[real] = option


def parse_size(text, option: str) -> int:
    """Bytes of a size given on the command line (``2GiB``, ``512MiB``, ``3e9``): one line naming ``option``
    for anything that is not a representable memory size. Every size option goes through here."""
    from .planning.predict import parse_bytes

    try:
        return parse_bytes(text, option)
    except ValueError as e:
        raise UserError(str(e)) from None


def _check_dataset(name, data_root) -> None:
    """A dataset name that cannot be loaded (unknown, files missing, bad ``synthetic:key=value``) is a
    one-line error before any work; nothing is loaded here."""
    from .data import dataset_status
    from .data.synthetic import check_fits, parse_synthetic_name

    try:
        if name.strip().lower().startswith("synthetic"):
            check_fits(parse_synthetic_name(name.strip().lower()), name.strip())
        present, message = dataset_status(name, data_root)
    except (TypeError, ValueError) as e:
        raise UserError(str(e)) from None
    if not present:
        raise UserError(message)


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
@click.option("--quiet", "-q", is_flag=True, help="No progress bars, and nothing printed by the dataset "
              "downloaders or ogb's/DGL's processing.")
@click.option("--nproc", type=int, default=None, metavar="N",
              help="Data-parallel training in N processes on this machine (torch.distributed: NCCL, one GPU "
                   "each, or gloo on CPU); saint and cluster samplers. Under torchrun, leave it out.")
@click.option("--dist-timeout", type=float, default=None, metavar="SECONDS", envvar="DGL_EXACT_DIST_TIMEOUT",
              help="Multi-process runs: give up when another process is silent this long (default 60).")
@click.option("--download", is_flag=True,
              help="Download the dataset into --data-root with ogb's or DGL's own downloader if its folder is "
                   "missing (as `dgl-exact datasets --download`). Nothing is downloaded without it.")
@click.option("--memory-budget", default=None, metavar="SIZE",
              help="Choose a compression per kept activation so that the training step fits SIZE (e.g. 2GiB) with "
                   "the least added gradient variance (see `dgl-exact plan`); full-graph training only.")
@click.option("--compile", "compile_mode", is_flag=False, flag_value="default", default=None,
              type=click.Choice(["default", "reduce-overhead", "max-autotune"]),
              help="Run the model under torch.compile (dgl_exact's ops as captured custom ops); optionally the "
                   "mode, e.g. --compile=reduce-overhead (CUDA graphs). Full-graph training only.")
@click.pass_context
def train(ctx, conf, debug_mem, test_speed, json_path, checkpoint, resume, quiet, nproc, dist_timeout, download,
          memory_budget, compile_mode, **params):
    """Train a model; with no options, a GCN with INT2 activations on the bundled Cora graph."""
    params["conf"] = conf
    cfg = _config_from(ctx, params)
    if memory_budget is not None:
        memory_budget = parse_size(memory_budget, "--memory-budget")
    if (debug_mem or memory_budget is not None) and not str(cfg.device).startswith("cuda"):
        from .memory import prepare_cpu_peak

        prepare_cpu_peak()  # before the dataset and the plan grow the heap (see dgl_exact.memory)
    from .data import DatasetNotFoundError
    from .training import distributed
    from .training.trainer import Trainer

    if resume and not checkpoint:
        raise UserError("--resume needs --checkpoint PATH")
    if test_speed is not None and test_speed < 1:
        raise UserError("--test-speed needs a number of epochs >= 1")
    if nproc is not None and nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {nproc}")
    if dist_timeout is not None and not 0 < dist_timeout < float("inf"):
        raise UserError(f"--dist-timeout must be a finite number of seconds > 0, got {dist_timeout}")
    _check_outputs(files={"--json": json_path, "--checkpoint": checkpoint})
    worker = distributed.in_distributed_env()
    if download and worker and not distributed.is_launched_child():
        raise UserError(f"--download under torchrun would download once per process; run `dgl-exact datasets "
                        f"--download {cfg.dataset} --data-root {cfg.data_root}` first, then train without it")
    dataset = _download_dataset(cfg, quiet) if download and not worker else None
    _check_dataset(cfg.dataset, cfg.data_root)
    if memory_budget is not None and ((nproc or 1) > 1 or worker):
        raise UserError("--memory-budget plans one-process full-graph training; leave out --nproc")
    if compile_mode is not None and (cfg.sampler != "full" or (nproc or 1) > 1 or worker or memory_budget is not None):
        raise UserError("--compile is for one-process full-graph training (static shapes): use --sampler full and "
                        "leave out --nproc and --memory-budget")
    if ((nproc or 1) > 1 or worker) and cfg.sampler == "full":
        raise UserError(distributed.FULL_GRAPH_ERROR)
    if worker and (nproc or 1) > 1 and not distributed.is_launched_child():
        raise UserError("--nproc starts the processes itself; under torchrun (WORLD_SIZE set) leave it out")
    # Ctrl-C and kill both stop at once, keeping the last finished epoch's checkpoint. SIGINT is installed
    # explicitly: a shell starting us in the background (``cmd &``) leaves it ignored.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    if not worker and (nproc or 1) > 1:
        try:
            code = distributed.launch(nproc, cfg, _worker_args(ctx), log=lambda m: click.echo(m, err=True))
        except ValueError as e:
            raise UserError(str(e)) from None
        sys.exit(code)
    trainer = None
    try:
        if worker:
            trainer = distributed.DistributedTrainer(cfg, progress=False if quiet else None, log=click.echo,
                                                     timeout=dist_timeout)
        else:
            trainer = Trainer(cfg, dataset=dataset, progress=False if quiet else None, log=click.echo)
            trainer.compile_mode = compile_mode
        if trainer.rank == 0:
            click.echo(f"{trainer.dataset.summary()}")
            click.echo(f"model {cfg.model}, {cfg.layers} layers x {cfg.hidden}, sampler {cfg.sampler}, "
                       f"activations {cfg.compression.describe()}, device {trainer.device}, "
                       f"graph {trainer.structure_note}"
                       + (f", {trainer.ctx.describe()}" if worker else ""))
        budget_plan = None
        if memory_budget is not None:  # a per-tensor plan (dgl_exact.planning.budget); the step peak is measured
            from .planning.budget import budget_report, plan_for_training

            budget_plan, debug_mem = plan_for_training(trainer, memory_budget, log=click.echo), True
        with budget_plan.active() if budget_plan is not None else contextlib.nullcontext():
            results = trainer.fit(checkpoint=checkpoint, resume=resume, debug_mem=debug_mem, test_speed=test_speed)
        if budget_plan is not None:
            from .memory import format_bytes

            measured = [r.peak_bytes for r in results.runs if getattr(r, "peak_bytes", None) is not None]
            click.echo(f"memory budget plan: predicted step peak {format_bytes(budget_plan.record.step_peak_bytes)}, "
                       f"measured {format_bytes(max(measured)) if measured else 'n/a'}")
            results.memory_budget = budget_report(budget_plan, max(measured) if measured else None)
            over = results.memory_budget["over_budget_bytes"]
            if over:
                static = format_bytes(budget_plan.record.static_bytes)
                total = format_bytes(results.memory_budget["measured_total_bytes"])
                click.echo(f"memory budget exceeded: predicted static {static} + measured step peak "
                           f"{format_bytes(max(measured))} = {total}, "
                           f"{format_bytes(over)} over the budget of {format_bytes(budget_plan.budget)}")
    except KeyboardInterrupt:
        saved = checkpoint and ((resume and os.path.exists(checkpoint)) or getattr(trainer, "checkpoint_saved", False))
        where = (f"; the last finished epoch is saved in {checkpoint}: rerun with --resume" if saved else
                 f" before the first epoch finished: no checkpoint was written to {checkpoint}" if checkpoint else "")
        if not distributed.is_launched_child():  # a --nproc worker stops silently: its launcher says it once
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


# `train` options that only the --nproc launcher acts on (--download: it downloads before starting them).
_LAUNCHER_OPTIONS = ("conf", "nproc", "download")


def _worker_args(ctx) -> list:
    """The command line of the workers of ``train --nproc``: every option given to ``train`` except the
    training config (the workers read it from the YAML file :func:`~dgl_exact.training.distributed.launch`
    writes) and the launcher's own (:data:`_LAUNCHER_OPTIONS`). A new ``train`` option reaches the workers
    without being listed here."""
    config_options = set(TrainConfig.fields())
    args = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in config_options or param.name in _LAUNCHER_OPTIONS:
            continue
        value = ctx.params.get(param.name)
        if value is None or value is False:
            continue
        args += [param.opts[0]] if param.is_flag else [param.opts[0], str(value)]
    return args


def _download_dataset(cfg, quiet: bool = False):
    """``train --download``: the dataset of ``cfg``, downloaded first if its folder is missing (one-line error
    otherwise, before any training)."""
    from .data import DatasetNotFoundError, load_dataset

    try:
        return load_dataset(cfg.dataset, cfg.data_root, download=True, seed=cfg.seed, standardize=cfg.standardize,
                            quiet=quiet)
    except DatasetNotFoundError as e:
        raise UserError(str(e)) from None
    except (FileNotFoundError, ValueError, OSError) as e:
        raise UserError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None


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
        peak = f", step peak incl. backward {format_bytes(s['peak_bytes'])}" if "peak_bytes" in s else ""
        click.echo(f"activation memory: {format_bytes(s['activation_bytes'])}{peak}")
    if "epochs_per_second" in s:
        e = s["epochs_per_second"]
        click.echo(f"speed: {e['mean']:.3f} ± {e['std']:.3f} epochs/s")


@cli.command()
@click.option("--data-root", type=click.Path(file_okay=False), default=lambda: os.environ.get("DGL_EXACT_DATA", "data"),
              show_default="data (or $DGL_EXACT_DATA)")
@click.option("--download", multiple=True, metavar="NAME",
              help="Download dataset NAME into --data-root with ogb's or DGL's own downloader if its folder is "
                   "missing, then load it once. Repeatable. Nothing is downloaded without it.")
@click.option("--force-reload", multiple=True, metavar="NAME",
              help="Rebuild the processed file (ogb's dgl_data_processed, DGL's dgl_graph.bin) of NAME from its "
                   "raw files. Repeatable.")
def datasets(data_root, download, force_reload):
    """What datasets are known, which are present under --data-root, and how to get the rest.

    \b
    EXACT's tables, and the layouts accepted under --data-root (EXACT's own data root works as is):
    dataset        layouts accepted                                   EXACT's numbers come from
    reddit2        Reddit2/raw/ (PyG), reddit2/ (GraphSAINT files)    EXACT's 'Reddit': PyG Reddit2, standardised
    flickr         DGL's flickr_<hash>/, flickr/, Flickr/raw/ (PyG)   PyG Flickr, raw features
    yelp           DGL's yelp_<hash>/, yelp/, YELP/raw/ (PyG)         PyG Yelp, standardised
    ogbn-arxiv     ogbn_arxiv/, OGB/ogbn_arxiv/ (ogb)                 ogb, edges made undirected
    ogbn-products  ogbn_products/, OGB/ogbn_products/ (ogb)           ogb
    reddit         DGL's reddit_<hash>/, reddit/, Reddit/raw/ (PyG)   not in EXACT's tables (114 M edges)
    """
    from .data import DATASETS, dataset_status, load_dataset

    for name in dict.fromkeys(download + force_reload):
        try:
            ds = load_dataset(name, data_root, download=name in download, force_reload=name in force_reload)
        except (FileNotFoundError, ValueError) as e:
            raise UserError(str(e)) from None
        click.echo(f"loaded {ds.summary()}")
    for name in DATASETS:
        present, message = dataset_status(name, data_root)
        click.echo(f"{'[x]' if present else '[ ]'} {name:14s} {message}")
    click.echo("EXACT's tables use reddit2 (its 'Reddit'), flickr, yelp, ogbn-arxiv, ogbn-products; EXACT's data "
               "root works as --data-root (see `dgl-exact datasets --help`).")


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
    click.echo(f"torch     {torch.__version__} (CUDA {torch.version.cuda or 'none'}, "
               f"{torch.get_num_threads()} CPU threads)")
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
        click.option("--models", default="sage,gcn", show_default=True,
                     help="Comma-separated: gcn,sage,gat,gcn2, or user-sage,user-sage-donate (bench/user_models.py)."),
        click.option("--settings", default="", help="Comma-separated setting names (default: all standard ones)."),
        click.option("--hidden", type=click.IntRange(min=1), default=None,
                     help="Hidden size (default: 256 for GCN/GCNII, 128 otherwise)."),
        click.option("--layers", type=click.IntRange(min=1), default=3, show_default=True),
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


def _bench_prechecks(out=None, plot=False, files=None, datasets=(), out_option="--out") -> None:
    """Before a benchmark does any work: its output folder ``out`` and ``files`` can be written,
    matplotlib is there if figures are asked for, and each of ``datasets`` (name, data root) can be loaded."""
    _check_outputs(files=files, folders={out_option: out})
    if plot:
        from .bench import plot as plots

        try:
            plots._plt()
        except ImportError as e:
            raise UserError(f"--plot: {e}") from None
    for name, data_root in datasets:
        _check_dataset(name, data_root)


def _bench_setup(dataset, models, settings, hidden, layers, device, data_root, budgets=False, quiet=False):
    from .bench.runner import Workload
    from .bench.settings import PYG, select
    from .data import load_dataset
    from .training.trainer import resolve_device

    try:
        dev = resolve_device(device)
        chosen = select(settings, budgets=budgets)
        model_list = [m.strip() for m in models.split(",") if m.strip()]
        from .bench.user_models import USER_MODELS

        bad = [m for m in model_list if m not in MODELS + USER_MODELS]
        if bad:
            raise ValueError(f"unknown model(s) {', '.join(bad)}; choose from {', '.join(MODELS + USER_MODELS)}")
        if not settings:
            chosen = chosen + [PYG]
        ds = load_dataset(dataset, data_root, quiet=quiet)
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
    """Activation memory and step peak (forward + backward + optimizer step) per setting and model."""
    from .bench import plot as plots
    from .bench.results import ResultSink
    from .bench.runner import MEMORY_COLUMNS, memory_grid, memory_note

    _bench_prechecks(out, plot)
    work, model_list, chosen = _bench_setup(dataset, models, settings, hidden, layers, device, data_root, budgets=True,
                                            quiet=quiet)
    sink = ResultSink(out, "memory")
    rows = memory_grid(work, model_list, chosen, sink, progress=not quiet)
    click.echo(sink.finish(MEMORY_COLUMNS + ["note"], "Activation memory and step peak",
                           _bench_header("memory", work, memory_note(rows))))
    if plot:
        click.echo("figure: " + plots.plot_memory(rows, os.path.join(out, "memory.png")))


@bench.command("speed")
@_bench_options
@click.option("--epochs", type=click.IntRange(min=1), default=5, show_default=True, help="Timed epochs per setting.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Untimed warm-up epochs.")
def bench_speed(dataset, models, settings, hidden, layers, device, data_root, out, plot, quiet, epochs, warmup):
    """Epoch time per setting and its ratio to the DGL fp32 baseline."""
    from .bench import plot as plots
    from .bench.results import ResultSink
    from .bench.runner import SPEED_COLUMNS, speed_grid

    _bench_prechecks(out, plot)
    work, model_list, chosen = _bench_setup(dataset, models, settings, hidden, layers, device, data_root, quiet=quiet)
    sink = ResultSink(out, "speed")
    rows = speed_grid(work, model_list, chosen, sink, epochs=epochs, warmup=warmup, progress=not quiet)
    click.echo(sink.finish(SPEED_COLUMNS + ["note"], "Epoch time", _bench_header("speed", work)))
    if plot:
        click.echo("figure: " + plots.plot_speed(rows, os.path.join(out, "speed.png")))


@bench.command("profile")
@_bench_options
@click.option("--steps", type=int, default=3, show_default=True, help="Profiled training steps per setting.")
@click.option("--warmup", type=int, default=2, show_default=True, help="Unprofiled warm-up steps.")
@click.option("--emulate-gpu", is_flag=True,
              help="Count (not time) what one step asks of a GPU: operator calls, host syncs and bytes along the "
                   "CUDA code path, on the CPU.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="With --emulate-gpu: write one record per setting (setting, ops, syncs, bytes, ...) here.")
def bench_profile(dataset, models, settings, hidden, layers, device, data_root, out, plot, quiet, steps, warmup,
                  emulate_gpu, json_path):
    """Where a training step's time goes: wall vs GPU kernel time, launches, syncs, top ops per setting.

    With --emulate-gpu: operator calls, host synchronisations and bytes read + written by one training step
    on the GPU code path, counted on the CPU (counts, not times; see dgl_exact.bench.opcount)."""
    from .bench.results import ResultSink
    from .bench.runner import PROFILE_COLUMNS, profile_grid

    if steps < 1 or warmup < 0:
        raise UserError("--steps must be >= 1 and --warmup >= 0")
    if plot:
        raise UserError("bench profile writes tables, not figures: leave out --plot")
    if json_path and not emulate_gpu:
        raise UserError("--json goes with --emulate-gpu (the timed profile writes its rows to --out)")
    _bench_prechecks(out, files={"--json": json_path})
    work, model_list, chosen = _bench_setup(dataset, models, settings, hidden, layers, device, data_root, quiet=quiet)
    if emulate_gpu:
        from .bench.opcount import COLUMNS, count_grid, records_for_json

        if work.device.type != "cpu":
            raise UserError("--emulate-gpu counts on the CPU: add --device cpu (on a GPU, leave it out)")
        sink = ResultSink(out, "opcount")
        rows = count_grid(work, model_list, chosen, sink, out, warmup=max(warmup, 1), progress=not quiet)
        click.echo(sink.finish(COLUMNS, "Per-step counts on the GPU code path (counts, not times)",
                               _bench_header("profile --emulate-gpu", work)))
        click.echo(f"per-op tables: {os.path.join(out, 'opcount_*.txt')}")
        if json_path:
            os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
            with open(json_path, "w") as f:
                json.dump(records_for_json(rows), f, indent=1)
            click.echo(f"records: {json_path}")
        return
    sink = ResultSink(out, "profile")
    profile_grid(work, model_list, chosen, sink, out, steps=steps, warmup=warmup, progress=not quiet)
    click.echo(sink.finish(PROFILE_COLUMNS + ["note"], "Step profile", _bench_header("profile", work)))
    click.echo(f"per-op tables: {os.path.join(out, 'profile_*.txt')}")


@bench.command("kernels")
@click.option("--rows", type=click.IntRange(min=1), default=169343, show_default=True)
@click.option("--cols", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--device", default="auto", show_default=True)
@click.option("--out", default="bench-results", show_default=True, type=click.Path(file_okay=False))
@click.option("--quiet", "-q", is_flag=True)
def bench_kernels(rows, cols, repeats, device, out, quiet):
    """compress/decompress throughput (GB/s of fp32 input) per available backend."""
    from .bench.report import machine_line
    from .bench.results import ResultSink
    from .bench.runner import KERNEL_COLUMNS, kernel_grid
    from .training.trainer import resolve_device

    _bench_prechecks(out)
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
@click.option("--runs", type=click.IntRange(min=1), default=10, show_default=True, help="Seeds per setting.")
@click.option("--epochs", type=click.IntRange(min=1), default=200, show_default=True)
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

    _bench_prechecks(out, plot)
    try:
        chosen = select(settings)
        base = load_conf(conf) if conf else {}
        ds = load_dataset(dataset, data_root)
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
@click.option("--runs", type=click.IntRange(min=1), default=10, show_default=True, help="Seeds per accuracy setting.")
@click.option("--speed-epochs", type=click.IntRange(min=1), default=3, show_default=True)
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
                               kernel_grid, memory_grid, memory_note, speed_grid)
    from .bench.settings import select
    from .data import load_dataset

    out = os.path.join(root, label)
    _bench_prechecks(out, files={"--benchmarks-md": benchmarks_md}, datasets=[(accuracy_dataset, data_root)],
                     out_option="--root/--label")
    work, model_list, chosen = _bench_setup(dataset, models, "", None, 3, device, data_root)
    progress = not quiet
    sections = []
    mem_sink = ResultSink(out, "memory")
    mem = memory_grid(work, model_list, chosen, mem_sink, progress=progress)
    sections.append(mem_sink.finish(MEMORY_COLUMNS + ["note"], "Activation memory and step peak",
                                    _bench_header("memory", work, memory_note(mem))))
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


# `dgl-exact plan` and `dgl-exact bench plan` live with the planner
from .planning.cli import bench_budget_command, bench_plan_command, plan_command  # noqa: E402

cli.add_command(plan_command)
bench.add_command(bench_plan_command)
bench.add_command(bench_budget_command)


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
