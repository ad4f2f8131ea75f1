"""ogb's optional ``split/<split>/split_dict.pt`` never runs code: ogb would open it with torch's default
``torch.load`` (unpickles anything on torch < 2.6 or with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``); dgl_exact
reads it tensors-only and refuses anything else with one line naming the file.

Runs on every supported torch (``tox -e native -- tests/data/test_ogbn_split_trust.py``: torch 2.1.1).
"""
import os
import pickle

import numpy as np
import pytest
import torch

from dgl_exact.data import DatasetFileError, load_dataset
from tests.data._helpers import make_ogb


class _Payload:
    """Unpickling this creates ``path`` (what ``os.system`` in a crafted file would do, harmlessly)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(params=[False, True], ids=["default-env", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"])
def hostile_env(request, monkeypatch):
    if request.param:
        monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    else:
        monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", raising=False)


def _split_path(folder):
    return os.path.join(folder, "split", "time", "split_dict.pt")


@pytest.mark.parametrize("kind", ["torch.save", "pickle"])
def test_malicious_split_dict_runs_no_code(tmp_path, hostile_env, kind):
    folder, *_ = make_ogb(str(tmp_path), "ogbn-arxiv", n=30, e=60)
    marker = tmp_path / "PWNED"
    evil = {"train": torch.arange(3), "valid": torch.arange(3, 5), "test": _Payload(marker)}
    if kind == "torch.save":
        torch.save(evil, _split_path(folder))
    else:
        with open(_split_path(folder), "wb") as f:
            pickle.dump(evil, f, protocol=2)
    with pytest.raises(DatasetFileError) as err:
        load_dataset("ogbn-arxiv", tmp_path)
    assert not marker.exists()
    msg = str(err.value)
    assert "\n" not in msg and _split_path(folder) in msg and "delete it" in msg


def test_split_dict_of_tensors_is_used(tmp_path, hostile_env):
    """A tensors-only split_dict.pt takes precedence over the csv files, as in ogb."""
    folder, *_ = make_ogb(str(tmp_path), "ogbn-arxiv", n=30, e=60)
    split = {"train": torch.tensor([0, 1, 2]), "valid": torch.tensor([5, 6], dtype=torch.int32),
             "test": torch.tensor([9])}
    torch.save(split, _split_path(folder))
    ds = load_dataset("ogbn-arxiv", tmp_path)
    assert ds.idx("train").tolist() == [0, 1, 2]
    assert ds.idx("val").tolist() == [5, 6] and ds.idx("test").tolist() == [9]


def test_split_ids_out_of_range_are_refused(tmp_path):
    folder, *_ = make_ogb(str(tmp_path), "ogbn-arxiv", n=30, e=60)
    torch.save({"train": torch.tensor([0, 1]), "valid": torch.tensor([-1]), "test": torch.tensor([3])},
               _split_path(folder))
    with pytest.raises(DatasetFileError, match=r"valid node ids outside \[0, 30\)"):
        load_dataset("ogbn-arxiv", tmp_path)


@pytest.mark.parametrize("bad", ["list", "float", "missing-key", "2-d"])
def test_split_dict_of_the_wrong_shape_is_refused(tmp_path, bad):
    folder, *_ = make_ogb(str(tmp_path), "ogbn-arxiv", n=30, e=60)
    good = {"train": torch.tensor([0, 1]), "valid": torch.tensor([2]), "test": torch.tensor([3])}
    obj = {"list": [1, 2, 3], "float": {**good, "test": torch.tensor([3.0])},
           "missing-key": {"train": good["train"], "test": good["test"]},
           "2-d": {**good, "train": torch.tensor(np.array([[0, 1]]))}}[bad]
    torch.save(obj, _split_path(folder))
    with pytest.raises(DatasetFileError, match="split_dict.pt: not a dict of 1-D integer"):
        load_dataset("ogbn-arxiv", tmp_path)
