"""What dgl_exact's ops keep for backward, and who may overwrite or free a tensor: the ownership rules.

Every op and module of dgl_exact follows these rules; code that relies on one cites it ("rule 2"). They
are decided from what a call can see (a tensor's autograd history and class, the op's own allocations,
the caller's explicit words), never from reference counts or from how a caller holds its variables.

1. **Keeping.** An op keeps what its backward reads either as the tensor itself (by reference) or as a
   compressed copy (:func:`stash`). By reference: a tensor without autograd history (``grad_fn`` None:
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
   (``stash(..., overwritten=True)``): where the buffer would be kept exactly (compression off, a
   planner's fp32 choice), a copy is kept.
4. **Version counters stay honest.** Writes into a tensor autograd knows go through ``mark_dirty`` or
   in-place torch ops, so that a reference autograd saved elsewhere raises torch's "modified by an
   inplace operation" error instead of computing with changed values.
5. **Donation.** ``h = conv(g, dgl_exact.donate(h))`` gives ``h`` up: nothing reads it after the call, by
   any name. The callee may then :func:`release` it (its memory goes back, any later use raises) once
   it has kept what its backward needs compressed, instead of when the call returns. Donation is a
   permission, never a request: the callee releases only where that cannot change what is computed or
   seen (rule 7). A donated tensor is compressed where rule 1 would keep data by reference.
6. **Offers.** An op that produced ``x`` may offer a compressed copy of ``x`` for the next op that keeps
   ``x`` under the same configuration (:func:`offer_compressed`): matched by identity and version
   counter, taken once (a weak registry; an unclaimed offer dies with ``x``).
7. **Fast paths never change what a model computes.** A fused or in-place path runs only where it is
   provably equivalent to the composed modules: training mode with grad, no forward, forward-pre,
   backward or backward-pre hook on the modules involved nor a global one
   (:func:`dgl_exact.nn._base.hooks_present`), no subclass overriding ``forward``, more than one row
   under batch norm, outside torch.compile and autocast where the path does not cover them. Where double
   backward would not be exact, the backward raises (:data:`DOUBLE_BACKWARD_MESSAGE`). Otherwise the
   composed path runs; :func:`dgl_exact.explain` says which ran and why.
8. **Held privately, dropped early.** A Function whose backward loops over several layers (a fused region,
   rule 2) may hold what its forward allocated for one layer's backward and never returned (compressed
   copies of its own working buffer, copies of it, the dropout masks it drew) as a reference on ``ctx``
   instead of through ``ctx.save_for_backward``, and drop that reference as soon as the layer's backward
   step has run, instead of when the whole backward returns. Only where both hold: in the forward, no
   saved-tensor hooks are in force (:func:`private_keeping_allowed`: hooks such as CPU offloading must see
   everything kept, so then everything goes through ``save_for_backward``; nor while compiling or inside a
   captured op), except a hook that only looks (:func:`observe_saved`, the memory meter's): it changes
   nothing kept, so rule 8 stays in force under it and the Function shows it what it holds privately
   (:func:`show_private`), and a measured step runs as it does in training; in the backward, autograd
   frees the graph after this pass (:func:`graph_freed_after_backward`: not ``retain_graph``; where torch
   cannot say, nothing is dropped).
   Dropping a reference frees nothing that anybody else holds; tensors the op did not allocate (inputs,
   parameters, running statistics) always go through ``save_for_backward``. A second backward through a
   region that dropped its references raises torch's "backward through the graph a second time" error.

``save_kept(ctx, ...)`` / ``load_kept(ctx)`` pass any mix of tensors, compressed tensors and ``None``
through ``ctx.save_for_backward``, so saved-tensor hooks (memory meters, CPU offloading) see everything
kept (rule 8 holds privately only while no such hook is in force, or an observer that is shown it).

Double backward (``torch.autograd.grad(..., create_graph=True)`` and then a backward through that
gradient, e.g. a gradient penalty): inside a ``backward``, ``torch.is_grad_enabled()`` is True exactly
when the caller asked for ``create_graph=True`` (:func:`create_graph_requested`). Tensors kept exactly
are the op's own inputs/outputs (never detached copies), so a backward written with differentiable torch
ops is exact to any order; a compressed copy is not the tensor autograd knows, so the ops raise
(:func:`check_double_backward`) instead of returning a gradient that silently misses terms.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from typing import Optional, Union

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .._compat import compiling
from . import captured
from ..compression import CompressedTensor, compress, decompress
from ..compression_config import CompressionConfig

Stashed = Union[torch.Tensor, CompressedTensor, None]


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
        out = fn(*args, **kwargs)
        if compiling():
            return out
        inputs = None
        for t in (out if isinstance(out, tuple) else (out,)):
            if isinstance(t, torch.Tensor) and t.grad_fn is None and not t.requires_grad:
                if inputs is None:
                    inputs = {a.untyped_storage().data_ptr() for a in (*args, *kwargs.values())
                              if isinstance(a, torch.Tensor)}
                if t.untyped_storage().data_ptr() not in inputs:
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


#: ``fn(x, cfg, force) -> Stashed`` replacing :func:`stash` in this context (see :func:`stash_hook`)
_stash_hook: contextvars.ContextVar = contextvars.ContextVar("dgl_exact_stash_hook", default=None)


#: whether the hook set by :func:`stash_hook` in this context may keep something else than :func:`default_stash`
_hook_chooses: contextvars.ContextVar = contextvars.ContextVar("dgl_exact_stash_hook_chooses", default=False)


@contextlib.contextmanager
def stash_hook(fn, *, records_only: bool = False):
    """Within this scope every :func:`stash` call is answered by ``fn(x, cfg, force)`` (``x`` not None),
    which may call :func:`default_stash` with another config. Used by :mod:`dgl_exact.planning` to record
    each kept activation and to choose a compression per kept activation. ``records_only``: ``fn`` returns
    what :func:`default_stash` returns for the same arguments (it only looks), so the ops run as without a
    hook (:func:`stash_hook_active` is False): a planner's prediction records the step a run takes."""
    tokens = (_stash_hook.set(fn), _hook_chooses.set(not records_only))
    try:
        yield fn
    finally:
        _stash_hook.reset(tokens[0])
        _hook_chooses.reset(tokens[1])


def stash_hook_active() -> bool:
    """Whether a :func:`stash_hook` that may choose what is kept answers :func:`stash` calls in this context
    (then ops that act on what :func:`default_stash` would keep, such as releasing a donated input once it is
    kept compressed or compressing an output for the next op, take their plain path)."""
    return _stash_hook.get() is not None and _hook_chooses.get()


def stash(x: Optional[torch.Tensor], cfg: CompressionConfig, force: bool = False,
          overwritten: bool = False) -> Stashed:
    """Keep ``x`` for backward: by reference if it is alive anyway or compression is off, else compressed.
    ``force`` compresses even a leaf (used for per-edge tensors nobody else keeps). ``overwritten``: the
    caller writes into ``x`` afterwards (rule 3): where ``x`` would be kept exactly, a copy is kept."""
    if x is None:
        return None
    hook = _stash_hook.get()
    item = hook(x, cfg, force) if hook is not None else default_stash(x, cfg, force)
    if overwritten and isinstance(item, torch.Tensor) and _shares_storage(item, x):
        item = x.clone(memory_format=torch.contiguous_format)
    return item


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def default_stash(x: torch.Tensor, cfg: CompressionConfig, force: bool = False) -> Stashed:
    """:func:`stash` without the hook."""
    if (not cfg.enabled and cfg.kept_frac >= 1.0) or (alive_anyway(x) and not force):
        # the tensor itself, not a detached alias (same storage): saved through ``save_for_backward`` it
        # stays connected to its autograd history, which double backward needs
        return x
    ready = take_offered(x, cfg)
    return ready if ready is not None else compress(x, cfg)


#: compressed copies offered for the next op that keeps a tensor (rule 6), weakly keyed by the tensor
_offers = WeakIdKeyDictionary()


def offer_compressed(x: torch.Tensor, cfg: CompressionConfig, c: CompressedTensor) -> None:
    """Offer ``c``, the compressed copy of ``x`` under ``cfg`` made by the op that produced ``x`` in the same
    pass (``ops.relu_dropout(..., compress_for=cfg)``), to the next op that keeps ``x`` (rule 6): its
    :func:`stash` under an equal config takes it instead of compressing ``x`` again. One taker: a second op
    keeping ``x`` compresses it anew (independent noise, as without the offer). An ``x`` changed in place
    since is never matched. Unclaimed, the copy dies with ``x``."""
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


def unstash(item: Stashed) -> Optional[torch.Tensor]:
    if item is None or isinstance(item, torch.Tensor):
        return item
    return decompress(item)


#: elements (not bytes) of one decompressed row chunk in a chunked backward on the CPU: 4 MiB of fp32
CHUNK_ELEMENTS = 1 << 20
# a planner's sample run: chunk sizes scaled with the sample (see dgl_exact.planning.predict)
_chunk_scale = contextvars.ContextVar("dgl_exact_chunk_scale", default=1.0)
# ... and at most this many chunks per tensor (0: no limit), so that a small sample runs few chunk loops
_max_chunks = contextvars.ContextVar("dgl_exact_max_chunks", default=0)
#: the same on a GPU: 1 GiB of fp32. Every chunk costs its kernel launches and the chunked batch-norm
#: backward reads the input twice, so on a GPU a tensor is chunked only when its decompressed copy is
#: large enough to matter for the step peak (a products-sized 2.4 M x 256 activation: 3 chunks; an
#: arxiv-sized one: none, and batch norm takes ATen's fused kernel).
CUDA_CHUNK_ELEMENTS = 1 << 28

_gpu_policy_on_cpu = contextvars.ContextVar("dgl_exact_gpu_chunk_policy", default=False)


@contextlib.contextmanager
def gpu_chunk_policy():
    """Within this scope CPU tensors are chunked as CUDA tensors would be (the GPU code path, emulated
    on the CPU by :mod:`dgl_exact.bench.opcount`)."""
    token = _gpu_policy_on_cpu.set(True)
    try:
        yield
    finally:
        _gpu_policy_on_cpu.reset(token)


def chunk_elements_for(device) -> int:
    """Elements of one decompressed row chunk in a chunked backward for tensors on ``device``."""
    base = CUDA_CHUNK_ELEMENTS if torch.device(device).type == "cuda" or _gpu_policy_on_cpu.get() else CHUNK_ELEMENTS
    scale = _chunk_scale.get()
    return base if scale == 1.0 else max(1, int(base * scale))


def chunk_rows(n_rows: int, per_row: int, device, align: int = 1) -> int:
    """Rows per chunk of a row-chunked loop over ``n_rows`` rows of ``per_row`` elements on ``device``: as
    many as :func:`chunk_elements_for` allows, a multiple of ``align`` (at least ``align``).

    In a planner's sample run (:mod:`dgl_exact.planning.predict`, chunks scaled with the sample) the loop
    instead runs as many chunks as the full-size tensor would, rounded down to a power of two and capped,
    ``n_rows / k`` rows each: the sample sizes are multiples of ``k * align``, so both samples run the same
    operators and every point of the step's memory timeline can be extrapolated."""
    cap = _max_chunks.get()
    if cap:
        full = n_rows * per_row / _chunk_scale.get()
        gpu = torch.device(device).type == "cuda" or _gpu_policy_on_cpu.get()
        k = min(cap, max(1, math.ceil(full / (CUDA_CHUNK_ELEMENTS if gpu else CHUNK_ELEMENTS))))
        k = 1 << (k.bit_length() - 1)
        rows = -(-n_rows // k)
        return max(align, -(-rows // align) * align)
    return max(align, (chunk_elements_for(device) // max(1, per_row)) // align * align)


def _item_numel_device(item: "Stashed"):
    if isinstance(item, torch.Tensor):
        return item.numel(), item.device
    return item.n_rows * item.orig_width, item.device


def needs_chunks(item: "Stashed") -> bool:
    """Whether :func:`row_chunks` would split ``item`` into more than one chunk on its device."""
    if item is None:
        return False
    numel, device = _item_numel_device(item)
    return numel > chunk_elements_for(device)


def row_chunks(item: Stashed, chunk_elements: Optional[int] = None):
    """``(r0, r1, x_hat[r0:r1])`` over consecutive row ranges of a kept item (dim 0), so a backward can
    work from a compressed activation without a full-size decompressed copy. Each chunk decodes exactly
    as the same rows of :func:`unstash`: chunks start at block (group) boundaries and at whole bytes of
    the packed codes, and hold at least one whole block (the non-uniform level table depends on the group
    size); a projected item is unprojected row by row. An exact tensor is sliced (views, no copy).

    The next chunk is decoded when the loop asks for it, while the loop's own names still hold the previous
    one: a loop body ends with ``del x`` (and whatever else holds the chunk), or two decoded chunks are alive
    at once at the backward's peak."""
    if item is None:
        return
    n = item.shape[0] if len(item.shape) else 1
    per_row = max(1, (item.numel() if isinstance(item, torch.Tensor) else
                      (item.n_rows * item.orig_width)) // max(n, 1))
    device = _item_numel_device(item)[1]
    if isinstance(item, torch.Tensor) or item.packed is None:
        x = unstash(item)
        step = max(1, chunk_elements // per_row) if chunk_elements is not None else chunk_rows(n, per_row, device)
        for r0 in range(0, n, step):
            yield r0, min(n, r0 + step), x[r0:r0 + step]
        return
    if len(item.shape) < 2 or item.n_rows != n or n * item.width == 0:
        yield 0, n, unstash(item)
        return
    align = math.lcm(item.block_rows, 8)  # 8 rows of codes always end on a byte
    step = (max(align, (chunk_elements // per_row) // align * align) if chunk_elements is not None
            else chunk_rows(n, per_row, device, align))
    starts = _chunk_starts(n, step, item.block_rows)
    for i, r0 in enumerate(starts):
        r1 = starts[i + 1] if i + 1 < len(starts) else n
        yield r0, r1, _decode_rows(item, r0, r1)


def _chunk_starts(n: int, step: int, block_rows: int) -> list:
    starts = list(range(0, n, step))
    if len(starts) > 1 and n - starts[-1] < block_rows:
        starts.pop()  # a last chunk shorter than a block would pick another level table: merge it
    return starts


def _row_wise(item: Stashed) -> bool:
    """Whether rows of ``item`` decode on their own (:func:`_decode_rows`) rather than from a whole copy."""
    return (isinstance(item, CompressedTensor) and item.packed is not None and len(item.shape) >= 2
            and item.n_rows == item.shape[0] and item.n_rows * item.width > 0)


def _decode_rows(item: CompressedTensor, r0: int, r1: int) -> torch.Tensor:
    """Rows ``r0:r1`` of a row-wise compressed item (:func:`_row_wise`), decoded as the same rows of
    :func:`unstash`: ``r0`` on a block boundary and a whole byte, ``r1`` too or the last row."""
    n = item.n_rows
    bits_per_row = item.width * item.bits  # byte offset of row r: r * bits_per_row // 8
    b0 = r0 * bits_per_row // 8
    b1 = r1 * bits_per_row // 8 if r1 < n else item.packed.numel()
    g0, g1 = r0 // item.block_rows, -(-r1 // item.block_rows)
    part = dataclasses.replace(item, shape=torch.Size((r1 - r0,) + tuple(item.shape[1:])), n_rows=r1 - r0,
                               packed=item.packed[b0:b1], lo=item.lo[g0:g1], step=item.step[g0:g1])
    return decompress(part)


def rows_together(items, n_rows: int, device):
    """``(r0, r1, [rows r0:r1 of each item])`` over row chunks common to several kept items of ``n_rows``
    rows each (``None`` items give ``None``), for a backward that combines them row by row: each item's rows
    decode exactly as the same rows of :func:`unstash` (chunks start on every compressed item's block
    boundaries and at multiples of 8 rows: whole bytes of codes and of one-bit masks over any width), and
    the decoded chunks of all items together stay within :func:`chunk_rows`' budget. The rule of
    :func:`row_chunks` holds: the loop body ends with ``del`` of every chunk."""
    wise = [_row_wise(it) for it in items]
    whole = [None if it is None or w else unstash(it) for it, w in zip(items, wise)]
    per_row = sum(max(1, _item_numel_device(it)[0] // max(n_rows, 1)) for it in items if it is not None)
    blocks = [it.block_rows for it, w in zip(items, wise) if w]
    align = math.lcm(8, *blocks)
    starts = _chunk_starts(n_rows, chunk_rows(n_rows, max(per_row, 1), device, align), max(blocks, default=1))
    for i, r0 in enumerate(starts):
        r1 = starts[i + 1] if i + 1 < len(starts) else n_rows
        yield r0, r1, [_decode_rows(it, r0, r1) if w else (None if x is None else x[r0:r1])
                       for it, w, x in zip(items, wise, whole)]


#: inside a ``dgl_exact.compress_saved`` scope: the storages (data pointers) dgl_exact's own ops keep, which
#: the scope's pack hook passes through unchanged (compressed codes, metadata, tensors kept exactly)
_own_saved: "contextvars.ContextVar[Optional[set]]" = contextvars.ContextVar("dgl_exact_own_saved", default=None)


def save_kept(ctx, *items: Stashed) -> None:
    tensors, layout = [], []
    for item in items:
        if item is None:
            layout.append(None)
        elif isinstance(item, CompressedTensor):
            shell, ts = item.split()
            layout.append((shell, len(ts)))
            tensors.extend(ts)
        elif isinstance(item, torch.Tensor):
            layout.append(1)
            tensors.append(item)
        else:
            raise TypeError(f"cannot save {type(item).__name__} for backward")
    own = _own_saved.get()
    if own is not None:
        own.update(t.untyped_storage().data_ptr() for t in tensors)
    ctx.save_for_backward(*tensors)
    ctx.kept_layout = layout


def load_kept(ctx) -> list:
    """The saved items, compressed ones still compressed (call :func:`unstash` to decode)."""
    tensors = iter(ctx.saved_tensors)
    out = []
    for entry in ctx.kept_layout:
        if entry is None:
            out.append(None)
        elif entry == 1:
            out.append(next(tensors))
        else:
            shell, n = entry
            out.append(shell.join([next(tensors) for _ in range(n)]))
    return out


# --- observers: saved-tensor hooks that only look (rule 8) ----------------------------------------------------
_observer: "contextvars.ContextVar[Optional[object]]" = contextvars.ContextVar("dgl_exact_observer", default=None)


def _same(t):
    return t


@contextlib.contextmanager
def observe_saved(record):
    """Saved-tensor hooks that only look: ``record(t)`` is called for every tensor saved for backward inside
    the block, and ``t`` is kept as it is (a memory meter: :func:`dgl_exact.memory.measure_step`). Unlike any
    other saved-tensor hook, an observer leaves rule 8 in force, because nothing it does changes what is
    kept or when it is freed: a Function that holds tensors privately shows each to it
    (:func:`show_private`) instead of passing it through ``save_for_backward``."""
    def pack(t):
        record(t)
        return t

    token = _observer.set(pack)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, _same):
            yield
    finally:
        _observer.reset(token)


def _top_hooks():
    """The innermost saved-tensor hooks in force (None: none), or False where torch cannot say."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return False
    try:
        return top(False)
    except (RuntimeError, TypeError):
        return False


def _observing(hooks):
    """The observer's pack function if the innermost hooks ``hooks`` are an :func:`observe_saved` block's."""
    pack = _observer.get()
    return pack if pack is not None and hooks and hooks[0] is pack else None


def show_private(*items: Stashed) -> None:
    """Rule 8: show the tensors a Function holds privately (tensors, compressed tensors, None) to the
    observer in force (:func:`observe_saved`), as ``save_for_backward`` would have shown them to it. No-op
    without one."""
    pack = _observing(_top_hooks())
    if pack is None:
        return
    for item in items:
        if isinstance(item, CompressedTensor):
            for t in item.split()[1]:
                pack(t)
        elif isinstance(item, torch.Tensor):
            pack(item)


def private_keeping_allowed() -> bool:
    """In a Function's forward: whether it may hold tensors it allocated on ``ctx`` instead of through
    ``ctx.save_for_backward`` (rule 8): no default saved-tensor hooks in force (``saved_tensors_hooks``,
    ``save_on_cpu``, non-reentrant checkpointing, :func:`dgl_exact.compress_saved`) other than an observer
    (:func:`observe_saved`: a memory meter, shown what is held with :func:`show_private`), not compiling,
    not inside a captured op. False where torch cannot say whether hooks are in force."""
    if compiling() or captured.active() or _own_saved.get() is not None:
        return False
    hooks = _top_hooks()
    if hooks is False:
        return False
    return hooks is None or _observing(hooks) is not None


def graph_freed_after_backward() -> bool:
    """In a Function's backward: whether autograd frees the graph after this pass (``retain_graph`` not
    set), so nothing will read what the Function kept once its backward has used it (rule 8). False where
    torch cannot say."""
    keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    if keep_graph is None:
        return False
    try:
        return not keep_graph()
    except RuntimeError:
        return False


#: raised by a second backward through a Function that dropped what it held privately (rule 8); torch's words
SECOND_BACKWARD_MESSAGE = (
    "Trying to backward through the graph a second time (or directly access saved tensors after they have "
    "already been freed). Saved intermediate values of the graph are freed when you call .backward() or "
    "autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or "
    "if you need to access saved tensors after calling backward. ({op} dropped its kept activations layer "
    "by layer during the first backward.)")


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


def check_double_backward(op: str, *items: Stashed) -> None:
    """RuntimeError (saying how to turn compression off) if any kept item is compressed."""
    if any(isinstance(item, CompressedTensor) for item in items):
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


def needs_saving(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether autograd will record the op (grad mode on and some input requires grad). Always True while
    dynamo traces: every op then runs its Function, as one captured custom op (see :mod:`.captured`)."""
    if captured.active():
        return True
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The autocast dtype for ``device_type`` if autocast is active there, else None."""
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except TypeError:  # torch < 2.4: no device argument
        if device_type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
        if device_type == "cpu" and torch.is_autocast_cpu_enabled():
            return torch.get_autocast_cpu_dtype()
    return None


# --- donation (rule 5) ---------------------------------------------------------------------------------------
class Donated(torch.Tensor):
    """The class of a tensor its owner gave up with :func:`donate`: it computes as a plain tensor (results
    of operations on it are plain tensors) until an op that was handed it :func:`release` s it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class Released(torch.Tensor):
    """The class of a donated tensor once released: its memory went back to the allocator (unless another
    tensor shares it); any use raises."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        raise RuntimeError(
            f"dgl_exact: this tensor was donated (dgl_exact.donate) to a module that has released its memory; "
            f"it cannot be used any more (by {name}). Donate only a tensor nothing reads after the call: write "
            f"`h = conv(g, dgl_exact.donate(h))`, and keep another tensor where you need its values later.")


def donate(x: torch.Tensor) -> torch.Tensor:
    """Give ``x`` up to the next dgl_exact module or op it is passed to: nothing reads ``x`` after that call
    (by any name), so the callee may free its memory as soon as it has kept what its backward needs,
    instead of when the call returns (``nn.Module.__call__`` and the caller's name hold it until then).
    Returns ``x`` itself, now of class :class:`Donated`; use it as ``h = conv(g, dgl_exact.donate(h))``.

    Donation is a permission, never a request: a callee releases ``x`` only where that cannot change what
    is computed or seen (training with grad, no hooks on the module, ``x`` kept compressed, not under
    torch.compile; :func:`dgl_exact.explain` says what happened). A released ``x`` raises on any use; views
    of it made before keep their values (and its memory). Parameters, leaves that require grad and tensor
    subclasses cannot be donated (TypeError); under torch.compile ``donate`` returns ``x`` unchanged."""
    if compiling():
        return x
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"dgl_exact.donate expects a torch.Tensor, got {type(x).__name__}")
    if type(x) is Donated:
        return x
    if type(x) is not torch.Tensor or (x.is_leaf and x.requires_grad):
        raise TypeError("dgl_exact.donate: only a plain tensor computed in this forward can be donated (not a "
                        f"parameter, a leaf that requires grad or a {type(x).__name__} subclass)")
    x.__class__ = Donated
    return x


def reclaim(x: torch.Tensor) -> torch.Tensor:
    """Take back a tensor donated to a callee that declined it (did not :func:`release` it, e.g. a fused
    path that refused and returned None so that the caller runs the modules instead): returns ``x`` itself
    as a plain tensor again. A released ``x`` raises (its memory is gone); a plain ``x`` is returned as is."""
    if type(x) is Released:
        raise RuntimeError("dgl_exact.reclaim: this tensor was released by the op it was donated to")
    if type(x) is Donated:
        x.__class__ = torch.Tensor
    return x


def release(x: torch.Tensor) -> bool:
    """Free the memory of a :class:`Donated` tensor ``x`` (its reference to its storage is dropped; the
    memory returns once no view shares it) and make any later use of ``x`` raise. For the callee ``x`` was
    donated to, once nothing it computes reads ``x`` again and its backward keeps no reference to ``x``
    (rule 5). Returns whether ``x`` was released (False: not donated)."""
    if type(x) is not Donated:
        return False
    with torch.no_grad():
        x.set_(torch.empty(0, dtype=x.dtype, device=x.device))
    x.__class__ = Released
    return True
