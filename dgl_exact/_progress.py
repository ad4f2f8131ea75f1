"""The progress bar of the training loops and the benchmarks (imports nothing from dgl_exact)."""
from __future__ import annotations


def progress_bar(iterable=None, enabled: bool = True, **kwargs):
    """A tqdm bar over ``iterable``, hidden unless ``enabled``, as wide as the terminal."""
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=not enabled, dynamic_ncols=True, **kwargs)
