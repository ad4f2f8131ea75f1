"""torch's functional activations and dropout on dgl_exact's ops, inside a scope.

``with dgl_exact.ops.functional_ops(): ...`` (entered around the forward of every model converted by
:func:`dgl_exact.compress_model`) makes the functional forms of the modules ``compress_model`` converts run
the ops their converted modules run, wherever the forward calls them (the user's ``forward``, an activation
passed as an argument, a DGL or PyG layer's own code):

==========================================================  ===============================================
called                                                      runs (kept for backward)
==========================================================  ===============================================
``F.relu``, ``torch.relu``, ``Tensor.relu``                 :func:`~dgl_exact.ops.relu` (1 bit)
``F.leaky_relu`` (``negative_slope >= 0``)                  :func:`~dgl_exact.ops.leaky_relu` (1 bit)
``F.elu``                                                   :func:`~dgl_exact.ops.elu` (1 bit, output compressed)
``F.gelu``, ``F.silu``                                      :func:`~dgl_exact.ops.gelu`, :func:`~dgl_exact.ops.silu`
                                                            (the derivative, compressed)
``F.dropout``, ``torch.dropout``                            :func:`~dgl_exact.ops.dropout` (a seed; with
                                                            compression off torch's own mask)
==========================================================  ===============================================

Outputs are the same values torch computes (dropout: the same mask with compression off, dgl_exact's kernel's
with it on, as a converted ``nn.Dropout``); gradients are exact for ``relu``, ``leaky_relu`` and dropout (an
exact mask) and unbiased for ``elu``, ``gelu`` and ``silu`` (their backward is linear in what they keep
compressed), at the configuration in force (a converted model's own). In-place calls (``inplace=True``,
``relu_``), tensor subclasses and calls with other arguments run as torch runs them; so does everything
outside the scope, and inside ``functional_ops(False)``.

How: the entries below are routes of :mod:`.torch_routes`' one torch-function mode, pushed on entering the
outermost scope of a thread, which sees each outermost torch call (what the routed op calls inside is not seen
again).
"""
from __future__ import annotations

import contextlib
import contextvars
from functools import partial
from typing import Iterator

import torch
import torch.nn.functional as F

from .blocks import gelu, silu
from .elementwise import dropout, elu, leaky_relu, relu
from .torch_routes import route, scope

__all__ = ["functional_ops", "functional_ops_active"]

_active: contextvars.ContextVar = contextvars.ContextVar("dgl_exact_functional_ops", default=False)
#: a route's answer "run as torch runs it"
_AS_TORCH = None


def functional_ops_active() -> bool:
    """Whether torch's functional activations and dropout run on dgl_exact's ops in the current context."""
    return _active.get()


# each takes the torch callable's arguments and returns the routed call (a partial: no frame of its own, so the
# census names the op), or _AS_TORCH; a TypeError here means arguments it does not take: torch runs the call
def _relu(input, inplace=False):
    return _AS_TORCH if inplace else partial(relu, input)


def _leaky_relu(input, negative_slope=0.01, inplace=False):
    return _AS_TORCH if inplace or negative_slope < 0 else partial(leaky_relu, input, float(negative_slope))


def _elu(input, alpha=1.0, inplace=False):
    return _AS_TORCH if inplace else partial(elu, input, float(alpha))


def _gelu(input, approximate="none"):
    return partial(gelu, input, approximate)


def _silu(input, inplace=False):
    return _AS_TORCH if inplace else partial(silu, input)


def _dropout(input, p=0.5, training=True, inplace=False):
    return _AS_TORCH if inplace else partial(dropout, input, float(p), bool(training), like_torch=True)


def _torch_dropout(input, p, train):
    return partial(dropout, input, float(p), bool(train), like_torch=True)


def _plain_float(x) -> bool:
    return type(x) in (torch.Tensor, torch.nn.Parameter) and x.is_floating_point() and x.dim() > 0


def _on_plain_floats(form):
    """The route of a call whose routed form is ``form``: taken for a plain floating tensor as first argument
    (a tensor subclass, which may override torch functions, is left to torch) and arguments ``form`` takes."""

    def how(args, kwargs):
        if not (args and _plain_float(args[0])):
            return _AS_TORCH
        try:
            return form(*args, **kwargs)
        except TypeError:  # arguments the routed form does not take: torch decides
            return _AS_TORCH

    return how


#: torch callable -> its routed form, which takes the callable's arguments
_FORMS = {F.relu: _relu, torch.relu: _relu, torch.Tensor.relu: _relu, F.leaky_relu: _leaky_relu, F.elu: _elu,
          F.gelu: _gelu, F.silu: _silu, F.dropout: _dropout, torch.dropout: _torch_dropout}
route(_active, {func: _on_plain_floats(form) for func, form in _FORMS.items()})


@contextlib.contextmanager
def functional_ops(enabled: bool = True) -> Iterator[None]:
    """Run torch's functional activations and dropout on dgl_exact's ops inside this block (see the module
    doc); nestable, local to the current thread or asyncio task. ``enabled=False``: torch's own inside it."""
    if not isinstance(enabled, bool):
        raise TypeError(f"functional_ops(enabled) takes True or False, got {enabled!r}")
    with scope(_active, enabled):
        yield
