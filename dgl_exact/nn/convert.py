"""Convert an existing model in place: DGL convs and torch layers become their compressed versions."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import torch.nn as nn

from .._compat import import_dgl
from ..config import CompressionConfig
from . import layers
from .conv import GATConv, GCN2Conv, GraphConv, SAGEConv

dgl = import_dgl()

# exact source class -> dgl_exact class (a subclass with the same parameters and state_dict)
_CONVERSIONS = {
    dgl.nn.GraphConv: GraphConv,
    dgl.nn.SAGEConv: SAGEConv,
    dgl.nn.GATConv: GATConv,
    dgl.nn.GCN2Conv: GCN2Conv,
    nn.Linear: layers.Linear,
    nn.BatchNorm1d: layers.BatchNorm1d,
    nn.ReLU: layers.ReLU,
    nn.LeakyReLU: layers.LeakyReLU,
    nn.ELU: layers.ELU,
    nn.Dropout: layers.Dropout,
}


@dataclasses.dataclass
class ConversionReport:
    """What :func:`compress_model` changed: qualified module name -> ``"Old -> New"``."""

    converted: Dict[str, str] = dataclasses.field(default_factory=dict)
    fused: List[str] = dataclasses.field(default_factory=list)

    def __len__(self):
        return len(self.converted)

    def __str__(self):
        if not self.converted:
            return "compress_model: nothing to convert"
        lines = [f"compress_model: converted {len(self.converted)} module(s)"]
        lines += [f"  {name or '<root>'}: {change}" for name, change in self.converted.items()]
        lines += [f"  fused ReLU+Dropout: {name}" for name in self.fused]
        return "\n".join(lines)


def compress_model(model: nn.Module, config: Optional[CompressionConfig] = None, fuse: bool = True,
                   report: bool = False):
    """Convert ``model`` in place so its activations are kept compressed; weights are preserved.

    Converts modules whose type is exactly one of DGL's ``GraphConv``, ``SAGEConv``, ``GATConv``,
    ``GCN2Conv`` or torch's ``Linear``, ``BatchNorm1d``, ``ReLU``, ``LeakyReLU``, ``ELU``, ``Dropout``
    (subclasses are left alone: their forward may differ). ``config`` is set as each converted module's
    ``compression`` (None: follow the configuration in force). With ``fuse``, a ``ReLU`` directly followed
    by a ``Dropout`` inside an ``nn.Sequential`` becomes one ``ReLUDropout`` keeping a single bit.
    Activations called functionally inside ``forward`` (``F.relu(x)``) cannot be seen and stay as they are.

    Returns ``model`` (converted in place, like torch's ``nn.SyncBatchNorm.convert_sync_batchnorm``), so
    ``model = compress_model(model)`` works; with ``report=True``, ``(model, ConversionReport)``: what was
    converted and fused (``print(report)`` lists it).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"compress_model expects a torch.nn.Module, got {type(model).__name__}")
    if config is not None and not isinstance(config, CompressionConfig):
        raise TypeError(f"config must be a dgl_exact.CompressionConfig or None, got {type(config).__name__}")
    result = ConversionReport()
    for name, module in list(model.named_modules()):
        target = _CONVERSIONS.get(type(module))
        if target is None:
            continue
        old = f"{type(module).__module__.split('.')[0]}.{type(module).__name__}"  # before the class changes
        module.__class__ = target
        if hasattr(target, "_init_compression"):
            module.compression = config
        result.converted[name] = f"{old} -> dgl_exact.{target.__name__}"
    if fuse:
        for name, module in list(model.named_modules()):
            if isinstance(module, nn.Sequential):
                _fuse_relu_dropout(module, name, result)
    return (model, result) if report else model


def _fuse_relu_dropout(seq: nn.Sequential, prefix: str, report: ConversionReport) -> None:
    keys = list(seq._modules.keys())
    for a, b in zip(keys, keys[1:]):
        first, second = seq._modules[a], seq._modules[b]
        if type(first) is layers.ReLU and type(second) is layers.Dropout:
            fused = layers.ReLUDropout(second.p)
            fused.train(second.training)  # a new module starts in training mode: keep the model's (eval) mode
            identity = nn.Identity()
            identity.train(second.training)
            seq._modules[a] = fused
            seq._modules[b] = identity
            report.fused.append(f"{prefix}.{a}+{b}" if prefix else f"{a}+{b}")
