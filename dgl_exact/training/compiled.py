"""``dgl-exact train --compile``: the model under ``torch.compile`` (see :mod:`dgl_exact.ops.captured`)."""
from __future__ import annotations

import warnings

import torch

from ..ops import captured

__all__ = ["COMPILE_MODES", "compile_model"]

#: ``torch.compile`` modes ``--compile`` accepts ("reduce-overhead": CUDA graphs on a GPU)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


def compile_model(model: torch.nn.Module, mode: str = "default") -> torch.nn.Module:
    """``torch.compile(model)`` for full-graph training: static shapes (``dynamic=False``; the graph and the
    features never change shape), dgl_exact's ops as captured custom ops. The returned wrapper shares the
    model's parameters; its ``_orig_mod`` is ``model``."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got {mode!r}")
    if not captured.SUPPORTED:
        raise ValueError(f"--compile needs torch >= 2.4 (torch.library.custom_op); this is torch {torch.__version__}")
    if mode == "reduce-overhead":
        warnings.warn("dgl_exact: --compile=reduce-overhead (CUDA graphs) is untested, and a replayed step reuses "
                      "the captured step's compression and dropout seeds (see dgl_exact.ops.captured)", stacklevel=2)
    return torch.compile(model, mode=mode, dynamic=False)
