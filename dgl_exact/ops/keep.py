"""What dgl_exact's ops keep for backward, and who may overwrite or free a tensor: the ownership rules.

Every op and module of dgl_exact follows these rules; code that relies on one cites it ("rule 2"). They
are decided from what a call can see (a tensor's autograd history and class, the op's own allocations,
the caller's explicit words), never from reference counts or from how a caller holds its variables.

1. **Keeping.** An op keeps what its backward reads either as the tensor itself (by reference) or as a
   compressed copy (:func:`as_kept`). By reference: a tensor without autograd history (``grad_fn`` None:
   input features, parameters, constants), which is alive anyway, unless a dgl_exact op produced it
   without autograd (:func:`fresh_outputs`, recorded in a weak registry: nobody else is known to keep it)
   or it was donated (rule 5); and anything while compression is off (without projection), as plain
   autograd keeps it. Otherwise a :class:`~dgl_exact.compression.CompressedTensor`.
2. **Overwriting.** An op may write into a tensor's storage only if it allocated that storage itself
   within the same autograd region (the same Function's forward, or its backward, or a fused region
   that runs several layers as one Function: :func:`dgl_exact.ops.gcn2.gcnii_layers`), or the caller
   handed it over explicitly: by calling an op documented to reuse its input (``ops.linear_reusing``:
   "I allocated this in my forward and nothing reads it afterwards"), or by donation (rule 5). Data
   (rule 1's "alive anyway") is never written. An incoming gradient in a Function's backward is never
   written: autograd may share it (accumulation, hooks, ``retain_graph``); a fused region forms its
   own buffer from it instead.
3. **Kept, then overwritten.** An op that writes into a buffer after keeping it says so
   (``as_kept(..., overwritten=True)``): where the buffer would be kept exactly (compression off, a
   planner's fp32 choice), a copy is kept.
4. **Version counters stay honest.** Writes into a tensor autograd knows go through ``mark_dirty`` or
   in-place torch ops, so that a reference autograd saved elsewhere raises torch's "modified by an
   inplace operation" error instead of computing with changed values.
5. **Donation.** ``h = conv(g, dgl_exact.donate(h))`` gives ``h`` up: nothing reads it after the call, by
   any name. The callee may then :func:`~.donation.release` it (its memory goes back, any later use raises) once
   it has kept what its backward needs compressed, instead of when the call returns. Donation is a
   permission, never a request: the callee releases only where that cannot change what is computed or
   seen (rule 7). A donated tensor is compressed where rule 1 would keep data by reference.
6. **One compressed copy per tensor: shared, and offered.** The first op that keeps ``x`` compressed under a
   configuration registers its copy (:func:`default_keep`); every later op that keeps the same ``x`` (identity
   and version counter) under an equal configuration within the copy's life takes that copy instead of
   compressing ``x`` again. An op that produced ``x`` may also offer a compressed copy of it
   (:func:`offer_compressed`): the first keeper takes it, and it is shared from then on. Both registries are
   weakly keyed by ``x`` (an entry dies with it); a registered copy is held only through weak references, so
   nothing keeps it alive but the autograd nodes (or rule 8's private holders) that keep it; an unclaimed offer
   is held until ``x`` dies. Shared: only tensors with autograd history (``grad_fn``: rule 4 makes their version
   counters honest), never while compiling or inside a captured op, never for a keeper that writes into ``x``
   afterwards (rule 3, which also withdraws ``x``'s copies). **Never on one backward path**: a keeper whose op
   also reads a tensor computed from ``x`` (the edge weights beside ``ft`` in ``update_all(fn.u_mul_e)``, whose
   scores came from ``ft``) gets a copy of its own, as does an op that asks for one
   (``as_kept(..., independent=True)``): there a gradient formed from one decode of ``x`` is multiplied by
   another, which is unbiased only if the two are independent draws. Where shared, each consumer's gradient
   stays unbiased (one draw, each decode unbiased) and so does their sum, but their quantization noise is now
   correlated: the summed gradient's added variance is at most ``(sum of the consumers' noise std)**2`` instead
   of the sum of their variances (at most ``k`` times as large for ``k`` consumers).
7. **Fast paths never change what a model computes.** A fused or in-place path runs only where it is
   provably equivalent to the composed modules: training mode with grad, no forward, forward-pre,
   backward or backward-pre hook on the modules involved nor a global one
   (:func:`dgl_exact.nn._base.hooks_present`), no subclass overriding ``forward``, more than one row
   under batch norm, outside torch.compile and autocast where the path does not cover them. Where double
   backward would not be exact, the backward raises (:data:`.double_backward.DOUBLE_BACKWARD_MESSAGE`). Otherwise the
   composed path runs; :func:`dgl_exact.explain` says which ran and why.
8. **Held privately, dropped early.** A Function whose backward loops over several layers (a fused region,
   rule 2) may hold what its forward allocated for one layer's backward and never returned (compressed
   copies of its own working buffer, copies of it, the dropout masks it drew) as a reference on ``ctx``
   instead of through ``ctx.save_for_backward``, and drop that reference as soon as the layer's backward
   step has run, instead of when the whole backward returns. Only where both hold: in the forward, no
   saved-tensor hooks are in force (:func:`~.saved.private_keeping_allowed`: hooks such as CPU offloading must see
   everything kept, so then everything goes through ``save_for_backward``; nor while compiling or inside a
   captured op), except a hook that only looks (:func:`~.saved.observe_saved`, the memory meter's): it changes
   nothing kept, so rule 8 stays in force under it and the Function shows it what it holds privately
   (:func:`~.saved.show_private`), and a measured step runs as it does in training; in the backward, autograd
   frees the graph after this pass (:func:`~.saved.graph_freed_after_backward`: not ``retain_graph``; where torch
   cannot say, nothing is dropped).
   Dropping a reference frees nothing that anybody else holds; tensors the op did not allocate (inputs,
   parameters, running statistics) always go through ``save_for_backward``. A second backward through a
   region that dropped its references raises torch's "backward through the graph a second time" error.
9. **Gradients returned own their storage.** Autograd sums the gradients of a tensor several ops read in place
   into the first one that arrives, but only where torch sees that nothing else holds it: not a view (which
   holds its base), and a storage whose Python object was never created (``Tensor.untyped_storage()`` creates
   one that lives as long as the storage and counts as a holder). Otherwise each sum is a new buffer of the
   tensor's size beside the two it adds. So every autograd Function subclasses :class:`.function.Function`,
   whose ``backward`` returns a view as ``view.detach()`` (except for ``create_graph``); op code asks where a
   storage begins with :func:`dgl_exact._compat.storage_ptr`, never ``untyped_storage()``; and DGL's kernels
   are given their output buffers without DGL's wrapper, which calls it (:mod:`dgl_exact.kernels.dgl_graph`).
10. **Kept through the linear that made it.** An op whose backward is linear in a kept ``y`` (an elementwise
   product's operand, a linear's input, the features of ``u_mul_e_sum``: ``as_kept(y, cfg, via_linear=True)``)
   keeps ``y = x W^T + b``, the output of a dgl_exact linear (or a view of all of it, rows first), as
   :class:`~.derived.LinearOf`: the linear's own kept ``x`` (its compressed copy, or ``x`` itself where that is
   data, or rule 11's and 12's :class:`~.derived.ElementwiseOf`), ``W`` and ``b``, decoded as
   ``x_hat W^T + b`` (row chunk by row chunk) instead of a compressed copy of ``y`` of its own. Unbiased as a
   copy of ``y`` is (``E[x_hat] W^T + b = y``), and it costs no bytes beyond the linear's own copy. It shares
   that copy's draw, so rule 6's condition applies to ``x``: taken only where none of the op's other inputs was
   computed from ``x`` (or from ``y``, where ``x`` has no autograd history), unless the op forms from the
   decode only gradients of parameters (``leaf_grads``: ``gat_attention``'s second copy of its features, for
   the attention vectors, independent of its first copy); with an equal configuration, ``y`` unchanged since
   the linear (version counter), outside autocast, compiling and captured ops. A keep hook (:func:`keep_hook`,
   the planner's) is not asked for such a keep: it costs nothing and has nothing to choose, and the decision
   does not depend on the hook's choices (the linear's copy is kept as the hook chose it), so a plan numbers
   its slots alike in the run it was recorded from and in the runs it governs. On DGL's arxiv GAT example
   written with the message-passing API, the attention vectors' products (``(ft * attn_l).sum(-1)``) keep
   ``fc``'s copy of its input instead of a copy of ``ft`` each layer. Where the linear's ``x`` is kept exactly
   (data, or rule 11), so is ``y``: no draw is shared, and none of these conditions but the version applies.
11. **Kept through a dropout of data.** dgl_exact's dropout of data (rule 1's "alive anyway": input
   features, whose input dropout every GNN example applies) records its output; an op asking for a derived
   item (``via_linear=True``, rule 10's callers) keeps that output as an :class:`~.derived.ElementwiseOf` of the
   data: the data itself (by reference, through ``save_for_backward``: torch's version check applies) and the
   mask's seed, decoded exactly (the kernels' counter-based mask, regenerated from any element on: row chunks
   too). No bytes, no noise. Taken where compression is on, neither the output nor the data changed in place
   since the dropout (version counters), and outside compiling and captured ops; a dropout of a temporary
   (rule 1's fresh outputs) is kept as before. On DGL's arxiv GAT example, the first layer's ``fc`` and
   ``res_fc`` then keep nothing of their own, and the aggregation keeps ``ft`` as an exact
   :class:`~.derived.LinearOf` (rule 10, its last sentence) instead of an independent copy.
12. **Kept through batch norm, activations and dropout.** dgl_exact's batch norm records its output as its
   compressed copy of its input with a per-channel scale and shift (``[N, C]`` input; batch statistics in
   training, running ones in evaluation); ReLU, leaky ReLU, the fused ReLU-dropout (without an offered copy)
   and dropout extend a recorded input's recipe by their step: their one-bit mask (the one they keep for their
   own backward, held weakly until asked for) or their seed. An op asking for a derived item keeps such an
   output as an :class:`~.derived.ElementwiseOf`: no bytes beyond the batch norm's copy and the activations'
   masks. Unbiased: each step is affine in its input given its mask, and the masks are exact (``E`` of the
   decode is the output). It shares the batch norm's draw, so rule 6's condition applies to the batch norm's
   input, as rule 10's does to a linear's; and the configurations must be equal, and no tensor of the chain
   changed in place between its steps (version counters). On DGL's arxiv GAT example (``h = norm(h);
   h = F.relu(h); h = dropout(h)`` as statements), the second layer's ``fc``, ``res_fc`` and score products keep
   no copy of ``h``: with rule 11, 2.52x below DGL fp32's step peak instead of 2.44x.

The rest of what the ops share lives beside this file, one job per module: :mod:`.saved` (how kept items
pass through ``ctx.save_for_backward``, rule 8's private holding and the observers), :mod:`.chunks` (row
chunks of a kept item in a backward, the chunk size), :mod:`.donation` (rule 5's :func:`~.donation.donate`,
:func:`~.donation.release`), :mod:`.function` (rule 9's base class of every autograd Function),
:mod:`.double_backward` (rule 7's :data:`~.double_backward.DOUBLE_BACKWARD_MESSAGE`); the autocast dtype is
:func:`dgl_exact._compat.autocast_dtype`, and where a storage begins :func:`dgl_exact._compat.storage_ptr`.
"""
from __future__ import annotations

import contextlib
import contextvars
import weakref
from typing import Optional, Union

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .._compat import compiling, storage_ptr
from ..compression import CompressedTensor, compress, decompress
from ..compression_config import CompressionConfig
from ..tracing import active as tracing_active
from .donation import Donated

from .derived import Affine, Derived, Drop, ElementwiseOf, LinearOf, Mask, is_exact

Kept = Union[torch.Tensor, CompressedTensor, Derived, None]


#: tensors a dgl_exact op produced without autograd (rule 1): nobody else is known to keep them. Weakly keyed
#: by identity: an entry dies with its tensor.
_made_here = WeakIdKeyDictionary()


def alive_anyway(x: torch.Tensor) -> bool:
    """True for tensors autograd did not create (leaves: data, parameters, constants), unless a dgl_exact
    op produced them as temporaries (see :func:`fresh_outputs`) or they were donated (rule 1)."""
    if compiling():
        return captured_alive(x)
    alive = _alive_ids.get()
    if alive is not None:  # inside a captured op (ops.captured): the decision was taken at trace time
        return id(x) in alive
    return x.grad_fn is None and type(x) is not Donated and x not in _made_here


def captured_alive(x: torch.Tensor) -> bool:
    """:func:`alive_anyway` as dynamo can trace it: ``is_leaf`` (``grad_fn is None``). Provenance is not
    tracked while compiling: a temporary without autograd history is kept by reference there, unless its
    caller states that it allocated it (``captured.apply(..., owned=...)``, rule 2's statement)."""
    if compiling():
        return x.is_leaf
    return x.is_leaf and type(x) is not Donated and x not in _made_here


_alive_ids: "contextvars.ContextVar[Optional[frozenset]]" = contextvars.ContextVar("dgl_exact_alive_ids", default=None)


@contextlib.contextmanager
def alive_override(ids):
    """Within this scope :func:`alive_anyway` is True exactly for the tensors whose ``id`` is in ``ids``."""
    token = _alive_ids.set(frozenset(ids))
    try:
        yield
    finally:
        _alive_ids.reset(token)


def fresh_outputs(fn):
    """Decorator for public ops: outputs computed without autograd are temporaries nobody else keeps
    (rule 1); they are recorded so that a later op compresses rather than references them. An output
    sharing storage with an input (an op that returned its input, or a view of it) is not recorded. Not
    while compiling (see :func:`captured_alive`)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if compiling():  # nothing is shared while compiling (rule 6); dynamo cannot trace a context variable
            return fn(*args, **kwargs)
        with op_inputs(*args, *kwargs.values()):
            out = fn(*args, **kwargs)
        inputs = None
        for t in (out if isinstance(out, tuple) else (out,)):
            if isinstance(t, torch.Tensor) and t.grad_fn is None and not t.requires_grad:
                if inputs is None:
                    inputs = {storage_ptr(a) for a in (*args, *kwargs.values())
                              if isinstance(a, torch.Tensor)}
                if storage_ptr(t) not in inputs:
                    _made_here[t] = True
        return out

    return wrapper


def mark_fresh(t: torch.Tensor) -> torch.Tensor:
    """Record a temporary computed without autograd (no ``grad_fn``) as made here, as :func:`fresh_outputs`
    does for the public ops: a later op then compresses it instead of keeping it by reference. Returns
    ``t``."""
    if not compiling() and not t.requires_grad and t.grad_fn is None:
        _made_here[t] = True
    return t


#: ``fn(x, cfg, force) -> Kept`` replacing :func:`as_kept` in this context (see :func:`keep_hook`)
_keep_hook: contextvars.ContextVar = contextvars.ContextVar("dgl_exact_keep_hook", default=None)


#: whether the hook set by :func:`keep_hook` in this context may keep something else than :func:`default_keep`
_hook_chooses: contextvars.ContextVar = contextvars.ContextVar("dgl_exact_keep_hook_chooses", default=False)


@contextlib.contextmanager
def keep_hook(fn, *, records_only: bool = False):
    """Within this scope every :func:`as_kept` call is answered by ``fn(x, cfg, force)`` (``x`` not None),
    which may call :func:`default_keep` with another config. Used by :mod:`dgl_exact.planning` to record
    each kept activation and to choose a compression per kept activation. ``records_only``: ``fn`` returns
    what :func:`default_keep` returns for the same arguments (it only looks), so the ops run as without a
    hook (:func:`keep_hook_active` is False): a planner's prediction records the step a run takes."""
    tokens = (_keep_hook.set(fn), _hook_chooses.set(not records_only))
    try:
        yield fn
    finally:
        _keep_hook.reset(tokens[0])
        _hook_chooses.reset(tokens[1])


def keep_hook_active() -> bool:
    """Whether a :func:`keep_hook` that may choose what is kept answers :func:`as_kept` calls in this context
    (then ops that act on what :func:`default_keep` would keep, such as releasing a donated input once it is
    kept compressed or compressing an output for the next op, take their plain path)."""
    return _keep_hook.get() is not None and _hook_chooses.get()


def as_kept(x: Optional[torch.Tensor], cfg: CompressionConfig, force: bool = False,
            overwritten: bool = False, independent: bool = False, via_linear: bool = False,
            leaf_grads: bool = False) -> Kept:
    """Keep ``x`` for backward: by reference if it is alive anyway or compression is off, else compressed.
    ``force`` compresses even a leaf (used for per-edge tensors nobody else keeps). ``overwritten``: the
    caller writes into ``x`` afterwards (rule 3): where ``x`` would be kept exactly, a copy is kept.
    ``independent``: a compressed copy of its own (fresh noise), neither shared nor registered (rule 6): for an
    op whose backward multiplies two decodes of ``x`` (``gat_attention``'s second copy). ``via_linear``: the op's
    backward is linear in ``x``, so ``x``, where a dgl_exact linear made it, may be kept through that linear's kept
    input (rule 10: a :class:`LinearOf`). ``leaf_grads``: the op forms from this decode only gradients of
    tensors without autograd history (parameters), so rule 10 needs no condition on the op's other inputs;
    with ``independent``, a :class:`LinearOf` is a draw independent of the op's copies of ``x``."""
    if x is None:
        return None
    if via_linear:
        item = _elementwise_origin(x, cfg, leaf_grads)
        if item is None:
            item = _linear_origin(x, cfg, leaf_grads)
        if item is not None:
            if overwritten:
                withdraw(x)
            return item
    if independent and not compiling():  # (nothing is shared while compiling)
        with _no_sharing():
            return as_kept(x, cfg, force, overwritten)
    hook = _keep_hook.get()
    item = hook(x, cfg, force) if hook is not None else default_keep(x, cfg, force)
    if overwritten:
        withdraw(x)  # the caller writes into x next, perhaps without a version bump: no later keeper may share
        if isinstance(item, torch.Tensor) and _shares_storage(item, x):
            item = x.clone(memory_format=torch.contiguous_format)
    return item


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return storage_ptr(a) == storage_ptr(b)


def default_keep(x: torch.Tensor, cfg: CompressionConfig, force: bool = False) -> Kept:
    """:func:`as_kept` without the hook."""
    if (not cfg.enabled and cfg.kept_frac >= 1.0) or (alive_anyway(x) and not force):
        # the tensor itself, not a detached alias (same storage): saved through ``save_for_backward`` it
        # stays connected to its autograd history, which double backward needs
        return x
    shareable = sharing_allowed(x)  # once per keep: it walks the autograd graph
    ready = _registered_copy(x, cfg) if shareable else None
    if ready is not None:
        return ready
    ready = take_offered(x, cfg)
    c = ready if ready is not None else compress(x, cfg)
    if isinstance(c, CompressedTensor) and shareable:
        _register(x, cfg, c)
    return c


#: compressed copies kept by dgl_exact's ops, for every later keeper of the same tensor (rule 6), weakly keyed by
#: the tensor: a list of ``(cfg, version, shell, weak references to the copy's tensors)`` per tensor
_shared = WeakIdKeyDictionary()


#: the tensor arguments of the dgl_exact op running now (:func:`op_inputs`; None: not known)
_op_inputs: "contextvars.ContextVar[Optional[tuple]]" = contextvars.ContextVar("dgl_exact_op_inputs", default=None)

#: False inside :func:`_no_sharing` (``as_kept(..., independent=True)``)
_sharing: contextvars.ContextVar = contextvars.ContextVar("dgl_exact_sharing", default=True)


@contextlib.contextmanager
def op_inputs(*args):
    """Within this scope the op being run has these arguments (its tensors are what rule 6 checks: a keeper of
    ``x`` shares ``x``'s copy only where none of its other inputs was computed from ``x``). Entered by
    :func:`fresh_outputs` for every public op, and by the products route."""
    token = _op_inputs.set(tuple(a for a in args if isinstance(a, torch.Tensor)))
    try:
        yield
    finally:
        _op_inputs.reset(token)


@contextlib.contextmanager
def _no_sharing():
    token = _sharing.set(False)
    try:
        yield
    finally:
        _sharing.reset(token)


def sharing_allowed(x: torch.Tensor) -> bool:
    """Whether a compressed copy of ``x`` may be shared by its keepers (rule 6): ``x`` has autograd history
    (rule 4 keeps its version counter honest), this is not a trace (torch.compile) nor a captured op's run
    (``ops.captured``: its decisions were taken at trace time), and the op keeping it is known
    (:func:`op_inputs`) and reads nothing else computed from ``x`` (:func:`_computed_from`)."""
    if (x.grad_fn is None or not _sharing.get() or compiling() or tracing_active()
            or _alive_ids.get() is not None):
        return False
    inputs = _op_inputs.get()
    return inputs is not None and not any(t is not x and _computed_from(t, x.grad_fn) for t in inputs)


def _computed_from(t: torch.Tensor, node) -> bool:
    """Whether ``t``'s autograd history passes through ``node``. Then an op reading ``x`` (``node``'s output)
    and ``t`` may receive, in its backward, a gradient that an earlier keeper of ``x`` formed from its decode
    of ``x``: multiplied by a decode of the same copy, the product is biased (``E[x_hat x_hat^T] != x x^T``);
    an independent copy keeps it unbiased. Nodes created before ``node`` (lower sequence numbers) cannot lead
    to it and are not searched, so the search covers what was computed since ``x``."""
    if t.grad_fn is None:
        return False
    floor = node._sequence_nr()
    stack, seen = [t.grad_fn], {}
    while stack:
        n = stack.pop()
        if n is node:
            return True
        if id(n) in seen:
            continue
        seen[id(n)] = n  # held: an id is not reused while the search runs
        if n._sequence_nr() >= floor:
            stack.extend(f for f, _ in n.next_functions if f is not None)
    return False


def _register(x: torch.Tensor, cfg: CompressionConfig, c: CompressedTensor) -> None:
    shell, tensors = c.split()
    live = [e for e in _shared.get(x, ()) if e[1] == x._version and _alive(e[3]) is not None]
    live.append((cfg, x._version, shell, tuple(weakref.ref(t) for t in tensors)))
    _shared[x] = live


def _alive(refs) -> Optional[list]:
    tensors = [r() for r in refs]
    return tensors if all(t is not None for t in tensors) else None


def shared_copy(x: torch.Tensor, cfg: CompressionConfig) -> Optional[CompressedTensor]:
    """The compressed copy of ``x`` an earlier keeper registered under ``cfg`` and some autograd node still
    keeps, if ``x`` has not changed in place since (rule 6); else None."""
    return _registered_copy(x, cfg) if sharing_allowed(x) else None


def _registered_copy(x: torch.Tensor, cfg: CompressionConfig) -> Optional[CompressedTensor]:
    for entry_cfg, version, shell, refs in _shared.get(x, ()):
        if version == x._version and entry_cfg == cfg:
            tensors = _alive(refs)
            if tensors is not None:
                return shell.join(tensors)
    return None


def withdraw(x: torch.Tensor) -> None:
    """Forget the copies of ``x`` registered or offered for sharing (rule 3: its keeper writes into it next), and
    the linear that made it (rule 10)."""
    _shared.pop(x, None)
    _offers.pop(x, None)
    _linear_outputs.pop(x, None)
    _elementwise_outputs.pop(x, None)


#: rule 10: the outputs of dgl_exact's linear, weakly keyed by the output: ``(cfg, version, x's kept copy as
#: (shell or None, weak references to its tensors), weight, bias, x's autograd node)``
_linear_outputs = WeakIdKeyDictionary()


def record_linear_output(y: torch.Tensor, x: torch.Tensor, kept: Kept, weight: torch.Tensor,
                         bias: Optional[torch.Tensor], cfg: CompressionConfig) -> None:
    """Called by dgl_exact's linear in its forward: ``y = x W^T + b``, whose weight gradient keeps ``kept`` (a
    compressed copy of ``x``, or ``x`` itself where that is data), may be kept through it (rule 10). The entry
    holds the copy weakly: it dies with ``y`` or with the linear's backward."""
    if (not cfg.enabled or x.dim() < 2 or compiling() or tracing_active() or _alive_ids.get() is not None
            or weight.grad_fn is not None or (bias is not None and bias.grad_fn is not None)):
        return
    if isinstance(kept, (CompressedTensor, ElementwiseOf)):  # (not a LinearOf: its draw's root is not x's node)
        shell, tensors = kept.split()
    elif kept is x:
        shell, tensors = None, (x,)
    else:
        return
    node = kept.root_node if isinstance(kept, ElementwiseOf) and kept.root_node is not None else x.grad_fn
    _linear_outputs[y] = (cfg, y._version, shell, tuple(weakref.ref(t) for t in tensors), weight, bias, node)


def _linear_origin(y: torch.Tensor, cfg: CompressionConfig, leaf_grads: bool = False) -> Optional[LinearOf]:
    """``y`` as a :class:`LinearOf` where rule 10 allows it (see there; ``leaf_grads``: see :func:`as_kept`),
    else None."""
    if (not cfg.enabled or type(y) is not torch.Tensor or y.grad_fn is None or not _sharing.get() or compiling()
            or tracing_active() or _alive_ids.get() is not None):
        return None
    base = y if y._base is None else y._base
    entry = _linear_outputs.get(base)
    if entry is None:
        return None
    e_cfg, version, shell, refs, weight, bias, x_node = entry
    whole = (y.numel() == base.numel() and y.storage_offset() == base.storage_offset() and y.dim() > 0
             and y.shape[0] == base.shape[0] and y.is_contiguous() and base.is_contiguous())
    if e_cfg != cfg or version != y._version or not whole:
        return None
    tensors = _alive(refs)
    if tensors is None:
        return None
    item = LinearOf(tensors[0] if shell is None else shell.join(tensors), weight, bias, y.shape)
    if is_exact(item.x) or leaf_grads:
        return item  # exact: no quantization noise, nothing shared that could correlate (rule 6 needs no condition)
    # the op reads y twice or something else computed from x: a copy of y (rule 6)
    return item if _reads_nothing_else_from(y, x_node if x_node is not None else base.grad_fn) else None


#: rules 11 and 12: outputs made by elementwise ops from a kept root, weakly keyed by the output (:class:`_Recipe`)
_elementwise_outputs = WeakIdKeyDictionary()


class _Recipe:
    """How an output was made from a root (held weakly: the entry keeps nothing alive). ``steps``: ``(step,
    refs)`` pairs, ``refs`` None where the step holds its (small) tensors itself, else weak references to them."""

    __slots__ = ("version", "root_shell", "root_refs", "root_version", "steps", "node", "cfg")

    def __init__(self, version, root_shell, root_refs, root_version, steps, node, cfg):
        self.version, self.root_shell, self.root_refs, self.root_version = version, root_shell, root_refs, root_version
        self.steps, self.node, self.cfg = steps, node, cfg

    def then(self, y: torch.Tensor, step) -> "_Recipe":
        held = (step, None) if not isinstance(step, Mask) else (
            step.with_tensors((None,)), tuple(weakref.ref(t) for t in step.tensors()))
        return _Recipe(y._version, self.root_shell, self.root_refs, self.root_version, self.steps + (held,),
                       self.node, self.cfg)


def _recording() -> bool:
    return not (compiling() or tracing_active() or _alive_ids.get() is not None)


def record_dropout_output(y: torch.Tensor, x: torch.Tensor, p: float, seed: int) -> None:
    """Called by dgl_exact's dropout: ``y`` is ``x``'s dropout with the kernels' mask for ``seed``. Of data (``x``
    alive anyway, rule 1; ``y`` a new tensor of ``x``'s shape), ``y`` may be kept as ``x`` and the seed (rule 11);
    of a recorded output, as that output's recipe and this step (rule 12)."""
    if not _recording():
        return
    if alive_anyway(x):
        if y.shape == x.shape and storage_ptr(y) != storage_ptr(x):
            _elementwise_outputs[y] = _Recipe(y._version, None, (weakref.ref(x),), x._version,
                                              ((Drop(p, seed), None),), None, None)
        return
    record_elementwise_step(y, x, Drop(p, seed))


def record_batch_norm_output(y: torch.Tensor, x: torch.Tensor, kept: Kept, scale: torch.Tensor,
                             shift: torch.Tensor, cfg: CompressionConfig) -> None:
    """Called by dgl_exact's batch norm: ``y = x * scale + shift`` per channel, ``x`` kept as ``kept`` (a compressed
    copy, or ``x`` itself: recorded either way, so that what is kept through it does not depend on a keep hook's
    choice). ``y``, and what activations and dropout make of it, may be kept through it (rule 12)."""
    if not (_recording() and cfg.enabled and y.shape == x.shape and y.dim() == 2):
        return
    step = ((Affine(scale, shift, y.dtype), None),)
    if isinstance(kept, CompressedTensor):
        shell, tensors = kept.split()
        _elementwise_outputs[y] = _Recipe(y._version, shell, tuple(weakref.ref(t) for t in tensors), None, step,
                                          x.grad_fn, cfg)
    elif kept is x:  # by reference: exact up to rounding, no draw to share
        _elementwise_outputs[y] = _Recipe(y._version, None, (weakref.ref(x),), x._version, step, x.grad_fn, None)


def record_elementwise_step(y: torch.Tensor, x: torch.Tensor, step) -> None:
    """Called by dgl_exact's activations and dropout: ``y = step(x)``. Where ``x`` is a recorded output, unchanged
    since, so is ``y`` (rule 12)."""
    recipe = _elementwise_outputs.get(x) if _recording() else None
    if recipe is not None and recipe.version == x._version and y.shape == x.shape:
        _elementwise_outputs[y] = recipe.then(y, step)


def _elementwise_origin(y: torch.Tensor, cfg: CompressionConfig, leaf_grads: bool = False) -> Optional[ElementwiseOf]:
    """``y`` as an :class:`ElementwiseOf` where rules 11 and 12 allow it (see there), else None."""
    if not cfg.enabled or type(y) is not torch.Tensor or not _sharing.get() or not _recording():
        return None
    recipe = _elementwise_outputs.get(y)
    if recipe is None or recipe.version != y._version:
        return None
    tensors = _alive(recipe.root_refs)
    if tensors is None:
        return None
    if recipe.root_shell is None:
        if tensors[0]._version != recipe.root_version:
            return None  # the data changed in place since
        root = tensors[0]
    elif recipe.cfg != cfg:
        return None
    else:
        root = recipe.root_shell.join(tensors)
    steps = []
    for step, refs in recipe.steps:
        held = None if refs is None else _alive(refs)
        if refs is not None and held is None:
            return None
        steps.append(step if refs is None else step.with_tensors(held))
    item = ElementwiseOf(root, tuple(steps), y.shape)
    item.root_node = recipe.node
    if is_exact(item) or leaf_grads:
        return item
    return item if _reads_nothing_else_from(y, recipe.node) else None


def _reads_nothing_else_from(y: torch.Tensor, node) -> bool:
    """Rule 6's condition for a keep of ``y`` through a shared draw of ``node``'s output: the op reads ``y`` once
    and none of its other inputs was computed from that output."""
    inputs = _op_inputs.get()
    if node is None or inputs is None:
        return False
    return sum(t is y for t in inputs) == 1 and not any(t is not y and _computed_from(t, node) for t in inputs)


#: compressed copies offered for the next op that keeps a tensor (rule 6), weakly keyed by the tensor
_offers = WeakIdKeyDictionary()


def offer_compressed(x: torch.Tensor, cfg: CompressionConfig, c: CompressedTensor) -> None:
    """Offer ``c``, the compressed copy of ``x`` under ``cfg`` made by the op that produced ``x`` in the same
    pass (``ops.relu_dropout(..., compress_for=cfg)``), to the next op that keeps ``x`` (rule 6): its
    :func:`as_kept` under an equal config takes it instead of compressing ``x`` again, and registers it for the
    keepers after it (shared, as a copy the first keeper made). An ``x`` changed in place since is never
    matched. Unclaimed, the copy dies with ``x``."""
    _offers[x] = (cfg, x._version, c)


def take_offered(x: torch.Tensor, cfg: CompressionConfig) -> Optional[CompressedTensor]:
    """The copy :func:`offer_compressed` offered with ``x`` for ``cfg`` (and withdraws it), or None."""
    offered = _offers.get(x)
    if offered is None or offered[0] != cfg or offered[1] != x._version:
        return None
    del _offers[x]
    return offered[2]


def offered(x: torch.Tensor) -> Optional[CompressedTensor]:
    """The compressed copy on offer with ``x`` (not withdrawn), or None."""
    entry = _offers.get(x)
    return None if entry is None else entry[2]


def restore(item: Kept) -> Optional[torch.Tensor]:
    """The tensor a kept item (what :func:`as_kept` returned) stands for: itself, decoded where compressed."""
    if item is None or isinstance(item, torch.Tensor):
        return item
    if isinstance(item, LinearOf):
        return item.rows(restore(item.x))
    if isinstance(item, ElementwiseOf):
        return item.rows(restore(item.root), 0)
    return decompress(item)
