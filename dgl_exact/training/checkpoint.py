"""Atomic, weights-only checkpoints: a run interrupted at any moment loses at most the epoch in progress,
and reading a checkpoint never runs code from it.

Format. A checkpoint is ``torch.save`` of a dict that holds only tensors and plain Python values
(``dict``, ``list``, ``tuple``, ``str``, ``int``, ``float``, ``bool``, ``None``); :func:`save_checkpoint`
refuses anything else, so every file it writes can be read back by :func:`load_checkpoint` with
``torch.load(weights_only=True)`` on every supported torch (2.1 and later, no safe-globals registry needed).
``weights_only=True`` is passed explicitly, which also overrides ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import re
import signal
import threading
import warnings
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import torch

from .._files import atomic_write, remove_stale_temporaries

__all__ = ["RunState", "save_checkpoint", "load_checkpoint", "check_trainer_state", "remove_stale_temporaries",
           "signals_held", "plain", "FORMAT_VERSION"]

FORMAT_VERSION = 1

# Keys (and their types) every checkpoint written by the trainer holds.
_REQUIRED = {"config": dict, "run": int, "epoch": int, "model": dict, "optimizer": dict, "rng_cpu": torch.Tensor,
             "best": dict, "history": list, "completed": list}

# How torch's weights-only unpickler names a global it refused (torch 2.1: class, later: global).
_UNSAFE_GLOBAL = re.compile(r"Unsupported (?:global: GLOBAL |class )([\w.]+)")

_HELD_SIGNALS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)) if s)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C / SIGTERM inside the block and deliver them when it ends.

    An interrupt raised inside ``torch.save`` surfaces as a ``RuntimeError`` from its C++ writer (not as
    ``KeyboardInterrupt``), so a user pressing Ctrl-C at the wrong millisecond would get a crash instead of a
    clean stop. Writing a checkpoint takes milliseconds; the signal waits that long, then acts as usual.
    Signal handlers can only be changed from the main thread; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending = []
    previous = {}
    try:
        for sig in _HELD_SIGNALS:
            previous[sig] = signal.signal(sig, lambda signum, frame: pending.append(signum))
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pending:
            signal.raise_signal(pending[0])


def plain(obj: Any, where: str = "state") -> Any:
    """``obj`` with numpy scalars (and other subclasses of Python numbers) turned into Python numbers;
    ``TypeError`` for anything ``torch.load(weights_only=True)`` could not read back, so that a failure shows
    at the first save, not on ``--resume``. Containers: ``dict`` (``OrderedDict`` kept, with a module state
    dict's ``_metadata``), ``list``, ``tuple``; dict keys must be ``str`` or ``int``."""
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if isinstance(obj, torch.Tensor):
        return obj if type(obj) in (torch.Tensor, torch.nn.Parameter) else obj.detach().as_subclass(torch.Tensor)
    if isinstance(obj, dict):
        out: Dict[Any, Any] = collections.OrderedDict() if isinstance(obj, collections.OrderedDict) else {}
        for k, v in obj.items():
            if type(k) not in (str, int):
                raise TypeError(f"cannot checkpoint {where}: key {k!r} of type {type(k).__name__}")
            out[k] = plain(v, f"{where}[{k!r}]")
        if isinstance(out, collections.OrderedDict) and hasattr(obj, "_metadata"):
            out._metadata = plain(obj._metadata, f"{where}._metadata")  # type: ignore[attr-defined]
        return out
    if isinstance(obj, (list, tuple)):
        items = [plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    if isinstance(obj, np.generic) and obj.ndim == 0:
        return plain(obj.item(), where)
    for base in (bool, int, float, str):  # e.g. an IntEnum: stored as the plain value
        if isinstance(obj, base):
            return base(obj)
    raise TypeError(f"cannot checkpoint {where}: {type(obj).__module__}.{type(obj).__qualname__} is not a tensor "
                    "or a plain Python value, and checkpoints are read back weights-only")


def save_checkpoint(state: Dict[str, Any], path: str) -> None:
    """Write ``state`` to ``path`` atomically (temporary file in the same folder, fsync, rename).

    ``state`` must hold only tensors and plain Python values (see :func:`plain`; ``TypeError`` otherwise).
    The temporary file is ``.<name>.partial-<pid>-XXXXXXXX``; those of the same target whose writer no longer
    runs (killed with SIGKILL) are removed first, never a live writer's. A failure to write (disk full, ...)
    leaves the previous checkpoint as it was and raises one :class:`~dgl_exact.errors.WriteError` naming the
    path and the cause. Ctrl-C or SIGTERM arriving meanwhile is delivered once the file is in place
    (:func:`signals_held`).
    """
    payload = plain({"format": FORMAT_VERSION, **state})
    with signals_held():
        remove_stale_temporaries(path)
        with atomic_write(path) as f:
            torch.save(payload, f)


def load_checkpoint(path: str) -> Dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`, weights-only (no code from the file runs).

    Raises ``FileNotFoundError`` if there is none, and one ``ValueError`` naming the file and what to do
    if it is empty, truncated, not a checkpoint, holds objects other than tensors and plain values, or
    lacks what the trainer needs.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path} (run with --checkpoint {path} first, without --resume)")
    if os.path.isdir(path):
        raise ValueError(f"--checkpoint {path} is a folder; pass the checkpoint file")
    fix = "delete it or pass another --checkpoint path to start over (without --resume)"
    if os.path.getsize(path) == 0:
        raise ValueError(f"checkpoint {path} is empty (the run that wrote it was killed?): {fix}")
    try:
        with warnings.catch_warnings():  # torch's remarks on the pickle protocol of a file we reject anyway
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - every failure to read means the same to the user
        unsafe = _UNSAFE_GLOBAL.search(str(e))
        if unsafe:
            raise ValueError(f"checkpoint {path} holds an object other than tensors and plain Python values "
                             f"({unsafe.group(1)}), which dgl_exact refuses to load because loading it could run "
                             f"code; {fix}") from None
        reason = (str(e).strip().splitlines() or [""])[0][:160]
        raise ValueError(f"checkpoint {path} cannot be read (truncated, corrupted or not a dgl_exact checkpoint: "
                         f"{type(e).__name__}{': ' + reason if reason else ''}); {fix}") from None
    if not isinstance(state, dict) or "format" not in state:
        raise ValueError(f"{path} is not a dgl_exact checkpoint; {fix}")
    if state["format"] != FORMAT_VERSION:
        raise ValueError(f"{path}: unsupported checkpoint format {state['format']!r} (this dgl_exact writes "
                         f"{FORMAT_VERSION}); {fix}")
    return state


def check_trainer_state(state: Dict[str, Any], path: str) -> None:
    """``ValueError`` unless ``state`` holds every key the trainer resumes from, with the right type."""
    bad = [k for k, t in _REQUIRED.items() if not isinstance(state.get(k), t) or isinstance(state.get(k), bool)]
    # epoch -1: saved inside the first epoch (--checkpoint-batches), after ``batch`` > 0 of its batches
    inside_first = type(state.get("batch")) is int and state["batch"] > 0
    if not bad and (state["epoch"] < (-1 if inside_first else 0) or state["run"] < 0):
        bad = ["epoch" if state["epoch"] < 0 else "run"]
    if bad:
        raise ValueError(f"checkpoint {path} is incomplete or damaged (bad or missing: {', '.join(bad)}); delete it "
                         "or pass another --checkpoint path to start over (without --resume)")


@dataclasses.dataclass
class RunState:
    """Where one run of a :class:`~dgl_exact.training.trainer.Trainer` stands after a finished epoch:
    exactly what its checkpoint holds, and what ``--resume`` continues from.

    ``epoch`` is the last finished epoch (-1 before the first); ``best`` the metrics of the epoch with the
    best validation score so far (``val``, ``epoch``, ``train``, ``test``); ``history`` one record per
    finished epoch; ``completed`` the results of the runs finished before this one (``RunResult`` as
    dicts, this run's own added when it ends). ``model``, ``optimizer`` and ``scaler`` are state dicts
    and ``rng_cpu`` / ``rng_cuda`` torch's random state, all taken at the end of ``epoch``;
    ``activation_bytes`` / ``peak_bytes``: the ``--debug-mem`` measurement, once made. ``batch``: saved
    inside epoch ``epoch + 1`` (``--checkpoint-batches``), the number of its batches already trained, with
    their losses in ``batch_losses`` (0 and empty at an epoch's end); the weights and random state are then
    those after that batch. ``config`` (the run's options) and ``recorded`` (its world size, memory budget and
    plan, data fingerprint; None in checkpoints written before it existed) are what ``--resume`` checks
    (:mod:`.resume`).
    """

    config: Dict[str, Any]
    run: int
    epoch: int = -1
    best: Dict[str, Any] = dataclasses.field(default_factory=lambda: {"val": -float("inf"), "epoch": -1})
    history: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    completed: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    model: Dict[str, Any] = dataclasses.field(default_factory=dict)
    optimizer: Dict[str, Any] = dataclasses.field(default_factory=dict)
    scaler: Optional[Dict[str, Any]] = None
    rng_cpu: Optional[torch.Tensor] = None
    rng_cuda: Optional[torch.Tensor] = None
    activation_bytes: Optional[int] = None
    peak_bytes: Optional[int] = None
    batch: int = 0
    batch_losses: List[float] = dataclasses.field(default_factory=list)
    recorded: Optional[Dict[str, Any]] = None

    def to_checkpoint(self) -> Dict[str, Any]:
        """The checkpoint's dict (what :func:`save_checkpoint` writes)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_checkpoint(cls, state: Dict[str, Any], path: str) -> "RunState":
        """The run state of a checkpoint's dict (read by :func:`load_checkpoint` from ``path``); one
        ``ValueError`` naming ``path`` if a key the trainer needs is missing or has the wrong type."""
        check_trainer_state(state, path)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in state.items() if k in names})

    def save(self, path: str) -> None:
        """Write this state to ``path`` atomically (:func:`save_checkpoint`)."""
        save_checkpoint(self.to_checkpoint(), path)

    @classmethod
    def load(cls, path: str) -> "RunState":
        """Read and validate the checkpoint at ``path`` (weights-only: :func:`load_checkpoint`)."""
        return cls.from_checkpoint(load_checkpoint(path), path)
