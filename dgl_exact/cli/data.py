"""``dgl-exact datasets`` (which datasets are known and present, downloads) and ``dgl-exact info``
(versions, devices, kernel backend)."""
from __future__ import annotations

import os

import click

from ._common import DATA_ROOT_SHOWN, UserError


@click.command()
@click.option("--data-root", type=click.Path(file_okay=False), default=lambda: os.environ.get("DGL_EXACT_DATA", "data"),
              show_default=DATA_ROOT_SHOWN)
@click.option("--download", multiple=True, metavar="NAME", show_default="none",
              help="Download dataset NAME into --data-root with ogb's or DGL's own downloader if its folder is "
                   "missing, then load it once. Repeatable. Nothing is downloaded without it.")
@click.option("--force-reload", multiple=True, metavar="NAME", show_default="none",
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
    from ..data import DATASETS, dataset_status, load_dataset

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


@click.command()
def info():
    """Versions, devices and the active kernel backend (this imports torch and DGL: not as fast as --help)."""
    import platform

    import torch

    from .. import __version__, backend

    click.echo(f"dgl_exact {__version__}")
    click.echo(f"python    {platform.python_version()} ({platform.machine()})")
    click.echo(f"torch     {torch.__version__} (CUDA {torch.version.cuda or 'none'}, "
               f"{torch.get_num_threads()} CPU threads)")
    click.echo(f"dgl       {_dgl_line()}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            click.echo(f"cuda:{i}    {torch.cuda.get_device_name(i)}")
    else:
        click.echo("cuda      not available")
    click.echo(str(backend()))


def _dgl_line() -> str:
    """DGL's version, and whether dgl_exact's graphbolt placeholder stands in for DGL's graphbolt."""
    from .._compat import graphbolt_stubbed, import_dgl

    try:
        dgl = import_dgl()
    except ModuleNotFoundError as e:
        if e.name != "dgl":
            raise
        return "not installed (pip install dgl==2.1.0; dgl_exact's core and dgl_exact.pyg work without it)"
    return dgl.__version__ + (" (graphbolt unavailable for this torch: placeholder installed)"
                              if graphbolt_stubbed() else "")


# ------------------------------------------------------------------------------------------------------
# benchmarks
# ------------------------------------------------------------------------------------------------------
