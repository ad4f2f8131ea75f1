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
import contextlib

import torch

from .. import memory
from ..compression_config import config as compression_scope
from ..planning.settings import Setting


def model_census(work, model_name: str, setting: Setting, *, top: int = 20,
                 min_bytes: int = 256 * 1024) -> memory.CensusReport:
    """The census of ``model_name``'s training step on ``work`` (a :class:`~.runner.Workload`) under
    ``setting``: a fresh model and Adam, one warm-up step, then the censused step."""
    model = work.build(model_name, setting.impl, recompute=setting.recompute)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    forward = work.step_fn(model_name, model, setting.impl)

    def step():
        opt.zero_grad(set_to_none=True)
        loss, logits = forward()
        del logits
        loss.backward()
        opt.step()

    scope = compression_scope(setting.compression) if setting.compression else contextlib.nullcontext()
    with scope:
        return memory.census(step, warmup=1, top=top, min_bytes=min_bytes, device=str(work.device))


def main(argv=None):
    from ..data import load_dataset
    from ..planning.settings import select
    from .runner import Workload

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
