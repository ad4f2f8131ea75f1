"""Double backward (``torch.autograd.grad(..., create_graph=True)`` and then a backward through that
gradient, e.g. a gradient penalty): inside a ``backward``, ``torch.is_grad_enabled()`` is True exactly
when the caller asked for ``create_graph=True`` (:func:`create_graph_requested`). Tensors kept exactly
are the op's own inputs/outputs (never detached copies), so a backward written with differentiable torch
ops is exact to any order; a compressed copy is not the tensor autograd knows, so the ops raise
(:func:`check_double_backward`) instead of returning a gradient that silently misses terms."""
from __future__ import annotations

import torch

from .keep import Kept

__all__ = ["DOUBLE_BACKWARD_MESSAGE", "double_backward", "refuse_double_backward", "create_graph_requested",
           "check_double_backward", "recompute_vjp"]


DOUBLE_BACKWARD_MESSAGE = (
    "dgl_exact.{op}: double backward (torch.autograd.grad(..., create_graph=True) followed by a backward "
    "through that gradient, e.g. a gradient penalty) is not supported through compressed activations: the "
    "compressed copy is not differentiable. Run the forward with compression off for the modules involved: "
    "`with dgl_exact.config(enabled=False): out = model(g, x)`, or per module "
    "`module.compression = dgl_exact.CompressionConfig(enabled=False)`, with kept_frac=1.0 (a random projection "
    "is not exact either; modules in eval() mode compress nothing); double backward is then exact.")


def create_graph_requested() -> bool:
    """Inside an autograd Function's ``backward``: whether the caller asked for ``create_graph=True``
    (autograd runs backward with grad mode on exactly then), i.e. the gradient itself must be
    differentiable."""
    return torch.is_grad_enabled()


def check_double_backward(op: str, *items: Kept) -> None:
    """RuntimeError (saying how to turn compression off) if any kept item is not kept exactly (compressed, or
    kept through the op that made it: :class:`~.derived.LinearOf`, :class:`~.derived.ElementwiseOf`)."""
    if any(item is not None and not isinstance(item, torch.Tensor) for item in items):
        raise RuntimeError(DOUBLE_BACKWARD_MESSAGE.format(op=op))


def recompute_vjp(fn, inputs, needs, grads) -> list:
    """Differentiable vector-Jacobian product for double backward: re-runs ``fn(*inputs)`` (a pure torch
    version of an op's forward, returning a tensor or a tuple) on the exactly kept ``inputs`` and returns,
    for each input with ``needs[i]``, the gradient for output gradients ``grads`` (None entries: that
    output has no gradient) as a graph (``create_graph=True``); None elsewhere."""
    with torch.enable_grad():
        outs = fn(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        wanted = [t for t, n in zip(inputs, needs) if n and t is not None]
        got = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], create_graph=True,
                                       allow_unused=True) if pairs and wanted else [None] * len(wanted))
    result = []
    for t, n in zip(inputs, needs):
        if not n or t is None:
            result.append(None)
            continue
        g = next(got)
        result.append(torch.zeros_like(t) if g is None else g)
    return result


def double_backward(op: str, *kept: Kept) -> bool:
    """In a Function's ``backward``: whether the gradient must be differentiable (the caller asked for
    ``create_graph=True``, :func:`create_graph_requested`), having checked that it can be: raises
    (:data:`DOUBLE_BACKWARD_MESSAGE`, naming ``op``) where any of the ``kept`` items is compressed. The one
    test a backward with a differentiable path makes: ``if double_backward("linear", x_s): ...``."""
    if not create_graph_requested():
        return False
    check_double_backward(op, *kept)
    return True


def refuse_double_backward(op: str, message: str = DOUBLE_BACKWARD_MESSAGE) -> None:
    """In a Function's ``backward`` whose gradient is not differentiable (fused kernels, in-place buffers,
    recomputation): raises ``message`` (naming ``op``) where the caller asked for ``create_graph=True``, instead
    of returning a gradient whose own gradient would silently miss terms."""
    if create_graph_requested():
        raise RuntimeError(message.format(op=op))
