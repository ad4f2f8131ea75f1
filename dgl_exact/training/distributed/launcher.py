"""``dgl-exact train --nproc N``: start N workers on this machine, watch them, stop them (:func:`launch`)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ... import _environment
from ..._files import atomic_write
from ...errors import WriteError
from ..config import TrainConfig
from .environment import CHILD_ENV

__all__ = ["launch", "free_port", "cpu_cores", "OVERSUBSCRIBE_ENV"]

OVERSUBSCRIBE_ENV = "DGL_EXACT_OVERSUBSCRIBE"  # "1": `launch` may start more CPU workers than there are cores


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else all)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _check_cpu_workers(nproc: int) -> None:
    """CPU workers are full training processes (each its own copy of the graph, the model, the activations
    and a torch runtime): more of them than cores only multiply memory and contention."""
    cores = cpu_cores()
    if nproc > cores and not _environment.read(OVERSUBSCRIBE_ENV):
        raise ValueError(f"--nproc {nproc} on the CPU would start {nproc} training processes on {cores} CPU core(s); "
                         f"each holds its own graph, model and activations, so more processes than cores only add "
                         f"memory and contention: use --nproc {cores} or fewer (or set {OVERSUBSCRIBE_ENV}=1 to "
                         "start them anyway)")


def _worker_preexec():
    """In a worker, before exec: its own process group, so that a terminal's Ctrl-C (SIGINT to the
    foreground group) reaches only the launcher, which then stops the workers quietly; and (Linux) SIGTERM
    when the launcher dies, so no worker outlives it."""
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except Exception:  # noqa: BLE001 - best effort
            pass


def launch(nproc: int, config: TrainConfig, args: Sequence[str] = (), *, grace: float = 10.0,
           timeout: Optional[float] = None, env: Optional[Dict[str, str]] = None,
           log: Callable[[str], None] = None) -> int:
    """Run ``dgl-exact train`` with ``config`` in ``nproc`` worker processes on this machine; return the
    exit status (0, or that of the first worker that failed).

    ``args`` are further ``train`` options for the workers (``--json``, ``--checkpoint``, ...). The
    workers get torchrun's environment (``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``, ``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``) and, unless set, ``OMP_NUM_THREADS`` = CPU cores
    / ``nproc``. When a worker exits non-zero the others get ``grace`` seconds to notice and exit by
    themselves, then SIGTERM, then SIGKILL. With ``timeout`` (seconds) all workers are stopped after that
    long and 124 is returned.

    On the CPU at most :func:`cpu_cores` workers are started (``ValueError`` beyond, unless the environment
    sets ``DGL_EXACT_OVERSUBSCRIBE=1``). Workers run in their own process group: a Ctrl-C (or SIGTERM) of
    the launcher reaches the launcher alone, which logs one line, sends every worker SIGTERM (a worker
    still starting up just ends; one that trains stops like an interrupted ``train``, keeping its last
    checkpoint, silently) and returns 130; a second Ctrl-C kills them at once.
    """
    import yaml

    if log is None:
        def log(msg):
            print(msg, file=sys.stderr, flush=True)
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    if config.device in ("auto", "cuda") and torch.cuda.is_available():
        if nproc > torch.cuda.device_count():
            raise ValueError(f"--nproc {nproc} needs {nproc} GPUs (one per process, NCCL), torch sees "
                             f"{torch.cuda.device_count()}: use fewer processes or --device cpu")
    elif not str(config.device).startswith("cuda"):
        _check_cpu_workers(nproc)
    base = dict(os.environ if env is None else env)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    base["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in [base.get("PYTHONPATH")] if p])
    if "OMP_NUM_THREADS" not in base:
        base["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    try:
        folder = tempfile.mkdtemp(prefix="dgl-exact-launch-")
    except OSError as e:
        raise WriteError(os.path.join(tempfile.gettempdir(), "dgl-exact-launch-*"), e) from None
    conf = os.path.join(folder, "config.yaml")
    with atomic_write(conf, "w", encoding="utf-8") as f:
        yaml.safe_dump(config.to_dict(), f)
    command = [sys.executable, "-m", "dgl_exact", "train", "--conf", conf, *args]
    port = free_port()
    procs: List[subprocess.Popen] = []
    started = time.time()
    try:
        for rank in range(nproc):
            child_env = {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                         "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
                         "GROUP_RANK": "0", "NODE_RANK": "0", CHILD_ENV: "1"}
            procs.append(subprocess.Popen(command, env=child_env,
                                          preexec_fn=_worker_preexec if os.name == "posix" else None))
        return _monitor(procs, grace, log, timeout)
    except KeyboardInterrupt:
        log(_interrupted_line(procs, args, started))
        _stop_interrupted(procs)
        return 130
    finally:
        _stop_interrupted(procs)
        try:
            os.unlink(conf)
            os.rmdir(folder)
        except OSError:
            pass


def _monitor(procs: List[subprocess.Popen], grace: float, log, timeout: Optional[float] = None) -> int:
    failed, deadline, terminated = None, None, False
    reported = set()
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        if end is not None and time.monotonic() > end:
            log(f"error: the workers did not finish within {timeout:g} s: stopping them")
            _stop(procs, signal.SIGTERM, 10.0)
            return 124
        running = 0
        for rank, p in enumerate(procs):
            code = p.poll()
            if code is None:
                running += 1
            elif code != 0 and rank not in reported:
                # Ranks that fail together (one dies, the others' collectives fail at once) may all be seen in
                # one poll: report each, since which one failed first is then unknown.
                reported.add(rank)
                if failed is None:
                    failed = (rank, code)
                    deadline = time.monotonic() + grace
                log(f"error: rank {rank} exited with status {code}"
                    + ("; stopping the other ranks" if failed[0] == rank else ""))
        if running == 0:
            break
        if failed is not None and not terminated and time.monotonic() > deadline:
            log(f"error: {running} rank(s) still running {grace:g} s after rank {failed[0]} failed: terminating them")
            _stop(procs, signal.SIGTERM, 10.0)
            terminated = True
        time.sleep(0.1)
    if failed is None:
        return 0
    return failed[1] if failed[1] > 0 else 1


def _interrupted_line(procs: List[subprocess.Popen], args: Sequence[str], started: float) -> str:
    """The launcher's one line on Ctrl-C (the workers say nothing): what is stopped, what is kept."""
    args = list(args)
    running = sum(p.poll() is None for p in procs)
    line = f"interrupted: stopping {running} worker process(es)"
    if "--checkpoint" in args[:-1]:
        checkpoint = args[args.index("--checkpoint") + 1]
        try:
            saved = os.path.getmtime(checkpoint) >= started or "--resume" in args
        except OSError:
            saved = False
        line += (f"; the last finished epoch is saved in {checkpoint}: rerun with --resume" if saved else
                 f"; no epoch finished: no checkpoint was written to {checkpoint}")
    return line


def _stop_interrupted(procs: List[subprocess.Popen]) -> None:
    """SIGTERM to every worker, SIGKILL after 10 s; another Ctrl-C meanwhile kills them at once."""
    try:
        _stop(procs, signal.SIGTERM, 10.0)
    except KeyboardInterrupt:
        _stop(procs, signal.SIGKILL, 10.0)


def _stop(procs: List[subprocess.Popen], sig, wait: float) -> None:
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        try:
            p.send_signal(sig)
        except OSError:
            pass
    end = time.monotonic() + wait
    for p in alive:
        try:
            p.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
