"""What an autograd function keeps for backward, and how.

``stash(x, cfg)`` decides how an activation is kept:

* a tensor without ``grad_fn`` (input features, parameters, constants) is alive anyway: keep it by
  reference, at no cost; replacing it with a compressed copy would *add* memory. The exception is a
  tensor one of dgl_exact's ops just produced without autograd (e.g. the neighbour mean of input
  features that need no gradient): it is marked *fresh*, nobody else keeps it, so it is compressed;
* with compression disabled, keep the tensor itself (as plain autograd would), unless a random
  projection is configured: then keep the projected tensor unquantised (EXACT's ``--act_fp --kept_frac``);
* otherwise keep a :class:`~dgl_exact.compression.CompressedTensor`.

``save(ctx, ...)`` / ``load(ctx)`` pass any mix of tensors, compressed tensors and ``None`` through
``ctx.save_for_backward``, so saved-tensor hooks (memory meters, CPU offloading) see everything kept.

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

from .._compat import compiling
from . import captured
from ..compression import CompressedTensor, compress, decompress
from ..config import CompressionConfig

Stashed = Union[torch.Tensor, CompressedTensor, None]


_FRESH = "_dgl_exact_fresh"


def alive_anyway(x: torch.Tensor) -> bool:
    """True for tensors autograd did not create (leaves: data, parameters, constants), unless a dgl_exact
    op produced them as temporaries (see :func:`fresh_outputs`)."""
    if compiling():
        return captured_alive(x)
    alive = _alive_ids.get()
    if alive is not None:  # inside a captured op (ops.captured): the decision was taken at trace time
        return id(x) in alive
    return x.grad_fn is None and not getattr(x, _FRESH, False)


def captured_alive(x: torch.Tensor) -> bool:
    """:func:`alive_anyway` as dynamo can trace it (``is_leaf`` is ``grad_fn is None``)."""
    return x.is_leaf and not getattr(x, _FRESH, False)


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
    """Decorator for public ops: outputs computed without autograd are temporaries nobody else keeps;
    mark them so a later op compresses rather than references them. An output sharing storage with an
    input (an op that returned its input, or a view of it) is not fresh."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        if compiling():  # dynamo sees no storage: an output is fresh unless it is an input itself
            given = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            for t in (out if isinstance(out, tuple) else (out,)):
                if isinstance(t, torch.Tensor) and not t.requires_grad and not any(t is a for a in given):
                    setattr(t, _FRESH, True)
            return out
        inputs = None
        for t in (out if isinstance(out, tuple) else (out,)):
            if isinstance(t, torch.Tensor) and t.grad_fn is None and not t.requires_grad:
                if inputs is None:
                    inputs = {a.untyped_storage().data_ptr() for a in (*args, *kwargs.values())
                              if isinstance(a, torch.Tensor)}
                if t.untyped_storage().data_ptr() not in inputs:
                    setattr(t, _FRESH, True)
        return out

    return wrapper


def mark_fresh(t: torch.Tensor) -> torch.Tensor:
    """Mark a temporary computed without autograd (no ``grad_fn``) as fresh, as :func:`fresh_outputs` does
    for the public ops: a later op then compresses it instead of keeping it by reference. Returns ``t``."""
    if not t.requires_grad and (compiling() or t.grad_fn is None):
        setattr(t, _FRESH, True)
    return t


#: ``fn(x, cfg, force) -> Stashed`` replacing :func:`stash` in this context (see :func:`stash_hook`)
_stash_hook: contextvars.ContextVar = contextvars.ContextVar("dgl_exact_stash_hook", default=None)


@contextlib.contextmanager
def stash_hook(fn):
    """Within this scope every :func:`stash` call is answered by ``fn(x, cfg, force)`` (``x`` not None),
    which may call :func:`default_stash` with another config. Used by :mod:`dgl_exact.planning` to record
    each kept activation and to choose a compression per kept activation."""
    token = _stash_hook.set(fn)
    try:
        yield fn
    finally:
        _stash_hook.reset(token)


def stash_hook_active() -> bool:
    """Whether a :func:`stash_hook` answers :func:`stash` calls in this context."""
    return _stash_hook.get() is not None


def stash(x: Optional[torch.Tensor], cfg: CompressionConfig, force: bool = False) -> Stashed:
    """Keep ``x`` for backward: by reference if it is alive anyway or compression is off, else compressed.
    ``force`` compresses even a leaf (used for per-edge tensors nobody else keeps)."""
    if x is None:
        return None
    hook = _stash_hook.get()
    if hook is not None:
        return hook(x, cfg, force)
    return default_stash(x, cfg, force)


def default_stash(x: torch.Tensor, cfg: CompressionConfig, force: bool = False) -> Stashed:
    """:func:`stash` without the hook."""
    if (not cfg.enabled and cfg.kept_frac >= 1.0) or (alive_anyway(x) and not force):
        # the tensor itself, not a detached alias (same storage): saved through ``save_for_backward`` it
        # stays connected to its autograd history, which double backward needs
        return x
    ready = take_offered(x, cfg)
    return ready if ready is not None else compress(x, cfg)


_OFFERED = "_dgl_exact_offered"


def offer_compressed(x: torch.Tensor, cfg: CompressionConfig, c: CompressedTensor) -> None:
    """Attach ``c``, the compressed copy of ``x`` under ``cfg`` made by the op that produced ``x`` in the same
    pass (``ops.relu_dropout(..., compress_for=cfg)``), for the next op that keeps ``x``: its :func:`stash`
    under an equal config takes it instead of compressing ``x`` again. One taker: a second op keeping ``x``
    compresses it anew (independent noise, as without the offer). An ``x`` changed in place since is never
    matched. Unclaimed, the copy dies with ``x``."""
    setattr(x, _OFFERED, (cfg, x._version, c))


def take_offered(x: torch.Tensor, cfg: CompressionConfig) -> Optional[CompressedTensor]:
    """The copy :func:`offer_compressed` attached to ``x`` for ``cfg`` (and detaches it), or None."""
    offered = getattr(x, _OFFERED, None)
    if offered is None or offered[0] != cfg or offered[1] != x._version:
        return None
    delattr(x, _OFFERED)
    return offered[2]


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
    size); a projected item is unprojected row by row. An exact tensor is sliced (views, no copy)."""
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
    bytes_per_row = item.width * item.bits  # in bits; byte offset of row r: r * bytes_per_row // 8
    starts = list(range(0, n, step))
    if len(starts) > 1 and n - starts[-1] < item.block_rows:
        starts.pop()  # a last chunk shorter than a block would pick another level table: merge it
    for i, r0 in enumerate(starts):
        r1 = starts[i + 1] if i + 1 < len(starts) else n
        b0 = r0 * bytes_per_row // 8
        b1 = r1 * bytes_per_row // 8 if r1 < n else item.packed.numel()
        g0, g1 = r0 // item.block_rows, -(-r1 // item.block_rows)
        part = dataclasses.replace(item, shape=torch.Size((r1 - r0,) + tuple(item.shape[1:])), n_rows=r1 - r0,
                                   packed=item.packed[b0:b1], lo=item.lo[g0:g1], step=item.step[g0:g1])
        yield r0, r1, decompress(part)


#: inside a ``dgl_exact.compress_saved`` scope: the storages (data pointers) dgl_exact's own ops keep, which
#: the scope's pack hook passes through unchanged (compressed codes, metadata, tensors kept exactly)
_own_saved: "contextvars.ContextVar[Optional[set]]" = contextvars.ContextVar("dgl_exact_own_saved", default=None)


def save(ctx, *items: Stashed) -> None:
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
    ctx._dgl_exact_layout = layout


def load(ctx) -> list:
    """The saved items, compressed ones still compressed (call :func:`unstash` to decode)."""
    tensors = iter(ctx.saved_tensors)
    out = []
    for entry in ctx._dgl_exact_layout:
        if entry is None:
            out.append(None)
        elif entry == 1:
            out.append(next(tensors))
        else:
            shell, n = entry
            out.append(shell.join([next(tensors) for _ in range(n)]))
    return out


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


# --- gradients a backward may overwrite ----------------------------------------------------------------------
def _grad_refs(grad: torch.Tensor) -> tuple:
    """(Python references, TensorImpl uses, storage uses) of ``grad`` as seen from a backward that passed it
    here directly (the same call depth in :func:`grad_is_private` and its calibration)."""
    import sys

    uses = grad._use_count() if hasattr(grad, "_use_count") else None
    storage = torch._C._storage_Use_Count(grad.untyped_storage()._cdata) if hasattr(
        torch._C, "_storage_Use_Count") else None
    return sys.getrefcount(grad), uses, storage


_PRIVATE_REFS: Optional[tuple] = None


def _refs_at_check_depth(grad: torch.Tensor) -> tuple:
    return _grad_refs(grad)  # one frame between the backward and _grad_refs, as in grad_is_private


def _calibrate_private_refs() -> Optional[tuple]:
    """The references a backward sees on an incoming gradient nobody else holds: measured once, on this
    torch, by a probe whose incoming gradient is a fresh product (``y * 2``'s backward)."""
    global _PRIVATE_REFS
    if _PRIVATE_REFS is None:
        seen = []

        class _Probe(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, grad):
                seen.append(_refs_at_check_depth(grad))
                return grad

        with torch.enable_grad():
            x = torch.zeros(4, requires_grad=True)
            (_Probe.apply(x) * 2.0).sum().backward()
        refs = seen[0]
        # without a TensorImpl use count the check cannot rule out a C++ holder (a gradient captured by
        # torch.autograd.grad): never private then
        _PRIVATE_REFS = refs if refs[1] == 1 and refs[2] is not None else (-1, -1, -1)
    return _PRIVATE_REFS


def grad_is_private(grad: torch.Tensor) -> bool:
    """Whether a backward may overwrite its incoming gradient ``grad`` in place: nobody else holds it (no
    Python reference beyond the call's, no other C++ owner such as ``torch.autograd.grad`` capturing it,
    no view sharing its storage), and it is a plain contiguous tensor of its own. Call it directly from
    the ``backward`` (the reference counts are compared with a probe's at the same depth). False when in
    doubt: the caller then works on a copy."""
    if (not isinstance(grad, torch.Tensor) or grad.requires_grad or grad._base is not None
            or not grad.is_contiguous() or grad.layout != torch.strided or captured.active() or compiling()):
        return False
    want = _calibrate_private_refs()
    got = _grad_refs(grad)
    return want[0] >= 0 and got[0] <= want[0] and got[1] == 1 and got[2] <= want[2]
