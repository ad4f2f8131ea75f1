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
@click.pass_context
def train(ctx, conf, debug_mem, test_speed, json_path, checkpoint, resume, quiet, **params):
    """Train a model; with no options, a GCN with INT2 activations on the bundled Cora graph."""
    params["conf"] = conf
    cfg = _config_from(ctx, params)
    from .data import DatasetNotFoundError
    from .memory import format_bytes
    from .training.trainer import Trainer

    if resume and not checkpoint:
        raise UserError("--resume needs --checkpoint PATH")
    if test_speed is not None and test_speed < 1:
        raise UserError("--test-speed needs a number of epochs >= 1")
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        trainer = Trainer(cfg, progress=False if quiet else None, log=click.echo)
        click.echo(f"{trainer.dataset.summary()}")
        click.echo(f"model {cfg.model}, {cfg.layers} layers x {cfg.hidden}, sampler {cfg.sampler}, "
                   f"activations {cfg.compression.describe()}, device {trainer.device}")
        results = trainer.fit(checkpoint=checkpoint, resume=resume, debug_mem=debug_mem, test_speed=test_speed)
    except KeyboardInterrupt:
        where = f"; the last finished epoch is saved in {checkpoint}: rerun with --resume" if checkpoint else ""
        click.echo(f"interrupted{where}", err=True)
        sys.exit(130)
    except (DatasetNotFoundError, FileNotFoundError, ValueError, FloatingPointError) as e:
        raise UserError(str(e).splitlines()[0] if not isinstance(e, DatasetNotFoundError) else str(e)) from None
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


if __name__ == "__main__":
    main()
