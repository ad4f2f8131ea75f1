"""Whether dynamo is tracing a dgl_exact op, and the constants traced code shares (a leaf: torch only).

:mod:`dgl_exact.compression_config` reads the configuration in force through :func:`active`, and
:mod:`dgl_exact.compression` draws its seeds through :data:`RUNTIME_SEED`, without importing the ops layer
(:mod:`dgl_exact.ops.captured` holds the captured custom ops themselves).
"""
from __future__ import annotations

import functools

import torch

from ._compat import compiling, eager_during_trace

__all__ = ["SUPPORTED", "RUNTIME_SEED", "active", "assume_constant"]

#: torch has what the captured route needs (``torch.library.custom_op`` with autograd, torch >= 2.4)
SUPPORTED = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_autograd")

#: the seed a public op passes while compiling: the forward op draws the real one when it runs
RUNTIME_SEED = -1


def active() -> bool:
    """Whether the op being called is being traced by dynamo and the captured route is available."""
    return SUPPORTED and compiling()


def assume_constant(fn):
    """Dynamo runs ``fn`` for real at trace time and bakes its result into the graph as a constant: what
    ``torch._dynamo.assume_constant_result`` does, which is to set this marker (importing ``torch._dynamo``
    here would double the import time of dgl_exact; tests/ops/test_captured.py fails if the marker stops working)."""

    @functools.wraps(fn)
    def eager(*args):
        with eager_during_trace():
            return fn(*args)

    eager._dynamo_marked_constant = True
    return eager
