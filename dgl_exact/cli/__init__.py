"""The ``dgl-exact`` command (console script, and ``python -m dgl_exact``): one module per command group.

* :mod:`.train`: ``train``
* :mod:`.data`: ``datasets``, ``info``
* :mod:`.bench`: ``bench memory|speed|profile|kernels|accuracy|minibatch|all``
* :mod:`.plan`: ``plan``, ``bench plan``, ``bench budget``
* :mod:`._common`: :class:`UserError` and the checks every command makes before any work
"""
from __future__ import annotations

import sys

import click

from .. import _environment
from ._common import CONTEXT_SETTINGS, UserError, parse_size
from .bench import bench
from .data import datasets, info
from .plan import bench_budget_command, bench_plan_command, plan_command
from .train import train

__all__ = ["cli", "main", "example_main", "UserError", "parse_size"]


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="dgl-exact", prog_name="dgl-exact")
def cli():
    """Train GNNs on DGL with compressed activations (EXACT / i-EXACT)."""
    _environment.check()  # every command, before any work (not for --help)

cli.add_command(train)
cli.add_command(datasets)
cli.add_command(info)
cli.add_command(bench)
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

    @click.command(context_settings={**CONTEXT_SETTINGS, "ignore_unknown_options": True, "allow_extra_args": True},
                   help=f"Train on {dataset} with dgl_exact's bundled config for the model (--conf "
                        f"{', '.join(sorted(set(confs.values())))}: each file says whose hyperparameters it holds); "
                        "other options are those of `dgl-exact train` (see `dgl-exact train --help`).")
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
