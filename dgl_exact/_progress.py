"""The progress bar of the training loops and the benchmarks (imports nothing from dgl_exact).

Where a bar is hidden (its ``enabled`` is False: ``--quiet``, or no terminal to draw it on), nothing shows that
long work goes on. Within :func:`progress_lines` (``dgl-exact train`` uses it unless ``--quiet``), a hidden bar
prints lines instead: one per epoch (``run 1/1: epoch 3/200, loss=0.6931, val=0.7000, test=0.7100 (0.12 s)``, with
what the loop shows on its bar), one every tenth of an epoch of at least 50 batches, one per item of any
other bar.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import time

# (write, min_batches, batch_lines) while progress_lines is active
_LINES = contextvars.ContextVar("dgl_exact_progress_lines", default=None)


@contextlib.contextmanager
def progress_lines(write, min_batches: int = 50, batch_lines: int = 10):
    """Within: every hidden bar (``enabled=False``) calls ``write(line)`` as it advances instead of staying
    silent: a line per item, except for bars of ``unit="batch"``, which write ``batch_lines`` lines per pass
    of at least ``min_batches`` batches and none for shorter ones."""
    token = _LINES.set((write, min_batches, batch_lines))
    try:
        yield
    finally:
        _LINES.reset(token)


def progress_bar(iterable=None, enabled: bool = True, **kwargs):
    """A tqdm bar over ``iterable``, hidden unless ``enabled``, as wide as the terminal; hidden within
    :func:`progress_lines`: a :class:`LineProgress`."""
    lines = _LINES.get()
    if not enabled and lines is not None:
        return LineProgress(iterable, *lines, **kwargs)
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=not enabled, dynamic_ncols=True, **kwargs)


class LineProgress:
    """The part of tqdm's interface the loops use (iteration, ``set_postfix``, ``set_description``, ``update``,
    ``close``), writing one line per item (per ``every`` items for batches) with the postfix set since the
    previous line (the trainer sets loss, val and test on the epochs it evaluates) and the seconds since it."""

    def __init__(self, iterable, write, min_batches: int = 50, batch_lines: int = 10, desc=None, total=None,
                 unit: str = "it", initial: int = 0, **_tqdm_options):
        self.iterable, self.write, self.desc, self.unit, self.n = iterable, write, desc, unit, initial
        if total is None and hasattr(iterable, "__len__"):
            total = initial + len(iterable)
        self.total = total
        self.postfix = {}
        if unit != "batch":
            self.every = 1
        elif total is not None and total >= min_batches:
            self.every = math.ceil(total / batch_lines)
        else:
            self.every = None  # a short pass: its epoch line says enough
        self._last = time.perf_counter()

    def __iter__(self):
        self._last = time.perf_counter()
        for item in self.iterable:
            yield item
            self.n += 1
            if self.every and (self.n % self.every == 0 or self.n == self.total):
                self._line()

    def _line(self) -> None:
        now = time.perf_counter()
        where = f"{self.unit} {self.n}" + (f"/{self.total}" if self.total is not None else "")
        shown = "".join(f", {k}={v}" for k, v in self.postfix.items())
        self.write(f"{self.desc + ': ' if self.desc else ''}{where}{shown} ({now - self._last:.2f} s)")
        self._last = now
        self.postfix = {}  # a line shows what was set for its own items (a bar would keep showing it)

    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs) -> None:
        self.postfix = {**(ordered_dict or {}), **kwargs}

    def set_description(self, desc=None, refresh=True) -> None:
        self.desc = desc

    def update(self, n: int = 1) -> None:
        self.n += n

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
