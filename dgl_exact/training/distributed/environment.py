"""The environment of a data-parallel worker: joining the process group, this worker's device and random
streams, leaving the group, and what a failed collective looks like (see :mod:`dgl_exact.training.distributed`)."""
from __future__ import annotations

import dataclasses
import datetime
import inspect
import os
import sys
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

from ... import _environment
from ..trainer import resolve_device

__all__ = ["DistContext", "DistributedError", "init_distributed", "shutdown", "exit_worker", "in_distributed_env",
           "is_launched_child", "device_for_rank", "rank_seed", "seed_all", "first_line", "is_comm_error",
           "DEFAULT_TIMEOUT", "DEFAULT_SETUP_TIMEOUT", "TIMEOUT_ENV", "SETUP_TIMEOUT_ENV", "CHILD_ENV",
           "FULL_GRAPH_ERROR"]

DEFAULT_TIMEOUT = 60.0           # s: collectives of a training step (a dead / hung rank is noticed within this)
DEFAULT_SETUP_TIMEOUT = 1800.0   # s: waits for rank-0-only work (caches, METIS, evaluation, checkpoints)
TIMEOUT_ENV = "DGL_EXACT_DIST_TIMEOUT"
SETUP_TIMEOUT_ENV = "DGL_EXACT_DIST_SETUP_TIMEOUT"
CHILD_ENV = "DGL_EXACT_NPROC_CHILD"      # set by `launch` in its workers
FULL_GRAPH_ERROR = ("multi-process training needs a mini-batch sampler (--sampler saint, cluster or neighbor); "
                    "full-graph training runs in one process")
_RNG_STREAM = 0x5EED  # keeps rank_seed's streams apart from the samplers'
_DistError = getattr(dist, "DistError", RuntimeError)  # torch >= 2.1; plain RuntimeError before


class DistributedError(RuntimeError):
    """A collective failed or another rank failed: the run cannot continue (resume from the checkpoint)."""


def _env_int(name: str, default: int) -> int:
    return _environment.read(name, default)


def in_distributed_env() -> bool:
    """Whether this process is one of several workers (torchrun or ``--nproc`` set ``WORLD_SIZE > 1``)."""
    return _env_int("WORLD_SIZE", 1) > 1


def is_launched_child() -> bool:
    """Whether this process was started by :func:`launch` (``dgl-exact train --nproc``)."""
    return _environment.read(CHILD_ENV) == "1"


def _env_seconds(name: str, default: float) -> float:
    return _environment.read(name, default)


def rank_seed(seed: int, rank: int, epoch: int) -> int:
    """The seed of torch's default generator on ``rank`` at the start of ``epoch`` (non-negative, 63 bit).

    Distinct ranks and epochs get statistically independent streams; the same ``(seed, rank, epoch)``
    always gets the same one (what makes a resumed run continue bit for bit).
    """
    state = np.random.SeedSequence([int(seed), _RNG_STREAM, int(rank), int(epoch)]).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))


def device_for_rank(spec: Optional[str], local_rank: int, local_world_size: int) -> torch.device:
    """The device of the worker with ``local_rank`` on its machine: ``cuda:LOCAL_RANK`` for ``auto`` (when
    CUDA is available) or ``cuda``; ``cpu`` for ``cpu``; ``cuda:N`` only with one worker per machine."""
    spec = (spec or "auto").strip()
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device 'cuda' requested but torch sees no CUDA GPU (torch {torch.__version__})")
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"local rank {local_rank} has no GPU of its own: torch sees "
                             f"{torch.cuda.device_count()} CUDA device(s); start at most that many processes "
                             "per machine")
        return torch.device("cuda", local_rank)
    device = resolve_device(spec)
    if device.type == "cuda" and local_world_size > 1:
        raise ValueError(f"--device {spec} with {local_world_size} processes per machine: use --device cuda "
                         "(or auto): each process takes the GPU of its local rank")
    return device


@dataclasses.dataclass
class DistContext:
    """This worker's place in the job and the groups it talks through."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str                     # of the default group: "nccl" (CUDA) or "gloo" (CPU)
    timeout: float                   # s, default group (training collectives)
    setup_timeout: float             # s, control group
    control: Any = None              # gloo group for barriers / small objects around rank-0-only work

    def describe(self) -> str:
        return f"{self.world_size} processes ({self.backend}, rank {self.rank}, timeout {self.timeout:g} s)"


_CONTEXT: Optional[DistContext] = None


def init_distributed(device: Optional[str] = "auto", timeout: Optional[float] = None,
                     setup_timeout: Optional[float] = None) -> DistContext:
    """Join the job described by torchrun's environment variables (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and return its context.

    The default group uses NCCL when this worker's device is a GPU, gloo otherwise, with ``timeout``
    seconds (default ``$DGL_EXACT_DIST_TIMEOUT`` or 60; also bounds the rendezvous). A second gloo group
    with ``setup_timeout`` seconds (default ``$DGL_EXACT_DIST_SETUP_TIMEOUT`` or 1800) carries the waits
    for rank-0-only work. Calling it again returns the same context.
    """
    global _CONTEXT
    if _CONTEXT is not None and dist.is_initialized():
        return _CONTEXT
    if not dist.is_available():
        raise DistributedError("this torch build has no torch.distributed")
    timeout = _env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT) if timeout is None else float(timeout)
    setup_timeout = (_env_seconds(SETUP_TIMEOUT_ENV, DEFAULT_SETUP_TIMEOUT) if setup_timeout is None
                     else float(setup_timeout))
    if timeout <= 0 or setup_timeout <= 0:
        raise ValueError("distributed timeouts must be > 0 seconds")
    setup_timeout = max(setup_timeout, timeout)
    if dist.is_initialized():  # the caller set up the process group itself
        rank, world_size = dist.get_rank(), dist.get_world_size()
    else:
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
        if missing:
            raise ValueError(f"distributed training needs the environment variables {', '.join(missing)} "
                             "(set by torchrun or dgl-exact train --nproc)")
        _environment.check()  # ranks below their sizes, a port number
        rank, world_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", rank)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size)
    dev = device_for_rank(device, local_rank, local_world_size)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        kwargs = {}
        if backend == "nccl" and "device_id" in inspect.signature(dist.init_process_group).parameters:
            kwargs["device_id"] = dev  # torch >= 2.3: bind the communicator to this GPU eagerly
        try:
            dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=timeout), **kwargs)
        except (RuntimeError, _DistError) as e:
            raise DistributedError(f"rank {rank}: could not join the process group at "
                                   f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} within "
                                   f"{timeout:g} s: {first_line(e)}") from e
    backend = dist.get_backend()
    control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=setup_timeout))
    _CONTEXT = DistContext(rank, world_size, local_rank, local_world_size, dev, backend, timeout, setup_timeout,
                           control)
    return _CONTEXT


def _quiesce() -> None:
    """Barriers on the control and the main group: every rank is done, and the gloo worker threads have let
    go of the last collectives' tensors (they need the GIL for that; see :func:`shutdown`)."""
    if _CONTEXT is not None:
        dist.barrier(group=_CONTEXT.control)
    dist.barrier()


def shutdown() -> None:
    """Leave the process group (after a successful run; a failed one just exits).

    On torch before 2.8 (pytorch/pytorch#56297, fixed by #154976) destroying a gloo process group holds the
    GIL while it joins gloo's worker threads, and a worker thread dropping the last reference to a tensor
    of a Python-level collective (``all_gather_object`` and friends) needs the GIL: a deadlock, seen at the
    end of runs. Barriers first (they wait with the GIL released) make that very unlikely; the command line
    does not destroy at all (:func:`exit_worker`).
    """
    global _CONTEXT
    if dist.is_available() and dist.is_initialized():
        _quiesce()
        dist.destroy_process_group()
    _CONTEXT = None


def exit_worker(code: int) -> None:
    """End a ``dgl-exact train`` worker process: barriers, flush, and exit without tearing down the process
    group or the interpreter, which on older torch can deadlock or abort in gloo's destructor
    (:func:`shutdown`). Nothing is left to clean up: results and checkpoints are written and closed."""
    global _CONTEXT
    try:
        if code == 0 and dist.is_available() and dist.is_initialized():
            _quiesce()
    except Exception as e:  # noqa: BLE001 - another rank failed after this one finished
        rank = _CONTEXT.rank if _CONTEXT is not None else "?"
        print(f"error: rank {rank}: the final barrier failed: {first_line(e)}", file=sys.stderr)
        code = 1
    finally:
        _CONTEXT = None
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe must not change the exit status
                pass
        os._exit(code)


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


_COMM_MARKERS = ("gloo", "nccl", "c10d", "connection", "timed out", "timeout", "processgroup", "socket",
                 "broken pipe", "peer")


def is_comm_error(e: BaseException) -> bool:
    if isinstance(e, DistributedError) or (_DistError is not RuntimeError and isinstance(e, _DistError)):
        return True
    return isinstance(e, RuntimeError) and any(m in str(e).lower() for m in _COMM_MARKERS)


def seed_all(seed: int) -> None:
    """Seed torch's default generators (CPU and every CUDA device)."""
    torch.manual_seed(seed)
