"""Which path each module's call took: a fused fast path or the modules' own calls, and why.

A fast path (GCNII's fused stack, SAGEConv's fused mean layer, a donated input released early, a linear
written in place) is taken only where it computes what the modules compute (see
:mod:`dgl_exact.ops.keep`). Where it is refused the step peak is higher; :func:`explain` says why, per
module::

    >>> print(dgl_exact.explain(model, g, x))     # doctest: +SKIP
    module        type       path                                   why not fused
    convs.0       GCN2Conv   modules' own calls                     a module has hooks (...)
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn as nn

__all__ = ["Explanation", "explain", "record"]

_recorder: "contextvars.ContextVar[Optional[Dict[int, Tuple[str, Optional[str]]]]]" = contextvars.ContextVar(
    "dgl_exact_paths", default=None)

COMPOSED = "modules' own calls"


def record(modules: Iterable[nn.Module], path: Optional[str], reason: Optional[str] = None) -> None:
    """Note, while :func:`explain` runs, that ``modules`` took ``path`` (None: the modules' own calls,
    because of ``reason``). The last note per module wins. No-op otherwise."""
    seen = _recorder.get()
    if seen is None:
        return
    for m in modules:
        seen[id(m)] = (path or COMPOSED, reason)


@contextlib.contextmanager
def _recording():
    token = _recorder.set({})
    try:
        yield _recorder.get()
    finally:
        _recorder.reset(token)


@dataclasses.dataclass
class Explanation:
    """Per module (qualified name): its type, the path its last call took, and why a fast path was not."""

    rows: List[Tuple[str, str, str, str]]

    def path(self, name: str) -> str:
        return next(r[2] for r in self.rows if r[0] == name)

    def reason(self, name: str) -> str:
        return next(r[3] for r in self.rows if r[0] == name)

    def __str__(self):
        head = ("module", "type", "path", "why not fused")
        widths = [max(len(head[i]), *(len(r[i]) for r in self.rows)) if self.rows else len(head[i])
                  for i in range(3)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(head[:3], widths)) + "  " + head[3]]
        for r in self.rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3])
        return "\n".join(lines)


def explain(model: nn.Module, *inputs, **kwargs) -> Explanation:
    """Run ``model(*inputs, **kwargs)`` once (in its current train/eval mode, grad enabled, no backward) and
    list, for each dgl_exact module and each module a fused path covered, which path its call took and
    why a fast path was refused. Running it draws random numbers and, in training mode, updates batch
    norm's running statistics, as any forward does."""
    with _recording() as seen, torch.enable_grad():
        model(*inputs, **kwargs)
    rows = []
    for name, m in model.named_modules():
        entry = seen.get(id(m))
        if entry is None:
            if not type(m).__module__.startswith("dgl_exact."):
                continue
            entry = (COMPOSED, "")
        rows.append((name or "<root>", type(m).__name__, entry[0], entry[1] or ""))
    return Explanation(rows)
