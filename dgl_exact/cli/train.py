"""``dgl-exact train``: the training options (``--conf`` YAML, then the command line), the ``--nproc``
launcher's worker command line, and the printed and JSON results.

With no options it trains a 2-layer GCN with INT2 activations on the bundled Cora graph. Options override
a ``--conf`` YAML file, which overrides the defaults.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys

import click
from click.core import ParameterSource

from .. import _environment
from .._files import atomic_write
from .._progress import progress_lines
from .._environment import MAX_SECONDS
from ._common import (MAX_COUNT, SAINT_MODES, SAMPLERS, TRAIN_MODELS, Choice, UserError, check_dataset,
                      check_outputs, hold_outputs, int_choice, bundled_configs, memory_budget_option, parse_size)

# What --help shows as each training option's default: TrainConfig's defaults (as text where None means
# "decided from other options"), written here so that `dgl-exact train --help` needs no torch;
# tests/cli/test_dialect.py checks them against dgl_exact.training.config.TrainConfig.
TRAIN_DEFAULTS = {
    "dataset": "cora", "model": "gcn", "sampler": "full", "framework": "dgl", "bits": 2, "kept_frac": 1.0,
    "block_rows": 1,
    "levels": "uniform", "act_fp": False, "amp": False, "grad_norm": "none", "loss": "ce", "epochs": 200,
    "lr": 0.01, "lr_warmup": 0, "weight_decay": 0.0005, "optimizer": "adam", "hidden": 64, "layers": 2,
    "dropout": 0.5, "batch_norm": False, "dropout2": False, "heads": 3, "edge_drop": 0.0, "use_attn_dst": True,
    "use_labels": False, "mask_rate": 0.5, "shared_weights": True, "residual": False, "identity_mapping": True,
    "recompute": "off", "saint_mode": "walk", "saint_budget": 3000, "walk_length": 2, "num_parts": 1000,
    "parts_per_batch": 20, "fanouts": "10 per layer", "batch_size": "1024", "saint_steps": "num_nodes / subgraph size",
    "sample_coverage": 50, "standardize": False, "inductive": False, "eval_every": 1, "eval_batch_size": "full graph",
    "runs": 1, "seed": 0, "device": "auto", "data_root": "data (or $DGL_EXACT_DATA)",
}


def _train_options(f):
    opts = _model_options() + _sampling_options()
    for opt in reversed(opts):
        f = opt(f)
    for param in f.__click_params__[-len(opts):]:  # the options just added: --help shows TrainConfig's default
        param.show_default = _shown(TRAIN_DEFAULTS[param.name])
    return f


def _switch(name: str, help: str):
    """``--name/--no-name``: on, off, or (not given) TrainConfig's default."""
    return click.option(f"--{name}/--no-{name}", default=None, help=help)


def _model_options() -> list:
    """train's options on the data, the model, its compression and its optimisation."""
    return [
        click.option("--dataset", help="cora (bundled), ogbn-arxiv, ogbn-products, flickr, reddit, reddit2, yelp, "
                                       "synthetic[-small|-arxiv|-products]. See `dgl-exact datasets`."),
        click.option("--model", type=Choice(TRAIN_MODELS),
                     help="Architecture (gatv2: PyG's GATv2Conv, with --framework pyg only)."),
        click.option("--sampler", type=Choice(SAMPLERS),
                     help="full graph, GraphSAINT, ClusterGCN, or neighbour-sampled blocks (DGL's NeighborSampler)."),
        click.option("--framework", type=Choice(("dgl", "pyg")),
                     help="Layers the model is built of: DGL's, or PyTorch Geometric's (pip install "
                          "'dgl-exact[pyg]'; every sampler), converted by compress_model."),
        click.option("--bits", type=Choice(["1", "2", "4", "8"]), callback=int_choice,
                     help="Bits per saved activation value."),
        click.option("--kept-frac", type=float, help="Random projection: fraction of columns kept, (0, 1]."),
        click.option("--block-rows", type=int, help="Rows sharing one min/scale (1 = per row; i-EXACT uses blocks)."),
        click.option("--levels", type=Choice(["uniform", "optimal"]), help="Quantization levels."),
        click.option("--act-fp", is_flag=True, default=None, help="No compression: the exact fp baseline."),
        click.option("--amp", is_flag=True, default=None, help="Mixed precision (fp16 on CUDA, bf16 on CPU)."),
        click.option("--grad-norm", type=float, help="Clip the gradient norm to this value."),
        click.option("--loss", type=Choice(["ce", "exact_log"]),
                     help="Training objective: cross-entropy, or EXACT's arxiv log(eps + CE) - log(eps)."),
        click.option("--epochs", type=int), click.option("--lr", type=float),
        click.option("--lr-warmup", type=int, metavar="N",
                     help="Linear learning-rate warm-up over the first N epochs (EXACT's adjust_lr: 50)."),
        click.option("--weight-decay", type=float),
        click.option("--optimizer", type=Choice(["adam", "rmsprop", "sgd"])),
        click.option("--hidden", type=int), click.option("--layers", type=int), click.option("--dropout", type=float),
        _switch("batch-norm", help="BatchNorm between layers."),
        _switch("dropout2", help="EXACT's --dropout2: non-inverted dropout (kept values unscaled in training, "
                                 "x (1 - p) in evaluation)."),
        click.option("--heads", type=int, help="GAT attention heads."),
        click.option("--edge-drop", type=float,
                     help="Fraction of edges dropped in each training forward (EXACT's arxiv GAT: 0.7)."),
        _switch("use-attn-dst",
                help="GAT: separate attention vector for the destination (without: one vector, as EXACT)."),
        _switch("use-labels", help="Training labels as input features (EXACT's arxiv GAT; full-graph, single-label)."),
        click.option("--mask-rate", type=float,
                     help="--use-labels: fraction of training nodes showing their label each epoch (0.5)."),
        _switch("shared-weights",
                help="GCNII: one weight for the propagated and the initial representation (EXACT: no)."),
        _switch("residual", help="GCNII: add each layer's input to its output; GAT: add a linear map of it (EXACT)."),
        _switch("identity-mapping",
                help="GCNII: beta_l = log(lambda / l + 1); without it beta = 1 (EXACT's arxiv GCNII)."),
        click.option("--recompute", metavar="L|auto",
                     help="GCNII: run the hidden layers in segments of L layers that keep only their compressed "
                          "input and re-run in the backward (auto: round(sqrt(layers)); 0: off). The forward "
                          "is exact; the gradients read activations recomputed from the compressed boundary."),
    ]


def _sampling_options() -> list:
    """train's options on batches, evaluation, runs and where it runs."""
    return [
        click.option("--saint-mode", type=Choice(SAINT_MODES), help="GraphSAINT sampler."),
        click.option("--saint-budget", type=int, help="GraphSAINT nodes/edges/walk roots per subgraph."),
        click.option("--walk-length", type=int), click.option("--num-parts", type=int, help="ClusterGCN partitions."),
        click.option("--parts-per-batch", type=int, help="ClusterGCN partitions per batch."),
        click.option("--fanouts", metavar="F1,F2,...",
                     help="--sampler neighbor: sampled in-edges per node, one per layer, first layer first, e.g. "
                          "15,10,5 (-1: all; default 10 per layer)."),
        click.option("--batch-size", type=str,
                     help="--sampler neighbor: seed (training) nodes per batch (1024); 'auto' (with --memory-budget "
                          "SIZE): the largest batch whose predicted step peak fits SIZE, as `dgl-exact plan "
                          "--sampler neighbor --batch-size auto` picks it."),
        click.option("--saint-steps", type=int,
                     help="GraphSAINT subgraphs per epoch (EXACT: int(num_nodes / roots / walk length))."),
        click.option("--sample-coverage", type=int,
                     help="GraphSAINT pre-sampling for loss normalisation, x num_nodes (0: none, as EXACT)."),
        _switch("standardize",
                help="(x - mean) / std of the features over all nodes (EXACT's recipe for yelp and reddit2)."),
        _switch("inductive", help="Train on the subgraph induced by the training nodes; evaluate on the full graph "
                                  "(EXACT's --inductive; GraphSAINT steps then come from --saint-steps as given)."),
        click.option("--eval-every", type=int, help="Evaluate every N epochs."),
        click.option("--eval-batch-size", type=int, metavar="N",
                     help="Evaluate layer by layer in batches of N destination nodes (full in-neighbourhood: the "
                          "same result as full-graph evaluation, less memory; EXACT's products scripts)."),
        click.option("--runs", type=int, help="Independent runs (seeds seed, seed+1, ...)."),
        click.option("--seed", type=int), click.option("--device", help="auto, cpu, cuda or cuda:N."),
        click.option("--data-root", type=click.Path(file_okay=False), help="Folder holding the datasets."),
    ]


def _shown(value) -> str:
    """A default as --help writes it (flags: on/off)."""
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _config_from(ctx, params):
    from ..training.config import TrainConfig, load_conf

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


def _pick_batch(trainer, budget: int):
    """``--batch-size auto``: the run's config with the largest batch whose predicted step peak fits ``budget``
    (:func:`dgl_exact.planning.minibatch.pick_training_batch`), saying what was picked and why."""
    from ..memory import format_bytes
    from ..planning.minibatch import pick_training_batch

    cfg = trainer.cfg
    click.echo(f"--batch-size auto: searching the largest batch whose predicted step peak fits "
               f"{format_bytes(budget)} (recorded steps on sampled batches)")
    try:
        pick = pick_training_batch(trainer.dataset, cfg, budget, log=click.echo)
    except ValueError as e:
        raise UserError(str(e).splitlines()[0]) from None
    over = [b for b, peak in pick.tried.items() if peak > budget]
    why = (f"batch size {min(over):,} predicts {format_bytes(pick.tried[min(over)])}" if over
           else f"it is every training node ({pick.batch_size:,})")
    click.echo(f"batch size auto: {pick.batch_size:,} seed nodes: predicted step peak "
               f"{format_bytes(pick.record.step_peak_bytes)} within --memory-budget {format_bytes(budget)} "
               f"({pick.setting}, fan-outs {','.join(map(str, cfg.neighbor_fanouts()))}); {why}")
    return dataclasses.replace(cfg, batch_size=pick.batch_size)


@click.command()
@_train_options
@click.option("--conf", show_default="none",
              help=f"YAML file of defaults, or a bundled config: {', '.join(bundled_configs())}.")
@click.option("--debug-mem", is_flag=True, help="Measure activation memory (EXACT protocol) and peak memory.")
@click.option("--test-speed", type=int, default=None, metavar="N", show_default="off",
              help="Time N training epochs after 3 warm-up epochs (no evaluation) and report epochs/s.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), show_default="none",
              help="Write machine-readable results here.")
@click.option("--checkpoint", type=click.Path(dir_okay=False), show_default="none",
              help="Save a checkpoint here after every epoch.")
@click.option("--resume", is_flag=True, help="Continue from --checkpoint where it stopped (refused, in one line, where "
              "this run's settings differ from those the checkpoint records; see --resume-mismatch-ok).")
@click.option("--resume-mismatch-ok", is_flag=True,
              help="With --resume: continue even where this run's settings differ from the checkpoint's (model, "
                   "data, compression and the --memory-budget plan, sampler, number of processes, seeds, ...), "
                   "with one warning line per difference; the checkpoint then records this run's settings.")
@click.option("--checkpoint-batches", type=int, default=None, metavar="N", show_default="off",
              help="Also save --checkpoint every N batches inside an epoch (mini-batch samplers, one process): "
                   "--resume continues at the next batch, with the batches an uninterrupted run would see.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars, and nothing printed by the dataset "
              "downloaders or ogb's/DGL's processing.")
@click.option("--nproc", type=int, default=None, metavar="N", show_default="1",
              help="Data-parallel training in N processes on this machine (torch.distributed: NCCL, one GPU "
                   "each, or gloo on CPU); saint, cluster and neighbor samplers. Under torchrun, leave it out.")
@click.option("--dist-timeout", type=float, default=None, metavar="SECONDS", envvar="DGL_EXACT_DIST_TIMEOUT",
              show_default="60", help="Multi-process runs: give up when another process is silent this long.")
@click.option("--download", is_flag=True,
              help="Download the dataset into --data-root with ogb's or DGL's own downloader if its folder is "
                   "missing (as `dgl-exact datasets --download`). Nothing is downloaded without it.")
@memory_budget_option(help="Choose a compression per kept activation so that the training step fits SIZE (e.g. 2GiB) "
                           "with the least added gradient variance (see `dgl-exact plan`), full-graph training; with "
                           "--sampler neighbor --batch-size auto: the step peak the picked batch must fit.")
@click.option("--compile", "compile_mode", is_flag=False, flag_value="default", default=None, show_default="off",
              type=Choice(["default", "reduce-overhead", "max-autotune"]),
              help="Run the model under torch.compile (dgl_exact's ops as captured custom ops); optionally the "
                   "mode, e.g. --compile=reduce-overhead (CUDA graphs). Full-graph training only.")
@click.pass_context
def train(ctx, conf, debug_mem, test_speed, json_path, checkpoint, resume, resume_mismatch_ok, checkpoint_batches,
          quiet, nproc, dist_timeout, download, memory_budget, compile_mode, **params):
    """Train a model; with no options, a GCN with INT2 activations on the bundled Cora graph."""
    params["conf"] = conf
    auto_batch = _parse_batch_size(params)
    cfg = _config_from(ctx, params)
    if memory_budget is not None:
        memory_budget = parse_size(memory_budget, "--memory-budget")
    if auto_batch and (cfg.sampler != "neighbor" or memory_budget is None):
        raise UserError("--batch-size auto picks the largest neighbour-sampled batch whose predicted step peak fits "
                        "--memory-budget SIZE: give --sampler neighbor and --memory-budget (e.g. 512MiB)")
    if (debug_mem or memory_budget is not None) and not auto_batch and not str(cfg.device).startswith("cuda"):
        from ..memory import prepare_cpu_peak

        prepare_cpu_peak()  # before the dataset and the plan grow the heap (see dgl_exact.memory)
    from ..data import DatasetNotFoundError
    from ..training import distributed

    _check_run_options(cfg, checkpoint, resume, resume_mismatch_ok, checkpoint_batches, test_speed, nproc,
                       dist_timeout)
    worker = distributed.in_distributed_env()
    dataset = _claim_outputs_and_data(cfg, json_path, checkpoint, download, quiet, worker)
    _check_process_options(cfg, worker, nproc, memory_budget, auto_batch, compile_mode, checkpoint_batches)
    # Ctrl-C and kill both stop at once, keeping the last finished epoch's checkpoint. SIGINT is installed
    # explicitly: a shell starting us in the background (``cmd &``) leaves it ignored.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    if not worker and (nproc or 1) > 1:
        if resume and not resume_mismatch_ok:  # one line here rather than one per worker
            _check_resume_before_launch(checkpoint, cfg, nproc)
        try:
            code = distributed.launch(nproc, cfg, _worker_args(ctx), log=lambda m: click.echo(m, err=True))
        except ValueError as e:
            raise UserError(str(e)) from None
        sys.exit(code)
    trainer = None
    try:
        trainer = _start_trainer(cfg, worker, dataset, quiet, dist_timeout, compile_mode, checkpoint_batches,
                                 memory_budget)
        results = _fit(trainer, checkpoint, resume, resume_mismatch_ok, debug_mem, test_speed, quiet, memory_budget,
                       auto_batch)
    except KeyboardInterrupt:
        saved = checkpoint and ((resume and os.path.exists(checkpoint)) or getattr(trainer, "checkpoint_saved", False))
        last = "epoch or batch" if checkpoint_batches else "epoch"
        where = (f"; the last finished {last} is saved in {checkpoint}: rerun with --resume" if saved else
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
    except UserError as e:  # a --json that cannot be written: one line, as in one process
        click.echo(f"error: {e.format_message()}", err=True)
        code = e.exit_code
    finally:
        ctx.close()  # releases the outputs' locks: the worker exits without unwinding
        distributed.exit_worker(code)


def _parse_batch_size(params) -> bool:
    """``--batch-size`` as an int in ``params`` (None for ``auto``); whether it was ``auto``."""
    if params.get("batch_size") is None:
        return False
    text = str(params["batch_size"]).strip()
    if text.lower() == "auto":
        params["batch_size"] = None
        return True
    try:
        params["batch_size"] = int(text)
    except ValueError:
        raise UserError(f"--batch-size must be a positive int (or 'auto'), got {text!r}") from None
    return False


def _check_run_options(cfg, checkpoint, resume, resume_mismatch_ok, checkpoint_batches, test_speed, nproc,
                       dist_timeout) -> None:
    """The options' values and the options they need, refused in one line before anything is touched."""
    if resume and not checkpoint:
        raise UserError("--resume needs --checkpoint PATH")
    if resume_mismatch_ok and not resume:
        raise UserError("--resume-mismatch-ok goes with --resume (it lets a resumed run differ from its checkpoint)")
    if checkpoint_batches is not None and not 1 <= checkpoint_batches <= MAX_COUNT:
        raise UserError(f"--checkpoint-batches must be in [1, {MAX_COUNT}], got {checkpoint_batches}")
    if checkpoint_batches is not None and (not checkpoint or cfg.sampler == "full"):
        raise UserError("--checkpoint-batches needs N >= 1, --checkpoint PATH and a mini-batch sampler "
                        "(--sampler saint, cluster or neighbor)")
    if test_speed is not None and not 1 <= test_speed <= MAX_COUNT:
        raise UserError(f"--test-speed needs a number of epochs in [1, {MAX_COUNT}], got {test_speed}")
    if nproc is not None and nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {nproc}")
    if dist_timeout is not None and not 0 < dist_timeout <= MAX_SECONDS:
        raise UserError(f"--dist-timeout must be a finite number of seconds > 0, at most {MAX_SECONDS:g} "
                        f"(Python's longest timedelta), got {dist_timeout}")


def _claim_outputs_and_data(cfg, json_path, checkpoint, download, quiet: bool, worker: bool):
    """Check and lock the output files, download the dataset where asked (returned; else None) and check that
    it can be loaded, all before any training."""
    from ..training import distributed

    check_outputs(files={"--json": json_path, "--checkpoint": checkpoint})
    if not worker or (not distributed.is_launched_child() and _environment.read("RANK") == 0):
        # one writer per output, for the whole run: the --nproc launcher (not its workers) or torchrun's rank 0
        hold_outputs({"--checkpoint": checkpoint, "--json": json_path})
    if download and worker and not distributed.is_launched_child():
        raise UserError(f"--download under torchrun would download once per process; run `dgl-exact datasets "
                        f"--download {cfg.dataset} --data-root {cfg.data_root}` first, then train without it")
    dataset = _download_dataset(cfg, quiet) if download and not worker else None
    check_dataset(cfg.dataset, cfg.data_root)
    return dataset


def _check_process_options(cfg, worker: bool, nproc, memory_budget, auto_batch: bool, compile_mode,
                           checkpoint_batches) -> None:
    """The options that one-process training alone takes, and the ones torchrun and ``--nproc`` refuse."""
    from ..training import distributed

    several = (nproc or 1) > 1 or worker
    if memory_budget is not None and several:
        raise UserError("--memory-budget plans one-process training; leave out --nproc (with --nproc, pick the batch "
                        "with `dgl-exact plan --sampler neighbor --batch-size auto --memory-budget SIZE` and pass "
                        "--batch-size N)" if auto_batch else
                        "--memory-budget plans one-process full-graph training; leave out --nproc")
    if compile_mode is not None and (cfg.sampler != "full" or several or memory_budget is not None):
        raise UserError("--compile is for one-process full-graph training (static shapes): use --sampler full and "
                        "leave out --nproc and --memory-budget")
    if checkpoint_batches is not None and several:
        raise UserError("--checkpoint-batches is for one-process training; with --nproc, checkpoints are saved "
                        "after every epoch (leave it out)")
    if several and cfg.sampler == "full":
        raise UserError(distributed.FULL_GRAPH_ERROR)
    if worker and (nproc or 1) > 1 and not distributed.is_launched_child():
        raise UserError("--nproc starts the processes itself; under torchrun (WORLD_SIZE set) leave it out")


def _start_trainer(cfg, worker: bool, dataset, quiet: bool, dist_timeout, compile_mode, checkpoint_batches,
                   memory_budget):
    """The trainer of this process (one of ``--nproc``'s or torchrun's workers, or the only one), after
    printing (rank 0) the dataset and the run's setting."""
    from ..training import distributed
    from ..training.trainer import Trainer

    if worker:
        trainer = distributed.DistributedTrainer(cfg, progress=False if quiet else None, log=click.echo,
                                                 timeout=dist_timeout)
    else:
        trainer = Trainer(cfg, dataset=dataset, progress=False if quiet else None, log=click.echo)
        trainer.compile_mode = compile_mode
        trainer.checkpoint_batches = checkpoint_batches
    trainer.memory_budget = memory_budget  # recorded in the checkpoint, checked by --resume
    trainer.warn = lambda message: click.echo(f"warning: {message}", err=True)
    if trainer.rank == 0:
        click.echo(trainer.dataset_summary)
        click.echo(f"model {cfg.model}, {cfg.layers} layers x {cfg.hidden}, sampler {cfg.sampler}, "
                   f"activations {cfg.compression.describe()}, device {trainer.device}, "
                   f"graph {trainer.structure_note}"
                   + (f", {trainer.ctx.describe()}" if worker else ""))
    return trainer


def _fit(trainer, checkpoint, resume, resume_mismatch_ok, debug_mem, test_speed, quiet: bool, memory_budget,
         auto_batch: bool):
    """Train (the batch picked or the per-tensor plan made first under ``--memory-budget``); the results, with
    the budget plan's report where there is one."""
    from ..training.config import COMPRESSION_OPTIONS

    budget_plan = None
    if resume and memory_budget is not None and not resume_mismatch_ok:
        # before the search or the plan (probe steps), what they do not decide: refused at once if it differs
        trainer.check_resume(trainer.read_checkpoint(checkpoint), checkpoint,
                             skip=("batch_size",) if auto_batch else ("memory_plan", *COMPRESSION_OPTIONS))
    if auto_batch:
        trainer.cfg = _pick_batch(trainer, memory_budget)
    elif memory_budget is not None:  # a per-tensor plan (dgl_exact.planning.budget); the step peak is measured
        from ..planning.budget import plan_for_training

        budget_plan, debug_mem = plan_for_training(trainer, memory_budget, log=click.echo), True
        trainer.memory_plan = budget_plan.choices()
    # without a terminal to draw the bars on, one line per epoch (and per tenth of a long mini-batch epoch)
    lines = progress_lines(click.echo) if not quiet and trainer.rank == 0 else contextlib.nullcontext()
    with budget_plan.active() if budget_plan is not None else contextlib.nullcontext(), lines:
        results = trainer.fit(checkpoint=checkpoint, resume=resume, debug_mem=debug_mem, test_speed=test_speed,
                              resume_mismatch_ok=resume_mismatch_ok)
    if budget_plan is not None:
        _report_budget(budget_plan, results)
    return results


def _report_budget(budget_plan, results) -> None:
    """``--memory-budget``: the plan's predicted step peak against the measured one, in ``results`` and printed."""
    from ..memory import format_bytes
    from ..planning.budget import budget_report

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


# `train` options that only the --nproc launcher acts on (--download: it downloads before starting them).
_LAUNCHER_OPTIONS = ("conf", "nproc", "download")


def _worker_args(ctx) -> list:
    """The command line of the workers of ``train --nproc``: every option given to ``train`` except the
    training config (the workers read it from the YAML file :func:`~dgl_exact.training.distributed.launch`
    writes) and the launcher's own (:data:`_LAUNCHER_OPTIONS`). A new ``train`` option reaches the workers
    without being listed here."""
    from ..training.config import TrainConfig

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


def _check_resume_before_launch(checkpoint: str, cfg, nproc: int) -> None:
    """``--nproc N --resume``: the checkpoint's settings against this run's config and world size, before any
    worker starts (the workers check the rest: the data's fingerprint)."""
    from ..training.checkpoint import RunState
    from ..training.resume import check_resume

    try:
        state = RunState.load(checkpoint)
        check_resume(state.config, state.recorded, {**cfg.to_dict(), "world_size": nproc, "memory_budget": None,
                                                    "memory_plan": None}, checkpoint)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e).splitlines()[0]) from None


def _download_dataset(cfg, quiet: bool = False):
    """``train --download``: the dataset of ``cfg``, downloaded first if its folder is missing (one-line error
    otherwise, before any training)."""
    from ..data import DatasetNotFoundError, load_dataset

    try:
        return load_dataset(cfg.dataset, cfg.data_root, download=True, seed=cfg.seed, standardize=cfg.standardize,
                            quiet=quiet, compact=True)
    except DatasetNotFoundError as e:
        raise UserError(str(e)) from None
    except (FileNotFoundError, ValueError, OSError) as e:
        raise UserError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None


def _exit(code: int, worker: bool) -> None:
    if worker:
        from ..training import distributed

        distributed.exit_worker(code)
    sys.exit(code)


def _report(results, json_path) -> None:
    """The summary table, and the JSON results file if asked for."""
    from ..memory import format_bytes

    _print_summary(results, format_bytes)
    if json_path:  # atomically: a failure leaves an earlier file as it was and ends in one line (WriteError)
        with atomic_write(json_path, "w", encoding="utf-8", shared=True) as f:
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
