"""Which lines hold the peak of a benchmarked model's training step: :func:`dgl_exact.memory.census` run on
a :class:`~dgl_exact.bench.runner.Workload`'s model under one setting (``dgl-exact bench census``).

The step is the benchmark's own (``Workload.step_fn``: forward, loss, backward, Adam step, under the
setting's compression), after one warm-up step; the report groups the storages alive at the forward and
backward peaks by the source line that made them (a user model's lines in ``bench/user_models.py``
included). See :mod:`dgl_exact.memory.peak_census` for what the census can and cannot see.

    python -m dgl_exact.bench.census --model gcn2 --layers 16 --setting INT2
"""
from __future__ import annotations

import argparse

from .. import memory
from ..planning.settings import Setting
from .runner import Workload, training_step


def model_census(work, model_name: str, setting: Setting, *, top: int = 20,
                 min_bytes: int = 256 * 1024) -> memory.CensusReport:
    """The census of ``model_name``'s training step on ``work`` (a :class:`~.runner.Workload`) under
    ``setting``: a fresh model and Adam (:func:`~.runner.training_step`), one warm-up step, then the censused
    step."""
    _, one_step, scope = training_step(work, model_name, setting)
    with scope:
        return memory.census(one_step, warmup=1, top=top, min_bytes=min_bytes, device=str(work.device))


def main(argv=None):
    from ..data import load_dataset
    from ..planning.settings import select

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="synthetic-arxiv")
    ap.add_argument("--data-root", default="data")
    ap.add_argument("--model", default="sage", help="a project model or one of bench/user_models.py's")
    ap.add_argument("--layers", type=int, default=None, help="default: the model's own")
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--setting", default="INT2")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args(argv)
    work = Workload(load_dataset(a.dataset, a.data_root), "cpu", hidden=a.hidden, layers=a.layers)
    print(model_census(work, a.model, select(a.setting)[0], top=a.top))


if __name__ == "__main__":
    main()
