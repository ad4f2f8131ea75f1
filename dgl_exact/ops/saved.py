"""Saved-item plumbing: how an op's kept items (tensors, compressed tensors, None) pass through
``ctx.save_for_backward`` (:func:`save_kept` / :func:`load_kept`), so saved-tensor hooks (memory meters, CPU
offloading, :func:`dgl_exact.compress_saved`) see everything kept; and when a Function may hold what it
allocated privately and drop it early instead (ownership rule 8, :mod:`.keep`), shown to an observer that
only looks (:func:`observe_saved`)."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Optional

import torch

from .._compat import compiling, storage_ptr
from ..compression import CompressedTensor
from ..tracing import active as tracing_active
from .derived import Derived
from .keep import Kept

__all__ = ["save_kept", "load_kept", "own_saved", "observe_saved", "tensors_in", "show_private",
           "private_keeping_allowed", "graph_freed_after_backward", "needs_saving", "SECOND_BACKWARD_MESSAGE"]


#: inside a ``dgl_exact.compress_saved`` scope: the storages (data pointers) dgl_exact's own ops keep, which
#: the scope's pack hook passes through unchanged (compressed codes, metadata, tensors kept exactly)
_own_saved: "contextvars.ContextVar[Optional[set]]" = contextvars.ContextVar("dgl_exact_own_saved", default=None)


@contextlib.contextmanager
def own_saved(storages: set):
    """Within this scope :func:`save_kept` adds the storages (data pointers) of everything dgl_exact's ops keep
    to ``storages``, and Functions hold nothing privately (rule 8): a :func:`dgl_exact.compress_saved` scope,
    whose pack hook passes those storages through unchanged (nothing is compressed twice)."""
    token = _own_saved.set(storages)
    try:
        yield storages
    finally:
        _own_saved.reset(token)


def save_kept(ctx, *items: Kept) -> None:
    tensors, layout = [], []
    for item in items:
        if item is None:
            layout.append(None)
        elif isinstance(item, (CompressedTensor, Derived)):
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
        own.update(storage_ptr(t) for t in tensors)
    ctx.save_for_backward(*tensors)
    ctx.kept_layout = layout


def load_kept(ctx) -> list:
    """The saved items, compressed ones still compressed (call :func:`~.keep.restore` to decode)."""
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


def tensors_in(obj) -> list:
    """The tensors in ``obj`` (a tensor, or lists, tuples and dicts of them, nested), in order: what an observer
    of saved tensors sets apart as a forward's inputs or outputs rather than what it keeps
    (:func:`dgl_exact.explain`, :func:`dgl_exact.memory.measure`)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_in(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors_in(v)]
    return []


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


def show_private(*items: Kept) -> None:
    """Rule 8: show the tensors a Function holds privately (tensors, compressed tensors, None) to the
    observer in force (:func:`observe_saved`), as ``save_for_backward`` would have shown them to it. No-op
    without one."""
    pack = _observing(_top_hooks())
    if pack is None:
        return
    for item in items:
        if isinstance(item, (CompressedTensor, Derived)):
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
    if compiling() or tracing_active() or _own_saved.get() is not None:
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


def needs_saving(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether autograd will record the op (grad mode on and some input requires grad). Always True while
    dynamo traces: every op then runs its Function, as one captured custom op (see :mod:`.captured`)."""
    if tracing_active():
        return True
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)

