"""Engines of the ``numba`` backend (:mod:`.numba_kernels`): how arrays reach its kernels and how kernels are
launched, on the CPU (a thread pool over ranges of work units) and on CUDA or its simulator (a grid)."""
from __future__ import annotations

import contextlib
import os
import threading

import torch

__all__ = ["CpuEngine", "CudaEngine"]


class CpuEngine:
    """Serial ``nogil`` kernels, each call split into contiguous unit ranges run on a thread pool of
    ``torch.get_num_threads()`` threads (small calls run inline)."""

    name = "numba CPU"
    min_units_per_thread = 1 << 15

    def __init__(self, module):
        self.module = module
        self._pool = None
        self._pool_key = None
        self._pool_lock = threading.Lock()
        if hasattr(os, "register_at_fork"):  # a forked child has none of the parent's pool threads
            os.register_at_fork(after_in_child=self._reset_pool)

    def _reset_pool(self):
        self._pool = None
        self._pool_key = None
        self._pool_lock = threading.Lock()

    @staticmethod
    def array(t: torch.Tensor):
        return t.detach().numpy()

    def scope(self, device):
        return contextlib.nullcontext()

    def _executor(self, workers: int):
        key = (os.getpid(), workers)
        with self._pool_lock:
            if self._pool_key != key:
                from concurrent.futures import ThreadPoolExecutor

                if self._pool is not None and self._pool_key[0] == os.getpid():
                    self._pool.shutdown(wait=False)
                self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dgl_exact_numba")
                self._pool_key = key
            return self._pool

    def launch(self, kernel: str, units: int, device, *args, unit_bytes: int = 1):
        """``kernel(*args, start, end)`` over ``units`` work units, split across threads where each thread
        gets at least :attr:`min_units_per_thread` bytes of work (``unit_bytes``: bytes per unit)."""
        fn = getattr(self.module, kernel)
        threads = max(1, min(torch.get_num_threads(), units * unit_bytes // self.min_units_per_thread))
        with torch.profiler.record_function(f"dgl_exact::numba::{kernel}"):  # named in torch's profiler tables
            if threads == 1:
                fn(*args, 0, units)
                return
            per = -(-units // threads)
            bounds = [(a, min(units, a + per)) for a in range(0, units, per)]
            pool = self._executor(torch.get_num_threads() - 1)  # the calling thread runs the first range
            futures = [pool.submit(fn, *args, a, b) for a, b in bounds[1:]]
            try:
                fn(*args, *bounds[0])
            finally:
                for f in futures:
                    f.result()


class CudaEngine:
    """Numba CUDA kernels; with ``simulator=True`` they run in Numba's simulator on CPU tensors."""

    def __init__(self, module, cuda, simulator: bool):
        self.module = module
        self.cuda = cuda
        self.simulator = simulator
        self.name = "numba CUDA simulator" if simulator else "numba CUDA"
        # the simulator runs one Python thread per CUDA thread: few, small blocks (grid-stride loops
        # cover the rest, which also exercises them)
        self.threads = 32 if simulator else 256
        self.max_blocks = 4 if simulator else 65535

    def array(self, t: torch.Tensor):
        t = t.detach()
        if t.is_cuda:
            return self.cuda.as_cuda_array(t, sync=False)  # we launch on torch's current stream
        if self.simulator:
            return t.numpy()
        raise ValueError("the Numba CUDA kernels need CUDA tensors")

    def scope(self, device):
        if device.type != "cuda":
            return contextlib.nullcontext()
        index = device.index if device.index is not None else torch.cuda.current_device()
        return self.cuda.gpus[index]

    def launch(self, kernel: str, units: int, device, *args, unit_bytes: int = 1):
        fn = getattr(self.module, kernel)
        blocks = max(1, min(self.max_blocks, -(-units // self.threads)))
        if device.type == "cuda":
            stream = self.cuda.external_stream(torch.cuda.current_stream(device).cuda_stream)
            fn[blocks, self.threads, stream](*args)
        else:
            fn[blocks, self.threads](*args)
