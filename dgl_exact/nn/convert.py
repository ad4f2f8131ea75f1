"""Convert an existing model in place: DGL convs and torch layers become their compressed versions."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import torch
import torch.nn as nn

from .._compat import import_dgl
from ..compression_config import CompressionConfig
from . import layers
from .conv import GATConv, GCN2Conv, GraphConv, SAGEConv
from .sequential import Sequential, fusable_runs

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
    nn.LayerNorm: layers.LayerNorm,
    nn.GELU: layers.GELU,
    nn.SiLU: layers.SiLU,
    nn.PReLU: layers.PReLU,
    nn.Softmax: layers.Softmax,
    nn.LogSoftmax: layers.LogSoftmax,
}


# modules that keep nothing for backward themselves (containers, identity): never reported as fp32
_KEEP_NOTHING = (nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.Identity, nn.Flatten, nn.Unflatten)


@dataclasses.dataclass
class ConversionReport:
    """What :func:`compress_model` changed: ``converted`` (qualified module name -> ``"Old -> New"``),
    ``fused`` (ReLU+Dropout pairs), ``fused_norm`` (BatchNorm1d+ReLU(+Dropout) runs of an ``nn.Sequential``
    that now runs them as one op, :class:`dgl_exact.nn.Sequential`) and ``fp32`` (qualified module name ->
    why what it keeps for backward stays uncompressed, or how it is compressed anyway with
    ``saved_tensors=True``)."""

    converted: Dict[str, str] = dataclasses.field(default_factory=dict)
    fused: List[str] = dataclasses.field(default_factory=list)
    fused_norm: List[str] = dataclasses.field(default_factory=list)
    fp32: Dict[str, str] = dataclasses.field(default_factory=dict)

    def __len__(self):
        return len(self.converted)

    def __str__(self):
        if not self.converted:
            lines = ["compress_model: nothing to convert"]
        else:
            lines = [f"compress_model: converted {len(self.converted)} module(s)"]
        lines += [f"  {name or '<root>'}: {change}" for name, change in self.converted.items()]
        lines += [f"  fused ReLU+Dropout: {name}" for name in self.fused]
        lines += [f"  fused BatchNorm1d+ReLU(+Dropout), in place where allowed: {name}" for name in self.fused_norm]
        if self.fp32:
            lines.append(f"  not converted ({len(self.fp32)}):")
            lines += [f"    {name or '<root>'}: {why}" for name, why in self.fp32.items()]
        return "\n".join(lines)


def _qualname(cls) -> str:
    return f"{cls.__module__.split('.')[0]}.{cls.__name__}"


def _why_fp32(module: nn.Module, saved_tensors: bool) -> Optional[str]:
    """Why ``module`` (not converted) keeps what it saves in fp32; None if there is nothing to say."""
    cls = type(module)
    if cls.__module__.startswith("dgl_exact.") or isinstance(module, _KEEP_NOTHING):
        return None
    fallback = ("; compressed by the saved-tensor hooks (saved_tensors=True)" if saved_tensors
                else "; compress_model(..., saved_tensors=True) compresses it through saved-tensor hooks")
    base = next((b for b in _CONVERSIONS if isinstance(module, b)), None)
    if base is not None:
        return f"subclass of {_qualname(base)}: its forward may differ" + fallback
    own = cls.__module__.split(".")[0]
    if own in ("torch", "dgl"):
        return f"{_qualname(cls)} has no dgl_exact version" + fallback
    if list(module.children()):
        return ("custom module: what the functional calls in its forward save (F.relu, torch ops; a residual "
                "add saves nothing) is not visible" + fallback)
    return "custom module, forward unknown" + fallback


def compress_model(model: nn.Module, config: Optional[CompressionConfig] = None, fuse: bool = True,
                   report: bool = False, saved_tensors: bool = False):
    """Convert ``model`` in place so its activations are kept compressed; weights are preserved.

    Converts modules whose type is exactly one of DGL's ``GraphConv``, ``SAGEConv``, ``GATConv``,
    ``GCN2Conv`` or torch's ``Linear``, ``BatchNorm1d``, ``LayerNorm``, ``ReLU``, ``LeakyReLU``, ``ELU``,
    ``GELU``, ``SiLU``, ``PReLU``, ``Softmax``, ``LogSoftmax``, ``Dropout`` (subclasses are left alone: their
    forward may differ). Converted modules keep their train/eval mode. A residual connection
    (``x + f(x)``) keeps nothing for backward, so it needs no conversion. ``config`` is set as each converted module's
    ``compression`` (None: follow the configuration in force). With ``fuse``, a ``ReLU`` directly followed
    by a ``Dropout`` inside an ``nn.Sequential`` becomes one ``ReLUDropout`` keeping a single bit, and an
    ``nn.Sequential`` (exactly that type) in which a ``BatchNorm1d`` is directly followed by a ``ReLU`` (and
    ``Dropout``) becomes a :class:`dgl_exact.nn.Sequential`, which runs that run as one op writing ReLU and
    dropout into batch norm's output (one layer-sized tensor less at the step's peak) wherever that computes
    what the modules compute (training, no hooks, fp32; else the modules are called one by one).
    Activations called functionally inside ``forward`` (``F.relu(x)``) cannot be seen and stay as they are,
    unless ``saved_tensors=True``: then every training forward of ``model`` runs inside
    :func:`dgl_exact.compress_saved` (with ``config``), which compresses what autograd saves for the ops
    dgl_exact does not know (unbiased only where their backward is linear in it: see that function).

    Returns ``model`` (converted in place, like torch's ``nn.SyncBatchNorm.convert_sync_batchnorm``), so
    ``model = compress_model(model)`` works; with ``report=True``, ``(model, ConversionReport)``: what was
    converted and fused, and which modules stay fp32 and why (``print(report)`` lists it).
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
        for name, module in list(model.named_modules()):
            if type(module) is nn.Sequential and fusable_runs(module):
                module.__class__ = Sequential  # the same children: only its forward runs the runs as one op
                result.fused_norm += [f"{name}.{a}+{b}" if name else f"{a}+{b}" for a, b in fusable_runs(module)]
    if saved_tensors:
        _install_saved_tensor_hooks(model, config)
    for name, module in model.named_modules():
        if name not in result.converted:
            why = _why_fp32(module, saved_tensors)
            if why is not None:
                result.fp32[name] = why
    return (model, result) if report else model


_SCOPES = "_compress_saved_scopes"


def _install_saved_tensor_hooks(model: nn.Module, config: Optional[CompressionConfig]) -> None:
    """Every training forward of ``model`` (grad mode on) runs inside ``compress_saved(config, model=model)``."""
    import contextlib

    from ..saved_tensors import compress_saved

    if getattr(model, _SCOPES, None) is not None:
        model._compress_saved_config = config
        return
    model._compress_saved_config = config
    setattr(model, _SCOPES, [])

    def enter(module, args):
        stack = contextlib.ExitStack()
        if module.training and torch.is_grad_enabled():
            stack.enter_context(compress_saved(module._compress_saved_config, model=module))
        getattr(module, _SCOPES).append(stack)

    def leave(module, args, output):
        scopes = getattr(module, _SCOPES)
        if scopes:
            scopes.pop().close()

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)


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
