"""Shared plumbing of dgl_exact's modules: per-module compression config and activation mapping."""
from __future__ import annotations

import functools
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import ops
from .._compat import compiling
from .._docs import doc_filler
from ..compression_config import CompressionConfig, ConfiguredModule

#: the docstring text the modules share, written once: a line of a docstring that is only ``%(name)s`` becomes
#: the entry ``name`` (at that line's indentation) when the class or function is decorated with :func:`shared_doc`
DOC_FRAGMENTS = {
    "compression": """compression : CompressionConfig, optional
    This module's compression; default: the configuration in force.""",
    "example_imports": """>>> import torch, dgl_exact, dgl  # dgl_exact first: it makes DGL importable on new torch""",
    "graph": """graph : DGLGraph
    The graph (or a block, or a bipartite graph).""",
}

#: fills a docstring from :data:`DOC_FRAGMENTS` (:func:`dgl_exact._docs.doc_filler`); returns the object
shared_doc = doc_filler(DOC_FRAGMENTS)


def forward_doc(summary: str, kept: str, x: str = "Input of any shape.", out: str = "Output of the shape of ``x``."):
    """Decorator giving a one-input module's ``forward`` its docstring, in the one shape they all share:
    ``summary``; the input ``x`` and the output, described by ``x`` and ``out``; what is kept for backward."""
    def decorate(forward):
        forward.__doc__ = (f"{summary}\n\nParameters\n----------\nx : torch.Tensor\n    {x}\n\nReturns\n-------\n"
                           f"torch.Tensor\n    {out}\n\nKept for backward: {kept}\n")
        return forward
    return decorate


class Dropout(nn.Dropout):
    """Dropout keeping nothing: backward regenerates the mask from its seed. With compression off, the mask
    is torch's own (the same outputs, gradients and generator state as :class:`torch.nn.Dropout` under the
    same seed; backward replays torch's generator); with compression on, it comes from the kernels' RNG
    (reproducible under ``torch.manual_seed``, not torch's masks). (Public as :class:`dgl_exact.nn.Dropout`;
    defined here because :func:`apply_dropout` recognises it.)"""

    @forward_doc(r"Zero each element with probability ``p`` and scale the rest by :math:`1 / (1 - p)` (training "
                 "mode only).", "nothing: the backward regenerates the mask from its seed (or, compression off, from "
                 "torch's generator state).")
    def forward(self, x):
        return ops.dropout(x, self.p, self.training, like_torch=True)


class CompressedModuleMixin(ConfiguredModule):
    """``compression``: a :class:`CompressionConfig` for this module, or None to follow the configuration
    in force (``dgl_exact.config(...)`` scopes, then ``dgl_exact.set_config``). Modules in ``eval()``
    mode compress nothing.

    Also what a model may ask any dgl_exact module (the protocol :mod:`dgl_exact.training.models` uses, with
    defaults a module overrides where it has more to say): :meth:`input_compression`,
    :meth:`forward_bn_relu_dropout`."""

    def input_compression(self, graph, feat) -> Optional[CompressionConfig]:
        """The configuration under which this module's forward on ``graph`` keeps ``feat`` itself (the very
        tensor) for backward, compressed; None where it does not, or not knowably. A producer of ``feat`` may then make
        the compressed copy in its own pass (``ops.relu_dropout(..., compress_for=...)``)."""
        return None

    def forward_bn_relu_dropout(self, graph, feat, bn: nn.Module, p: float, *,
                                compress_for: Optional[CompressionConfig] = None) -> Optional[torch.Tensor]:
        """``dropout(relu(bn(self(graph, feat))), p)`` as one fused op where this module has such a path and
        it applies (:mod:`dgl_exact.nn.fastpaths`; ``compress_for``: how the next module keeps the output);
        None, before anything is computed, where the caller must call the modules. The default: no fused form."""
        return None


def hooks_present(*modules: nn.Module) -> bool:
    """Whether any hook is registered on any of ``modules`` (forward, forward-pre, backward, backward-pre) or
    globally: a hook sees a module's own call (its inputs, outputs and gradients), so a fused path or an
    input released early would change what it sees. Fast paths run only where this is False."""
    from torch.nn.modules import module as _module

    if any(_observing(m._forward_hooks) or _observing(m._forward_pre_hooks) or m._backward_hooks
           or m._backward_pre_hooks for m in modules):
        return True
    return any(getattr(_module, name, None) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks"))


def _observing(hooks) -> bool:
    """Whether ``hooks`` hold a hook other than the configuration scope of a converted model (``compress_model``
    marks its pair ``dgl_exact_scope_hook``: they see no input or output)."""
    return any(not getattr(h, "dgl_exact_scope_hook", False) for h in hooks.values())


def compressed_activation(act: Optional[Callable], config: Optional[CompressionConfig] = None) -> Optional[Callable]:
    """Map standard activations to their dgl_exact versions (1 bit kept instead of a full tensor).
    ``config``: the calling module's compression (ELU keeps its output compressed with it)."""
    if act is None:
        return None
    if act in (F.relu, torch.relu) or isinstance(act, nn.ReLU):
        return ops.relu
    if act is F.elu or isinstance(act, nn.ELU):
        alpha = act.alpha if isinstance(act, nn.ELU) else 1.0
        return functools.partial(ops.elu, alpha=alpha, config=config)
    if act is F.leaky_relu or isinstance(act, nn.LeakyReLU):
        slope = act.negative_slope if isinstance(act, nn.LeakyReLU) else 0.01
        return functools.partial(ops.leaky_relu, negative_slope=slope)
    if act is F.gelu or type(act) is nn.GELU:  # exact types: a subclass's forward may differ
        approximate = act.approximate if isinstance(act, nn.GELU) else "none"
        return functools.partial(ops.gelu, approximate=approximate, config=config)
    if act is F.silu or type(act) is nn.SiLU:
        return functools.partial(ops.silu, config=config)
    return act


def apply_linear(layer: nn.Module, x: torch.Tensor, config: CompressionConfig) -> torch.Tensor:
    """``layer(x)``: a plain :class:`torch.nn.Linear` (its own ``forward``) runs as :func:`ops.linear`
    keeping its input compressed; any other module a user put in its place (``nn.Sequential``, a LoRA
    wrapper, ``nn.Identity``, ...) is simply called, as DGL would."""
    if plain_linear(layer, config):
        return ops.linear(x, layer.weight, layer.bias, config)
    return layer(x)


def plain_linear(layer: nn.Module, config: CompressionConfig) -> bool:
    """Whether calling ``layer(x)`` computes exactly ``ops.linear(x, layer.weight, layer.bias, config)``
    (``config``: the calling module's), so that the caller may run that op itself, or fuse it:

    * a :class:`torch.nn.Linear` running its own ``forward`` (it keeps nothing of its own choosing: the
      calling module's configuration applies, as for DGL's submodules), or dgl_exact's :class:`Linear`
      (what :func:`dgl_exact.compress_model` makes of one) whose own configuration resolves to ``config``;
    * with no hook on it, nor a global one: a hook sees the submodule's own call.

    :func:`apply_linear` then returns a fresh tensor the caller owns."""
    if not isinstance(layer, nn.Linear) or hooks_present(layer):
        return False
    forward = type(layer).forward
    if forward is nn.Linear.forward:
        return True
    return forward in _LINEAR_OP_FORWARDS and layer._config() == config


# forwards that compute ``ops.linear(x, self.weight, self.bias, self._config())`` and nothing else: dgl_exact's
# Linear registers its own (nn/layers.py sits above this module)
_LINEAR_OP_FORWARDS: set = set()


def register_linear_forward(forward: Callable) -> Callable:
    """Declare that a module class's ``forward`` computes exactly ``ops.linear(x, self.weight, self.bias,
    self._config())`` (see :func:`plain_linear`). Returns ``forward``."""
    _LINEAR_OP_FORWARDS.add(forward)
    return forward


def into(buf: torch.Tensor, op: str, other) -> torch.Tensor:
    """``buf <op> other`` (``op``: 'add' or 'mul') written into ``buf``, which the caller owns (rule 2 of
    :mod:`dgl_exact.ops.keep`: the caller's forward allocated it through an op that keeps no reference to
    its output, and nothing else reads it; the caller states it by calling ``into``), where the result has
    ``buf``'s dtype and shape; else out of place. Same values as the out-of-place op (same operands, same
    order): an in-place elementwise op saves nothing autograd did not save for the out-of-place one (a
    scalar or a tensor factor that needs no gradient), so gradients are unchanged too. Cuts one
    layer-sized buffer per op."""
    if compiling():  # the compiler plans buffers itself (and dynamo cannot trace torch.result_type)
        return torch.add(buf, other) if op == "add" else torch.mul(buf, other)
    if isinstance(other, torch.Tensor):
        fits = torch.result_type(buf, other) == buf.dtype and _broadcasts_into(other.shape, buf.shape)
    else:
        fits = torch.result_type(buf, other) == buf.dtype
    if not fits or buf._base is not None:  # torch refuses in-place ops on views of a custom Function's output
        return torch.add(buf, other) if op == "add" else torch.mul(buf, other)
    return buf.add_(other) if op == "add" else buf.mul_(other)


def _broadcasts_into(shape, target) -> bool:
    """Whether ``shape`` broadcasts to exactly ``target`` (``torch.broadcast_shapes`` would import sympy
    through torch._refs on its first call: tens of MiB of resident memory for a shape check)."""
    return len(shape) <= len(target) and all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def kept_by_reference(x: torch.Tensor, config: CompressionConfig) -> bool:
    """Whether an op that keeps ``x`` for backward would keep ``x`` itself (not a compressed or projected
    copy): then ``x`` must not be overwritten afterwards. Mirrors :func:`dgl_exact.ops.keep.as_kept`."""
    from ..ops.keep import alive_anyway

    return torch.is_grad_enabled() and ((not config.enabled and config.kept_frac >= 1.0) or alive_anyway(x))


def apply_dropout(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``: a plain :class:`torch.nn.Dropout` runs as :func:`ops.dropout` (no mask kept; in the
    module's own train/eval mode, as calling it would); any replacement (``nn.Identity()``, another
    regulariser) is simply called, as DGL would."""
    if _plain_dropout(module):
        return ops.dropout(x, module.p, module.training, like_torch=True)
    return module(x)


def plain_dropout_p(module: nn.Module) -> Optional[float]:
    """The probability of a plain :class:`torch.nn.Dropout` (0 for ``nn.Identity`` or a dropout in eval
    mode); None for any other module (the caller cannot fuse it and must apply it as is)."""
    if isinstance(module, nn.Identity) and not hooks_present(module):
        return 0.0
    if _plain_dropout(module):
        return float(module.p) if module.training else 0.0
    return None


def _plain_dropout(module: nn.Module) -> bool:
    """A :class:`torch.nn.Dropout` (or dgl_exact's) running its own ``forward``, without hooks (a hook sees
    the submodule's own call, which the caller would otherwise replace by the op)."""
    return (isinstance(module, nn.Dropout) and type(module).forward in (nn.Dropout.forward, Dropout.forward)
            and not hooks_present(module))


def check_feature_rows(st, feat_src) -> None:
    """ValueError naming the node count when the features do not have one row per source node (before an
    elementwise degree normalisation would fail with a bare broadcasting error)."""
    from ..ops.graph import check_nodes

    check_nodes(st, feat_src, "src")


def check_zero_in_degree(module, st) -> None:
    if not module._allow_zero_in_degree and st.has_zero_in_degree:
        from dgl import DGLError

        raise DGLError(
            "There are 0-in-degree nodes in the graph, "
            "output for those nodes will be invalid. "
            "This is harmful for some applications, "
            "causing silent performance regression. "
            "Adding self-loop on the input graph by "
            "calling `g = dgl.add_self_loop(g)` will resolve "
            "the issue. Setting ``allow_zero_in_degree`` "
            "to be `True` when constructing this module will "
            "suppress the check and let the code run."
        )
