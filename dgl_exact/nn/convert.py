"""Convert an existing model in place: DGL's and PyG's convs and torch's and PyG's layers become their
compressed versions."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import sys
from typing import Dict, List, Optional

import torch
import torch.nn as nn

from .._compat import compiling, import_dgl
from ..compression_config import CompressionConfig, get_config
from ..compression_config import config as config_scope
from ..ops.functional import functional_ops
from ..ops.routing import message_passing
from . import layers
from .sequential import Sequential, fusable_runs

# exact source class -> dgl_exact class (a subclass with the same parameters and state_dict); DGL's convs:
# :func:`_dgl_conversions`, PyG's: :data:`dgl_exact.pyg.CONVERSIONS`
_TORCH_CONVERSIONS = {
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


def _dgl_loaded() -> bool:
    """Whether DGL is imported (a model holding DGL modules has imported it): what concerns DGL's modules and
    message passing is done only then, so that a model without them neither imports DGL nor needs it installed."""
    return sys.modules.get("dgl") is not None


def _dgl_conversions() -> dict:
    """DGL's convs -> dgl_exact's where DGL is loaded (:func:`_dgl_loaded`), else empty."""
    if not _dgl_loaded():
        return {}
    from .conv import GATConv, GCN2Conv, GraphConv, SAGEConv

    dgl = import_dgl()
    return {dgl.nn.GraphConv: GraphConv, dgl.nn.SAGEConv: SAGEConv, dgl.nn.GATConv: GATConv,
            dgl.nn.GCN2Conv: GCN2Conv}


def _conversions() -> dict:
    """Every conversion of torch's and, where loaded, DGL's modules (exact type -> dgl_exact class)."""
    return {**_TORCH_CONVERSIONS, **_dgl_conversions()}


# modules that keep nothing for backward themselves (containers, identity): never reported as fp32
_KEEP_NOTHING = (nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.Identity, nn.Flatten, nn.Unflatten)


def _pyg():
    """:mod:`dgl_exact.pyg.conversions` where PyTorch Geometric is loaded (a model holding PyG modules has loaded
    it), else None: a model without PyG never imports it."""
    if "torch_geometric" not in sys.modules:
        return None
    from ..pyg import conversions

    return conversions


def _pyg_keeps_nothing(module: nn.Module) -> bool:
    """PyG's ``BatchNorm`` wrapper calls its ``module`` (a ``torch.nn.BatchNorm1d``, converted as torch's):
    nothing is kept by the wrapper itself (but on a batch of one row with ``allow_single_element``, where it
    normalises with the running statistics: a row)."""
    import torch_geometric.nn as pyg_nn

    return type(module) is pyg_nn.BatchNorm


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
        if any(change.endswith("Dropout") for change in self.converted.values()):
            lines.append("  dropout masks: torch's own (same seed, same masks) with compression off; with compression "
                         "on, and for GATConv's attention dropout (fused into its attention op), dgl_exact's kernels "
                         "draw them (reproducible under torch.manual_seed, not torch's)")
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
    pyg = _pyg()
    if pyg is not None and _pyg_keeps_nothing(module):
        return None
    known = (*_conversions(), *(pyg.CONVERSIONS if pyg is not None else ()))
    base = next((b for b in known if isinstance(module, b)), None)
    if base is not None:
        return f"subclass of {_qualname(base)}: its forward may differ" + fallback
    if pyg is not None and isinstance(module, pyg.pyg_nn.MessagePassing):
        return (f"PyG MessagePassing without a dgl_exact drop-in ({_qualname(cls)}): runs as PyG runs it; what its "
                "propagate saves (messages, attention, edge weights) stays fp32 (its torch or PyG Linear and "
                "activation submodules, if any, are converted)" + fallback)
    own = cls.__module__.split(".")[0]
    if own in ("torch", "dgl"):
        return f"{_qualname(cls)} has no dgl_exact version" + fallback
    if list(module.children()):
        return ("custom module: its graph ops (DGL's built-in message passing, edge_softmax, dgl_exact.ops) run "
                "compressed at the model's config, and so do functional activations and dropout (F.relu, F.dropout: "
                "dgl_exact.ops.functional_ops); what its other calls save (torch ops such as torch.tanh or x * y, "
                "Python message functions; a residual add saves nothing) is not visible here: "
                "dgl_exact.explain(model, *inputs) runs the forward and names each op that keeps fp32, its line and "
                "why" + fallback)
    return ("custom module, forward unknown (dgl_exact.explain(model, *inputs) names each op of it that keeps "
            "fp32)" + fallback)


def compress_model(model: nn.Module, config: Optional[CompressionConfig] = None, fuse: bool = True,
                   report: bool = False, saved_tensors: bool = False):
    """Convert ``model`` in place so its activations are kept compressed; weights are preserved.

    Converts modules whose type is exactly one of DGL's ``GraphConv``, ``SAGEConv``, ``GATConv``,
    ``GCN2Conv``, PyTorch Geometric's ``GCNConv``, ``SAGEConv``, ``GATConv``, ``GATv2Conv``, ``GCN2Conv``,
    ``Linear`` (to :mod:`dgl_exact.pyg`'s drop-ins, whatever their settings) or torch's
    ``Linear``, ``BatchNorm1d``, ``LayerNorm``, ``ReLU``, ``LeakyReLU``, ``ELU``, ``GELU``, ``SiLU``, ``PReLU``,
    ``Softmax``, ``LogSoftmax``, ``Dropout`` (subclasses are left alone: their forward may differ); PyG's
    ``BatchNorm`` runs its ``torch.nn.BatchNorm1d``, converted as torch's. Converted modules keep their
    train/eval mode. A residual (``x + f(x)``) keeps nothing for backward: nothing to convert. A PyG conv with
    a setting its drop-in has no compressed path for (``decomposed_layers > 1``, SAGE's ``lstm`` or several
    aggregations, GAT's ``edge_dim``: :func:`dgl_exact.pyg.pyg_code`) is converted and runs PyG's code, what it
    saves compressed by :func:`dgl_exact.compress_saved` at its configuration; the report says so. A PyG
    ``MessagePassing`` without a drop-in runs as PyG runs it, its ``propagate`` saving what PyG saves (fp32
    unless ``saved_tensors=True``); the report names it.

    ``config`` becomes the model's configuration (None: keep the one it has, else follow the configuration in
    force): every compressed op that runs inside ``model``'s forward runs at it (converted modules take it as
    their ``compression``; ``dgl_exact.ops`` calls in a custom ``forward`` and the saved-tensor hooks run
    inside a ``dgl_exact.config(config)`` scope entered by a forward pre-hook and left by an always-called
    forward hook; DGL's built-in message passing runs on dgl_exact's ops there: :func:`dgl_exact.message_passing`);
    a nested model converted with its own configuration keeps it inside its forward; modules given a
    ``compression`` by the user keep it. :func:`set_model_config` changes it later. Under ``torch.compile`` the
    scope is not entered (dynamo cannot trace it): converted modules keep the model's configuration (their
    ``compression``), other ops take the configuration in force when dynamo traces.

    With ``fuse``, a ``ReLU`` directly followed by a ``Dropout`` inside an ``nn.Sequential`` becomes one
    ``ReLUDropout`` keeping a single bit, and an ``nn.Sequential`` (exactly that type) in which a
    ``BatchNorm1d`` is directly followed by a ``ReLU`` (and ``Dropout``) becomes a
    :class:`dgl_exact.nn.Sequential`, which runs that run as one op writing ReLU and dropout into batch norm's
    output (one layer-sized tensor less at the step's peak) wherever that computes what the modules compute
    (training, no hooks, fp32; else the modules are called one by one).
    Functional activations and dropout (``F.relu``, ``F.dropout``, ...) run as their converted modules do
    (:func:`dgl_exact.ops.functional_ops`); other torch calls (``torch.tanh``, ``x * y``) keep what torch keeps
    unless ``saved_tensors=True``: then training forwards run inside :func:`dgl_exact.compress_saved` (with
    ``config``), unbiased only where an op's backward is linear in what it saves (see that function).

    Returns ``model`` (converted in place, like torch's ``nn.SyncBatchNorm.convert_sync_batchnorm``), so
    ``model = compress_model(model)`` works; with ``report=True``, ``(model, ConversionReport)``: what was
    converted and fused, and which modules stay fp32 and why (``print(report)`` lists it).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"compress_model expects a torch.nn.Module, got {type(model).__name__}")
    if config is not None and not isinstance(config, CompressionConfig):
        raise TypeError(f"config must be a dgl_exact.CompressionConfig or None, got {type(config).__name__}")
    result = ConversionReport()
    pyg = _pyg()
    converted = _convert_modules(model, pyg, result)
    if fuse:
        for name, module in list(model.named_modules()):
            if isinstance(module, nn.Sequential):
                _fuse_relu_dropout(module, name, result)
        for name, module in list(model.named_modules()):
            if type(module) is nn.Sequential and fusable_runs(module):
                module.__class__ = Sequential  # the same children: only its forward runs the runs as one op
                result.fused_norm += [f"{name}.{a}+{b}" if name else f"{a}+{b}" for a, b in fusable_runs(module)]
    if saved_tensors:
        setattr(model, _SAVED_TENSORS, True)
    _apply_model_config(model, config if config is not None else get_model_config(model), converted)
    # a PyG conv's aggregation module: not called by a drop-in, part of PyG's propagate (reported with its conv)
    inside = {f"{name}.aggr_module" if name else "aggr_module" for name, module in model.named_modules()
              if pyg is not None and isinstance(module, pyg.pyg_nn.MessagePassing)}
    for name, module in model.named_modules():
        if name not in result.converted and name not in inside:
            why = _why_fp32(module, saved_tensors)
            if why is not None:
                result.fp32[name] = why
    return (model, result) if report else model


def _convert_modules(model: nn.Module, pyg, result: ConversionReport) -> list:
    """Swap the class of every module of ``model`` whose exact type has a dgl_exact version (``pyg``: the PyG
    conversions, where PyG is loaded), noting each in ``result`` (a PyG conv's setting that runs PyG's code
    too: :func:`dgl_exact.pyg.pyg_code`); returns the converted modules that take a ``compression``."""
    conversions = {**_conversions(), **(pyg.CONVERSIONS if pyg is not None else {})}
    converted = []
    for name, module in list(model.named_modules()):
        target = conversions.get(type(module))
        if target is None:
            continue
        old = f"{type(module).__module__.split('.')[0]}.{type(module).__name__}"  # before the class changes
        module.__class__ = target
        if hasattr(target, "_init_compression"):
            module.compression = None
            converted.append(module)
        result.converted[name] = f"{old} -> dgl_exact.{target.__name__}"
        setting = pyg.pyg_code(module) if pyg is not None else None
        if setting is not None:
            result.converted[name] += f" ({setting}: runs PyG's code, what it saves compressed by compress_saved)"
    return converted


# --- the model's configuration: a scope around its forward ------------------------------------------------
#: the model's own configuration (None: it follows the configuration in force where it is called)
MODEL_CONFIG = "_dgl_exact_model_config"
#: whether its training forwards run inside compress_saved (saved_tensors=True)
_SAVED_TENSORS = "_dgl_exact_saved_tensors"
#: the configuration of those saved-tensor hooks (the model's unless changed)
_SAVED_CONFIG = "_compress_saved_config"
#: on a dgl_exact module: the ``compression`` a model's configuration set there (the user's own, if it differs)
_FROM_MODEL = "_dgl_exact_compression_from_model"

# (model, ExitStack) of the converted models whose forward is running in this context, innermost last
_running: contextvars.ContextVar = contextvars.ContextVar("dgl_exact_model_scopes", default=())


def _enter_model_scope(module: nn.Module, args) -> None:
    """Forward pre-hook of a converted model: its forward runs inside ``dgl_exact.config(<its config>)``
    (when it has one; a nested converted model's scope is entered inside, so its own wins there), inside
    :func:`dgl_exact.ops.message_passing` where DGL is loaded (DGL's built-in message passing on dgl_exact's
    ops) and, for a
    training forward with ``saved_tensors=True``, inside ``compress_saved``. Closed by :func:`_leave_model_scope`."""
    from ..saved_tensors import compress_saved

    if compiling():  # dynamo cannot trace a ContextVar: the modules' own ``compression`` holds while compiling
        return
    stack = contextlib.ExitStack()
    try:
        cfg = getattr(module, MODEL_CONFIG, None)
        if cfg is not None:
            stack.enter_context(config_scope(cfg))
        if _dgl_loaded():  # (DGL's message passing exists only then)
            stack.enter_context(message_passing())
        stack.enter_context(functional_ops())
        if getattr(module, _SAVED_TENSORS, False) and module.training and torch.is_grad_enabled():
            stack.enter_context(compress_saved(getattr(module, _SAVED_CONFIG, cfg), model=module))
    except BaseException:
        stack.close()
        raise
    _running.set(_running.get() + ((module, stack),))


def _leave_model_scope(module: nn.Module, args, output) -> None:
    """Forward hook (also called when the forward raises): closes the scope :func:`_enter_model_scope` opened."""
    if compiling():
        return
    running = _running.get()
    if running and running[-1][0] is module:
        _running.set(running[:-1])
        running[-1][1].close()


# hooks_present (nn/_base.py) ignores these: they observe no input or output, so fused paths stay allowed
_enter_model_scope.dgl_exact_scope_hook = True
_leave_model_scope.dgl_exact_scope_hook = True


def _install_model_scope(model: nn.Module) -> None:
    if any(h is _enter_model_scope for h in model._forward_pre_hooks.values()):
        return  # (a copy of a converted model has them too: the hooks dict is copied with it)
    # prepended: no other pre-hook runs (and may raise) before the scope is entered, so the always-called
    # forward hook closes exactly what was entered
    model.register_forward_pre_hook(_enter_model_scope, prepend=True)
    model.register_forward_hook(_leave_model_scope, always_call=True)


def _own_modules(model: nn.Module):
    """``model`` and its submodules, less those inside a nested model with a configuration of its own."""
    yield model
    for child in model.children():
        if getattr(child, MODEL_CONFIG, None) is None:
            yield from _own_modules(child)


def _apply_model_config(model: nn.Module, cfg: Optional[CompressionConfig], converted=()) -> None:
    """Give ``model`` the configuration ``cfg``: its forward runs in a scope of it, and its dgl_exact modules
    (those just ``converted``, and any whose ``compression`` is None or came from a model) take it as their
    ``compression``; modules inside a nested model with its own configuration keep theirs."""
    setattr(model, MODEL_CONFIG, cfg)
    setattr(model, _SAVED_CONFIG, cfg)
    converted = {id(m) for m in converted}
    for module in _own_modules(model):
        if not hasattr(type(module), "_init_compression"):
            continue
        from_model = getattr(module, _FROM_MODEL, None)
        if id(module) in converted or module.compression is None or (
                from_model is not None and module.compression is from_model):
            module.compression = cfg
            setattr(module, _FROM_MODEL, cfg)
    _install_model_scope(model)


def set_model_config(model: nn.Module, config: Optional[CompressionConfig] = None, **changes) -> None:
    """Set the configuration of a model converted by :func:`compress_model` (or give any model one): every
    compressed op in its forward runs at it (its dgl_exact modules, ``dgl_exact.ops`` calls in a custom
    ``forward``, message passing, the saved-tensor hooks of ``saved_tensors=True``); a nested model with its
    own configuration keeps it. ``set_model_config(model, cfg)``, ``set_model_config(model, bits=2)`` (changes
    to the model's configuration, else to the one in force), ``set_model_config(model, None)``: follow the
    configuration in force again. Modules given a ``compression`` by the user keep it."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"set_model_config expects a torch.nn.Module, got {type(model).__name__}")
    if config is not None and not isinstance(config, CompressionConfig):
        raise TypeError(f"config must be a dgl_exact.CompressionConfig or None, got {type(config).__name__}")
    if changes:
        base = config or getattr(model, MODEL_CONFIG, None) or get_config()
        config = base.replace(**changes)
    _apply_model_config(model, config)


def get_model_config(model: nn.Module) -> Optional[CompressionConfig]:
    """The configuration set on ``model`` by :func:`compress_model` or :func:`set_model_config` (None: it
    follows the configuration in force)."""
    return getattr(model, MODEL_CONFIG, None)


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
