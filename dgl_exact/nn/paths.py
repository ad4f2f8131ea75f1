"""Which path each module's call took: a fused fast path or the modules' own calls, and why.

A fast path (GCNII's fused stack, SAGEConv's fused mean layer, a donated input released early, ...) is
taken only where it computes what the modules compute (see :mod:`dgl_exact.ops.keep`); every path and its
conditions are declared in :mod:`dgl_exact.nn.fastpaths`, whose decisions leave the notes :func:`explain`
prints. Where a path is refused the step peak is higher; :func:`explain` says why, per module::

    >>> print(dgl_exact.explain(model, g, x))     # doctest: +SKIP
    module        type       path                                   why not fused
    convs.0       GCN2Conv   modules' own calls                     a module has hooks (...)

It also lists every op of the forward that keeps a floating-point tensor for backward uncompressed, with the
module it ran in, the user's source line and why (:class:`Fp32Op`): a functional torch call (``torch.tanh``,
``torch.cat``, ``x * y``: not a module, so :func:`~dgl_exact.compress_model` cannot convert it; ``F.relu`` and
the other calls of :func:`dgl_exact.ops.functional_ops` run compressed in a converted model), a torch or
DGL module without a dgl_exact version, a subclass of a convertible module, a DGL graph op or a Python
message function running outside a converted model's scope. What dgl_exact's own ops keep is their own
decision (compressed, or exact where the rules of :mod:`dgl_exact.ops.keep` require) and is not listed;
neither are parameters, the inputs given to :func:`explain`, nor what saved-tensor hooks
(``compress_model(..., saved_tensors=True)``) already compress.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import linecache
import os
import sys
from typing import Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn as nn

from ..ops.routing import message_passing_active

__all__ = ["Explanation", "Fp32Op", "explain", "record"]

_recorder: "contextvars.ContextVar[Optional[Dict[int, Tuple[Optional[str], str, Optional[str], bool]]]]" = \
    contextvars.ContextVar("dgl_exact_paths", default=None)

COMPOSED = "modules' own calls"


def record(modules: Iterable[nn.Module], path: Optional[str], reason: Optional[str] = None,
           key: Optional[str] = None, weak: bool = False) -> None:
    """Note, while :func:`explain` runs, that ``modules`` took ``path`` (None: the modules' own calls,
    because of ``reason``); ``key``: the fast path decided (:mod:`dgl_exact.nn.fastpaths`, whose decisions
    are the only callers). The first note per module wins (the outermost decision: a fused stack or run is
    decided before its modules run their own forwards), except that a later decision of the same path
    replaces it, and that any later note replaces a ``weak`` one (a model's gate refusing to ask a module's
    own path: what the module then decides itself is what ran). No-op otherwise."""
    seen = _recorder.get()
    if seen is None:
        return
    for m in modules:
        if id(m) not in seen or seen[id(m)][0] == key or seen[id(m)][3]:
            seen[id(m)] = (key, path or COMPOSED, reason, weak)


@contextlib.contextmanager
def _recording():
    token = _recorder.set({})
    try:
        yield _recorder.get()
    finally:
        _recorder.reset(token)


@dataclasses.dataclass
class Fp32Op:
    """An op of the forward that keeps ``bytes`` of floating-point tensors for backward uncompressed:
    ``module`` (qualified name of the module whose forward ran it, ``<root>`` for the model), ``op`` (the
    torch function, ``torch.nn.functional.relu``; or DGL's, ``dgl.update_all``), ``line`` (the user's source
    line), ``calls`` (how many times it ran), ``why`` (why it stays fp32 and what would compress it)."""

    module: str
    op: str
    line: str
    bytes: int
    calls: int
    why: str


@dataclasses.dataclass
class Explanation:
    """Per module (qualified name): its type, the path its last call took, and why a fast path was not;
    ``fp32``: the ops that keep floating-point tensors for backward uncompressed (:class:`Fp32Op`), largest
    first."""

    rows: List[Tuple[str, str, str, str]]
    fp32: List[Fp32Op] = dataclasses.field(default_factory=list)

    def path(self, name: str) -> str:
        return next(r[2] for r in self.rows if r[0] == name)

    def reason(self, name: str) -> str:
        return next(r[3] for r in self.rows if r[0] == name)

    def __str__(self):
        head = ("module", "type", "path", "why not fused")
        widths = [max(len(head[i]), *(len(r[i]) for r in self.rows)) if self.rows else len(head[i])
                  for i in range(3)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(head[:3], widths)) + "  " + head[3]]
        for r in self.rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3])
        if self.fp32:
            total = sum(op.bytes for op in self.fp32) / 2**20
            lines.append("")
            lines.append(f"kept in fp32 for backward (not compressed): {len(self.fp32)} op(s), {total:.2f} MiB")
            for op in self.fp32:
                calls = f" x{op.calls}" if op.calls > 1 else ""
                lines.append(f"  {op.bytes / 2**20:.2f} MiB  {op.module}: {op.op}{calls} at {op.line}")
                lines.append(f"      why: {op.why}")
        return "\n".join(lines)


def explain(model: nn.Module, *inputs, **kwargs) -> Explanation:
    """Run ``model(*inputs, **kwargs)`` once (in its current train/eval mode, grad enabled, no backward) and
    list, for each dgl_exact module and each module a fused path covered, which path its call took and
    why a fast path was refused (a module that decides no fast path here may say itself, by an
    ``explain_path()`` method returning ``(path, why)`` or None: :mod:`dgl_exact.pyg`'s drop-ins name the
    setting for which they run PyG's code). Running it draws random numbers and, in training mode, updates batch
    norm's running statistics, as any forward does."""
    from ..ops.saved import observe_saved, tensors_in

    names = {id(m): name or "<root>" for name, m in model.named_modules()}
    static = {_storage(t) for t in (*model.parameters(), *model.buffers())}
    static |= {_storage(t) for t in tensors_in((inputs, kwargs))}
    kept: Dict[tuple, list] = {}
    seen_storages: set = set()

    def on_saved(t):
        if not t.is_floating_point() or isinstance(t, nn.Parameter):
            return
        key = _storage(t)
        if key in static or key in seen_storages:
            return
        found = _fp32_origin(names)
        if found is not None:
            seen_storages.add(key)
            entry = kept.setdefault(found, [0, 0])
            entry[0] += t.untyped_storage().nbytes()
            entry[1] += 1

    # the observer leaves dgl_exact's private keeping (fused paths) in force: the paths reported are training's
    with _recording() as seen, torch.enable_grad(), observe_saved(on_saved):
        model(*inputs, **kwargs)
    fp32 = sorted((Fp32Op(module, op, line, n, calls, why) for (module, op, line, why), (n, calls) in kept.items()),
                  key=lambda o: (-o.bytes, o.module, o.line))
    rows = []
    for name, m in model.named_modules():
        entry = seen.get(id(m))
        if entry is None:
            if not type(m).__module__.startswith("dgl_exact."):
                continue
            own = getattr(m, "explain_path", None)  # a module that runs another library's code for some settings
            found = own() if callable(own) else None
            entry = (None, *found, False) if found is not None else (None, COMPOSED, "", False)
        rows.append((name or "<root>", type(m).__name__, entry[1], entry[2] or ""))
    return Explanation(rows, fp32)


def _storage(t: torch.Tensor) -> tuple:
    return t.device.type, t.device.index, t.untyped_storage().data_ptr()


def _root(name: str) -> str:
    spec = sys.modules.get(name)
    return os.path.dirname(os.path.realpath(spec.__file__)) + os.sep if spec and spec.__file__ else "\0"


_DGL_EXACT = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep
_TORCH = _root("torch")
_STDLIB = os.path.dirname(os.path.realpath(contextlib.__file__)) + os.sep


def _fp32_origin(names: Dict[int, str]) -> Optional[Tuple[str, str, str, str]]:
    """(module, op, line, why) of the tensor being saved now, from the Python stack; None where one of
    dgl_exact's ops saves it (its own decision)."""
    dgl_root = _root("dgl")
    frames = []
    f = sys._getframe(1)
    while f is not None and not (f.f_code.co_name == "explain" and f.f_code.co_filename == __file__):
        frames.append(f)
        f = f.f_back
    frames.reverse()                                    # outermost first: what explain's model call ran
    frames = frames[:-2]                                # the observer: its pack hook and on_saved
    module, module_frame = None, -1
    for i, fr in enumerate(frames):
        path = os.path.realpath(fr.f_code.co_filename)
        if fr.f_code.co_name == "__torch_function__":
            continue                                    # a scope's torch-function mode passing a call on
        if path.startswith(_DGL_EXACT) and not path.startswith(_DGL_EXACT + "bench" + os.sep):
            return None                                 # saved by dgl_exact (an op, a converted module, a hook)
        if fr.f_code.co_name == "forward":
            owner = fr.f_locals.get("self")
            if isinstance(owner, nn.Module) and id(owner) in names:
                module, module_frame = owner, i
    if module is None:
        return None
    # the user's line: the innermost frame outside torch, DGL, dgl_exact and the standard library
    user, user_index = None, -1
    for i in range(len(frames) - 1, -1, -1):
        path = os.path.realpath(frames[i].f_code.co_filename)
        if not (path.startswith((_TORCH, dgl_root, _STDLIB)) or
                (path.startswith(_DGL_EXACT) and not path.startswith(_DGL_EXACT + "bench" + os.sep))):
            user, user_index = frames[i], i
            break
    inner = frames[user_index + 1:] if user is not None else []
    line = "?"
    if user is not None:
        code = linecache.getline(user.f_code.co_filename, user.f_lineno).strip()
        short = "/".join(user.f_code.co_filename.split(os.sep)[-2:])
        line = f"{short}:{user.f_lineno}" + (f" {code[:70]}" if code else "")
    in_dgl = [fr for fr in inner if os.path.realpath(fr.f_code.co_filename).startswith(dgl_root)]
    in_torch = [fr for fr in inner if os.path.realpath(fr.f_code.co_filename).startswith(_TORCH)]
    owner_type = type(module)
    owner_pkg = owner_type.__module__.split(".")[0]
    name = names[id(module)]
    fallback = "; compress_model(..., saved_tensors=True) compresses it through saved-tensor hooks"
    between = frames[module_frame + 1:user_index] if user_index > module_frame else []
    called_by_dgl = any(os.path.realpath(fr.f_code.co_filename).startswith(dgl_root) for fr in between)
    if called_by_dgl and user is not None and user.f_code.co_name != "forward":
        # a Python function DGL called: a user-defined message or reduce function
        return (name, f"Python function {user.f_code.co_name}", line,
                "a user-defined (Python) message or reduce function: runs as DGL runs it" + fallback)
    if in_dgl:
        op = f"dgl.{in_dgl[0].f_code.co_name}"
        if owner_pkg == "dgl":
            return (name, op, line, f"{owner_type.__name__} ({owner_type.__module__}) has no dgl_exact version, "
                    "or a subclass of one: not converted" + fallback)
        if message_passing_active():
            return (name, op, line, "DGL's own op inside a converted model's scope: called directly (dgl.ops.<op>, "
                    "which the scope does not route; edge_softmax and message passing it does), or on a graph with "
                    "several edge types; call dgl_exact.ops.<op> instead" + fallback)
        return (name, op, line, "a DGL graph op outside a converted model's scope (call it inside a model "
                "converted by dgl_exact.compress_model, whose scope runs DGL's message passing compressed)"
                + fallback)
    op = ".".join(filter(None, (in_torch[0].f_globals.get("__name__"), in_torch[0].f_code.co_name))) \
        if in_torch else "a torch operator"
    if owner_pkg in ("torch", "dgl"):
        return (name, f"{owner_type.__name__}", line, f"{owner_pkg}.{owner_type.__name__} has no dgl_exact "
                "version, or is a subclass of a converted type: not converted" + fallback)
    if in_torch:
        return (name, op, line, "a functional torch call in a custom module's forward: not a module, so "
                "compress_model cannot convert it (inside a converted model's forward, F.relu, leaky_relu, elu, "
                "gelu, silu and dropout run on dgl_exact's ops: dgl_exact.ops.functional_ops; for others use the "
                "module form where one exists)" + fallback)
    return (name, "a torch operator", line, "a tensor operation in a custom module's forward (x * y, x @ w, "
            "torch.cat): not a module, so compress_model cannot convert it" + fallback)
