"""EXACT's ``--debug-mem`` breakdown of a measured training step: what the model, the data on the device and
the step itself hold. The step is measured by :func:`dgl_exact.memory.measure_step`; this module adds the
static parts around it, which need the graph's structure (:func:`~dgl_exact.data.compact.structure_bytes`),
a layer the memory code does not import."""
from __future__ import annotations

from typing import Any, Dict, Iterable

import torch

from .. import memory
from ..data.compact import structure_bytes
from .pyg_models import PyGModel

__all__ = ["step_breakdown"]


def step_breakdown(module: torch.nn.Module, optimizer, device: torch.device, data: Iterable, graphs: Iterable,
                   report) -> Dict[str, Any]:
    """Bytes on ``device``'s type: ``model_bytes`` (``module``'s parameters and buffers, ``optimizer``'s
    state), ``data_bytes`` (the structure arrays DGL holds for ``graphs``, their node and edge data, the
    tensors in ``data`` and dgl_exact's cached structure tensors; for a PyG model, the ``edge_index`` it made of
    each graph and the structures dgl_exact.pyg's convs cache for it; a tensor counted once), the step's
    ``peak_method`` and ``total_bytes`` = model + data + ``report``'s step peak (None where it was not
    measured). ``report``: the step's :class:`~dgl_exact.memory.MemoryReport`."""
    model_tensors = list(module.parameters()) + list(module.buffers())
    model_tensors += [t for st in optimizer.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    model_bytes = memory.tensor_bytes(t for t in model_tensors if t.device.type == device.type)
    data_tensors = [t for t in data if isinstance(t, torch.Tensor)] + memory.cached_static_tensors()
    structure = 0
    for g in graphs:
        data_tensors += PyGModel.graph_tensors(g) + PyGModel.structure_tensors(g)  # (on the features' device)
        if g.device.type != device.type:
            continue
        data_tensors += [t for t in (*g.ndata.values(), *g.edata.values()) if isinstance(t, torch.Tensor)]
        structure += structure_bytes(g)  # the arrays DGL holds: COO src, dst; CSR/CSC offsets, indices, edge ids
    data_bytes = structure + memory.tensor_bytes(t for t in data_tensors if t.device.type == device.type)
    peak = report.peak_bytes
    return {"model_bytes": model_bytes, "data_bytes": data_bytes, "peak_method": report.peak_method,
            "total_bytes": None if peak is None else model_bytes + data_bytes + peak}
