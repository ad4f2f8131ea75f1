"""Helpers shared by the tests of files read back from disk (checkpoints, sampler caches): a pickle payload
that would run code if unpickled."""
import pickle

import torch

import dgl_exact  # noqa: F401  (DGL compatibility shim)
from dgl_exact.training import checkpoint as ckpt


class _Payload:
    """Unpickling this creates ``path`` (what ``os.system`` in a crafted file would do, harmlessly)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _write_malicious(path, marker, kind):
    """A file at ``path`` whose unpickling creates ``marker``: torch's zip format or a raw pickle."""
    obj = {"format": ckpt.FORMAT_VERSION, "config": {}, "run": 0, "epoch": 0, "payload": _Payload(marker)}
    if kind == "torch.save":
        torch.save(obj, str(path))
    else:
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=2)
