"""dgl_exact's ops under ``torch.compile``: opaque custom ops, graph structure by handle, saved state as outputs.

Eager execution never comes here. While dynamo traces (``torch.compiler.is_compiling()``), the public ops
route each of their autograd Functions through :func:`apply`, which calls two generic custom ops instead
of ``Function.apply``:

* ``dgl_exact_capture::forward(key, tensors) -> outputs + kept``: runs the Function's own ``forward``
  eagerly (the same kernels, DGL's C kernels included) and returns its outputs followed by every tensor
  it kept for backward that is not one of its inputs: the compressed codes, group minimum and step, packed
  masks, arg indices, and the random seeds it drew (as int64 scalars). They are ordinary graph outputs,
  so AOT autograd's partitioner keeps exactly them between the passes (nothing uncompressed).
* ``dgl_exact_capture::backward(key, kept inputs, kept outputs, grads) -> input grads``: rebuilds the
  Function's context and runs its own ``backward``.

``key`` names one call site as traced: the Function, its non-tensor arguments (a graph is a handle on
its cached :class:`~.structure.GraphStructure`; a config, its fields) and the shapes, dtypes and flags of
its tensors. Registering a key (at trace time) runs the Function once on random tensors of those shapes
to learn what it returns and keeps: the fake implementations (shapes for the compiler) come from that
run. Everything is static: compile with ``dynamic=False`` (full-graph training has static shapes).

A DGL graph never enters the traced code: :func:`structure` (what :func:`~.structure.structure_of`
returns while compiling) is a plain object whose counts dynamo reads as constants and whose degree and
endpoint tensors come from a third custom op (``graph_tensor``); dynamo guards on the graph object's
identity, so another graph recompiles (mutating a graph in place after compiling is not seen). The
configuration in force (``dgl_exact.config`` scopes, :func:`dgl_exact.set_config`) is read once at trace time
(:func:`config_at_trace`); a module's own ``compression`` is guarded as usual.

Eager semantics are kept where the same keeping decisions are taken: the Functions are the eager ones,
seeds are drawn inside the forward op when it runs (never at trace time), from torch's default CPU
generator, in eager's order, and a tensor is kept by reference or compressed by rule 1 of ``keep.py``,
decided at trace time with ``is_leaf`` for ``grad_fn is None``. Provenance is not tracked while compiling
(:func:`~.keep.captured_alive`): a temporary without autograd history is kept by reference, uncompressed,
unless the caller states that it allocated it (``apply(..., owned=...)``, as :func:`~.dense.linear_reusing`
does for GraphConv's aggregation of input features). Where both decide alike, a compiled step draws the
same seeds as the eager step and reproduces its compression noise and dropout masks. Where they do not
(a first layer's other no-grad temporaries, e.g. input-dropped features kept by a linear, or SAGEConv's
first layer, whose fused op does not run while compiling and whose composed path keeps the aggregation of
the features), the compiled step keeps that tensor exactly and draws seeds in another number or order;
every later seed of the run then shifts, so dropout masks and noise differ from eager's from there on
(the same distributions: training is equivalent in law, not step by step).

Not covered while compiling (each raises or falls back): random projection (``kept_frac < 1``: raises at
trace time), double backward, batch norm (runs as ``F.batch_norm``, keeping its input uncompressed: one
generic op cannot declare the in-place running-statistics update), GCNII's fused in-place mix (the
unfused chain runs, compressed through the captured linear), dynamic shapes. CUDA graphs
(``mode="reduce-overhead"``) are untested (no GPU was available) and, as built, unfit for training with
compression or dropout: the forward op draws its seeds in Python, which a CUDA graph replay does not
rerun, so every replayed step would reuse the captured step's noise; the kernels would need the seed
as a device tensor.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..compression_config import CFG_FIELDS as _CFG_FIELDS, CompressionConfig, config_at_trace  # noqa: F401
from ..tracing import RUNTIME_SEED, SUPPORTED, active, assume_constant
from .traced_graph import CapturedStructure, structure_by_handle, structure_tensor, structure_tensor_meta

__all__ = ["SUPPORTED", "active", "apply", "RUNTIME_SEED"]

_lock = threading.Lock()
_CALLS: Dict[str, "_Call"] = {}
_assume_constant = assume_constant


# --- one traced call site ---------------------------------------------------------------------------------
class _Ctx:
    """Stands in for autograd's ctx when a Function's forward/backward run inside the custom ops."""

    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad
        self.saved_tensors = ()

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def mark_dirty(self, *tensors):
        raise RuntimeError("dgl_exact: an in-place Function cannot run as a captured op")

    def mark_non_differentiable(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        pass


@dataclasses.dataclass
class _Call:
    fn: type
    statics: Tuple[Any, ...]       # per Function argument: a constant, or ("tensor", index)
    metas: Tuple[Tuple, ...]       # per tensor: (shape, dtype, device, requires_grad, kept by reference)
    dups: Tuple[int, ...]          # per tensor: index of the first identical tensor
    needs: Tuple[bool, ...]        # ctx.needs_input_grad
    n_out: int = 0
    single: bool = True
    out_metas: Tuple[Tuple, ...] = ()
    kept: Tuple[Tuple, ...] = ()   # per saved tensor: ("in", tensor index) or ("out", index among kept outputs)
    kept_metas: Tuple[Tuple, ...] = ()
    n_seeds: int = 0
    template: Optional[dict] = None


def _config_of(fields) -> CompressionConfig:
    return CompressionConfig(**dict(zip(_CFG_FIELDS, fields)))


def _resolve_args(call: _Call, tensors, seeds: List[int]):
    args, seeds = [], iter(seeds)
    for s in call.statics:
        if isinstance(s, tuple) and s and s[0] == "tensor":
            args.append(tensors[s[1]])
        elif isinstance(s, tuple) and s and s[0] == "graph":
            args.append(structure_by_handle(s[1]))
        elif isinstance(s, tuple) and s and s[0] == "config":
            args.append(_config_of(s[1]))
        elif isinstance(s, tuple) and s and s[0] == "seed":
            args.append(next(seeds))
        else:
            args.append(s)
    return args


def _no_autocast():
    """Autocast off on the CPU and CUDA: a Function computes in the dtypes it is given (custom ops have no
    autocast rule, so the caller's autocast state would otherwise reach the Function's own ops)."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch.autocast("cpu", enabled=False))
    if torch.cuda.is_available():
        stack.enter_context(torch.autocast("cuda", enabled=False))
    return stack


def _run_forward(call: _Call, tensors, seeds: List[int]):
    """The Function's forward under a stand-in ctx, with the trace-time 'kept by reference' decisions."""
    from . import keep as keeping

    ctx = _Ctx(call.needs)
    alive = {id(t) for t, m in zip(tensors, call.metas) if t is not None and m[4]}
    with torch.no_grad(), _no_autocast(), keeping.alive_override(alive):
        out = call.fn.forward(ctx, *_resolve_args(call, tensors, seeds))
    return ctx, out


def _register_call(fn, statics, metas, dups) -> str:
    needs = tuple(bool(isinstance(s, tuple) and s and s[0] == "tensor" and metas[s[1]][3]) for s in statics)
    call = _Call(fn, statics, metas, dups, needs)
    for s in statics:
        if isinstance(s, tuple) and s and s[0] == "config" and _config_of(s[1]).kept_frac < 1.0:
            raise NotImplementedError("dgl_exact under torch.compile: random projection (kept_frac < 1) is not "
                                      "supported; compile without it or run eagerly")
    n_seeds = sum(1 for s in statics if isinstance(s, tuple) and s and s[0] == "seed")
    # one run on random tensors of the traced shapes: what the Function returns and keeps (no RNG consumed)
    with torch.random.fork_rng(devices=[]):
        tensors = []
        for i, (shape, dtype, device, _, _) in enumerate(metas):
            if dups[i] != i:
                tensors.append(tensors[dups[i]])
            elif dtype.is_floating_point:
                tensors.append(torch.randn(shape, dtype=dtype, device=device))
            else:
                tensors.append(torch.zeros(shape, dtype=dtype, device=device))
        ctx, out = _run_forward(call, tensors, [0] * n_seeds)
    outs = out if isinstance(out, tuple) else (out,)
    call.single, call.n_out = not isinstance(out, tuple), len(outs)
    call.out_metas = tuple((tuple(o.shape), o.dtype, o.device) for o in outs)
    kept, kept_metas = [], []
    for t in ctx.saved_tensors:
        idx = next((i for i, x in enumerate(tensors) if x is t), None)
        if idx is not None:
            kept.append(("in", idx))
        else:
            kept.append(("out", len(kept_metas)))
            kept_metas.append((tuple(t.shape), t.dtype, t.device))
    call.kept, call.kept_metas, call.n_seeds = tuple(kept), tuple(kept_metas), n_seeds
    call.template = {k: v for k, v in vars(ctx).items() if k not in ("saved_tensors", "needs_input_grad")}
    # the key spells out what was registered (a digest of it): inductor's on-disk cache may hand this process
    # code compiled by another one, naming keys that must mean the same call here
    digest = hashlib.sha1(repr((fn.__name__, statics, metas, dups)).encode()).hexdigest()[:16]
    key = f"{fn.__name__}#{digest}"
    with _lock:
        _CALLS[key] = call
    return key


_KEYS: Dict[Tuple, str] = {}
#: the autograd Functions that run through :func:`apply`, by class name (filled by :func:`capturable`)
_FUNCTIONS: Dict[str, type] = {}


def capturable(cls: type) -> type:
    """Class decorator: ``cls`` (an autograd Function) may run through :func:`apply` by its name, which must
    be unique among such Functions."""
    other = _FUNCTIONS.setdefault(cls.__name__, cls)
    if other is not cls:
        raise RuntimeError(f"two capturable Functions named {cls.__name__}: {other.__module__} and {cls.__module__}")
    return cls


@_assume_constant
def _call_key(name: str, statics, metas, dups) -> str:
    """The key of a traced call site (registered once per distinct site). The Function comes by name
    (dynamo passes no class to such a function): :func:`capturable` registered it."""
    fn = function(name)
    ident = (fn, statics, metas, dups)
    with _lock:
        key = _KEYS.get(ident)
    if key is None:
        key = _register_call(fn, statics, metas, dups)
        with _lock:
            _KEYS[ident] = key
    return key


def _own(t: torch.Tensor, inputs, contiguous: bool = True) -> torch.Tensor:
    """``t`` (contiguous, as the fakes are) sharing no storage with ``inputs`` (custom op outputs may not
    alias inputs)."""
    if contiguous:
        t = t.contiguous()
    ptr = t.untyped_storage().data_ptr()
    if t.numel() and any(x is not None and x.numel() and x.untyped_storage().data_ptr() == ptr for x in inputs):
        t = t.clone(memory_format=torch.contiguous_format)
    return t


def _meta_empty(meta) -> torch.Tensor:
    shape, dtype, device = meta[:3]
    return torch.empty(shape, dtype=dtype, device=device)


if SUPPORTED:
    @torch.library.custom_op("dgl_exact_capture::graph_tensor", mutates_args=(),
                             schema="(str key, str name) -> Tensor")
    def _graph_tensor_op(key: str, name: str) -> torch.Tensor:
        return structure_tensor(key, name).clone()  # a fresh output (the cached one stays the cache's)

    @_graph_tensor_op.register_fake
    def _graph_tensor_fake(key, name):
        return _meta_empty(structure_tensor_meta(key, name))

    @torch.library.custom_op("dgl_exact_capture::forward", mutates_args=(),
                             schema="(str key, Tensor?[] tensors) -> Tensor[]")
    def _forward_op(key: str, tensors: List[Optional[torch.Tensor]]) -> List[torch.Tensor]:
        from ..compression import draw_seed

        call = _CALLS[key]
        tensors = [tensors[d] if d != i else t for i, (t, d) in enumerate(zip(tensors, call.dups))]
        # aliasing the compiler introduced (views of one another) is not what was traced: own copies
        for i, t in enumerate(tensors):
            if t is not None and call.dups[i] == i:
                tensors[i] = _own(t, [x for j, x in enumerate(tensors) if j != i and call.dups[j] == j], False)
        seeds = [draw_seed() for _ in range(call.n_seeds)]
        ctx, out = _run_forward(call, tensors, seeds)
        outs = out if isinstance(out, tuple) else (out,)
        kept = [t for t, (kind, _) in zip(ctx.saved_tensors, call.kept) if kind == "out"]
        result = []
        for t in (*outs, *kept):  # owning no storage of the inputs nor of one another (group min and step
            result.append(_own(t, [*tensors, *result]))  # of a compressed tensor are rows of one buffer)
        return result + [torch.tensor(s, dtype=torch.int64) for s in seeds]

    @_forward_op.register_fake
    def _forward_fake(key, tensors):
        call = _CALLS[key]
        return ([_meta_empty(m) for m in call.out_metas] + [_meta_empty(m) for m in call.kept_metas]
                + [torch.empty((), dtype=torch.int64) for _ in range(call.n_seeds)])

    @torch.library.custom_op("dgl_exact_capture::backward", mutates_args=(),
                             schema="(str key, Tensor?[] inputs, Tensor[] kept, Tensor?[] grads) -> Tensor[]")
    def _backward_op(key: str, inputs: List[Optional[torch.Tensor]], kept: List[torch.Tensor],
                     grads: List[Optional[torch.Tensor]]) -> List[torch.Tensor]:
        call = _CALLS[key]
        n_kept = len(call.kept_metas)
        ctx = _Ctx(call.needs)
        vars(ctx).update(call.template)
        ctx.saved_tensors = tuple(inputs[i] if kind == "in" else kept[i] for kind, i in call.kept)
        if call.n_seeds:
            ctx.seed = int(kept[n_kept])  # a Function keeps the seed it was given as ctx.seed
        with torch.no_grad(), _no_autocast():
            res = call.fn.backward(ctx, *grads)
        res = res if isinstance(res, tuple) else (res,)
        out = []
        for s, r in zip(call.statics, res):
            if not (isinstance(s, tuple) and s and s[0] == "tensor"):
                continue
            meta = call.metas[s[1]]
            if not meta[3]:
                out.append(torch.empty(0, dtype=meta[1], device=meta[2]))
            elif r is None:
                out.append(torch.zeros(meta[0], dtype=meta[1], device=meta[2]))
            else:
                out.append(_own(r, [*inputs, *kept, *grads]))
        return out

    @_backward_op.register_fake
    def _backward_fake(key, inputs, kept, grads):
        call = _CALLS[key]
        out = []
        for s in call.statics:
            if isinstance(s, tuple) and s and s[0] == "tensor":
                meta = call.metas[s[1]]
                out.append(_meta_empty(meta) if meta[3] else torch.empty(0, dtype=meta[1], device=meta[2]))
        return out

    def _setup_context(ctx, inputs, output):
        key, tensors = inputs
        call = _CALLS[key]
        used = {i for kind, i in call.kept if kind == "in"}
        ctx.key = key
        ctx.n_inputs = len(tensors)
        ctx.used = tuple(sorted(used))
        rest = output[call.n_out:]
        ctx.save_for_backward(*[tensors[i] for i in ctx.used], *rest)

    def _backward_formula(ctx, grads):
        call = _CALLS[ctx.key]
        saved = ctx.saved_tensors
        inputs: List[Optional[torch.Tensor]] = [None] * ctx.n_inputs
        for i, t in zip(ctx.used, saved[:len(ctx.used)]):
            inputs[i] = t
        kept = list(saved[len(ctx.used):])
        res = torch.ops.dgl_exact_capture.backward(ctx.key, inputs, kept, list(grads[:call.n_out]))
        grads_in = [r if m[3] else None for r, m in zip(res, call.metas)]
        return None, grads_in

    torch.library.register_autograd("dgl_exact_capture::forward", _backward_formula, setup_context=_setup_context)


def _static(a) -> Any:
    if isinstance(a, CapturedStructure):
        return ("graph", a.key)
    if isinstance(a, CompressionConfig):
        return ("config", tuple(getattr(a, f) for f in _CFG_FIELDS))
    return a


def function(name: str) -> type:
    """The autograd Function ``name`` registered with :func:`capturable`."""
    try:
        return _FUNCTIONS[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a capturable Function (decorate it with ops.captured.capturable)") from None


def apply(name: str, *args, owned: Tuple[torch.Tensor, ...] = ()):
    """``Function.apply(*args)`` for the dgl_exact autograd Function named ``name``; while compiling, the
    captured custom ops. (Named, not passed: dynamo cannot hand a class's name to the registration.)

    ``owned``: tensors among ``args`` the caller states it allocated in this forward and nothing else reads
    (``keep.py`` rule 2, e.g. :func:`~.dense.linear_reusing`'s input): kept compressed, never by reference,
    although without autograd history (provenance is not tracked while compiling; see the module note)."""
    if not active():
        return function(name).apply(*args)
    tensors, statics = [], []
    for a in args:
        if isinstance(a, torch.Tensor):
            statics.append(("tensor", len(tensors)))
            tensors.append(a)
        elif isinstance(a, int) and not isinstance(a, bool) and a == RUNTIME_SEED:
            statics.append(("seed",))
        else:
            statics.append(_static(a))
    from .keep import captured_alive

    metas = tuple((tuple(t.shape), t.dtype, t.device, t.requires_grad and torch.is_grad_enabled(),
                   captured_alive(t) and not any(t is o for o in owned)) for t in tensors)
    dups = tuple(next(j for j in range(i + 1) if tensors[j] is tensors[i]) for i in range(len(tensors)))
    key = _call_key(name, tuple(statics), metas, dups)
    outs = torch.ops.dgl_exact_capture.forward(key, tensors)
    n_out, single = _outputs(key)
    # views: dynamo lets a view, not an element of the op's output list, carry the 'fresh' mark (keeping)
    outs = [o.view(o.shape) for o in outs[:n_out]]
    return outs[0] if single else tuple(outs)


@_assume_constant
def _outputs_n(key: str) -> int:
    return _CALLS[key].n_out


@_assume_constant
def _outputs_single(key: str) -> bool:
    return _CALLS[key].single


def _outputs(key: str):
    return _outputs_n(key), _outputs_single(key)
