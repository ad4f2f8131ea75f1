"""Sampler caches (GraphSAINT counts, ClusterGCN partitions) read back from disk never run code from the file, are
recomputed when invalid, corrupt, of another graph or setting, and computed in memory when the folder is
unwritable."""
import os
import warnings

import numpy as np
import pytest
import torch

import dgl_exact  # noqa: F401  (DGL compatibility shim)
import dgl
from dgl_exact.training import sampler_cache
from dgl_exact.training.samplers import CacheWarning, ClusterGCNSampler, SAINTSampler
from tests.training._helpers import _Payload, _write_malicious


# ------------------------------------------------------------------------------------------------
# Sampler caches
# ------------------------------------------------------------------------------------------------
def _graph(n=120, m=500, seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = dgl.to_bidirected(dgl.graph((torch.randint(0, n, (m,), generator=gen),
                                     torch.randint(0, n, (m,), generator=gen)), num_nodes=n))
    g.ndata["train_mask"] = torch.rand(n, generator=gen) < 0.5
    return g


def _saint(g, cache_dir):
    return SAINTSampler(g, "node", 30, sample_coverage=5, cache_dir=str(cache_dir), dataset="toy")


def _cluster(g, cache_dir):
    return ClusterGCNSampler(g, 6, 2, cache_dir=str(cache_dir), dataset="toy")


MAKERS = {"saint": _saint, "cluster": _cluster}
COMPUTE = {"saint": (SAINTSampler, "_count"), "cluster": (ClusterGCNSampler, "_partition")}


def _result(sampler):
    if isinstance(sampler, SAINTSampler):
        return sampler.node_count, sampler.edge_count
    return (sampler.assignment,)


def _one_cache_warning(record, path, what):
    msgs = [str(w.message) for w in record if issubclass(w.category, CacheWarning)]
    assert len(msgs) == 1 and str(path) in msgs[0] and what in msgs[0], msgs


def _reuses_cache(kind, g, cache_dir, monkeypatch, expected):
    """A new sampler takes the cache: no recomputation, no warning, the same result."""
    cls, method = COMPUTE[kind]
    with monkeypatch.context() as m, warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        m.setattr(cls, method, lambda *a, **k: pytest.fail("recomputed although the cache is valid"))
        again = MAKERS[kind](g, cache_dir)
    for a, b in zip(_result(again), expected):
        assert torch.equal(a, b)


@pytest.fixture(scope="module")
def graph():
    return _graph()


@pytest.fixture(scope="module")
def reference(graph, tmp_path_factory):
    """Each sampler's result on ``graph`` and its cache file's path and bytes."""
    out = {}
    for kind, make in MAKERS.items():
        folder = tmp_path_factory.mktemp(kind)
        s = make(graph, folder)
        out[kind] = (_result(s), s.cache_path, open(s.cache_path, "rb").read())
    return out


def _planted(kind, reference, tmp_path):
    """The cache path a sampler uses in ``tmp_path``, and its valid bytes."""
    _, path, data = reference[kind]
    return tmp_path / os.path.basename(path), data


@pytest.mark.parametrize("kind", ["saint", "cluster"])
@pytest.mark.parametrize("payload", ["torch.save", "pickle", "npy-object"])
def test_malicious_cache_runs_no_code(kind, payload, graph, reference, tmp_path, hostile_env, monkeypatch):
    path, _ = _planted(kind, reference, tmp_path)
    marker = tmp_path / "PWNED"
    if payload == "npy-object":  # a .npy of an object array: numpy would unpickle it with allow_pickle=True
        with open(path, "wb") as f:
            np.save(f, np.array([_Payload(marker)], dtype=object), allow_pickle=True)
    else:
        _write_malicious(path, marker, payload)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        sampler = MAKERS[kind](graph, tmp_path)
    assert not marker.exists()
    assert sampler.cache_path == str(path)
    _one_cache_warning(record, path, "recomputing")
    if kind == "saint":  # SAINT pre-sampling is deterministic: the same counts as the clean run
        for a, b in zip(_result(sampler), reference[kind][0]):
            assert torch.equal(a, b)
    _reuses_cache(kind, graph, tmp_path, monkeypatch, _result(sampler))  # overwritten with a valid file


def _edit(path, data, tmp_path, change, rechecksum):
    """Rewrite the cache at ``path`` with ``change(arrays)`` applied; with ``rechecksum`` the stored checksum
    matches the new contents (only the semantic checks can catch it)."""
    src = tmp_path / "valid.npz"
    src.write_bytes(data)
    with np.load(src, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta, checksum = str(arrays.pop("meta")), str(arrays.pop("checksum"))
    change(arrays)
    if rechecksum:
        checksum = sampler_cache.checksum(meta, arrays)
    with open(path, "wb") as f:
        np.savez(f, meta=np.array(meta), checksum=np.array(checksum), **arrays)


def _scale_counts(a):
    a["node_count"] = a["node_count"] * 3
    a["edge_count"] = a["edge_count"] * 3


CACHE_EDITS = {
    ("cluster", "too few entries"): (lambda a: a.update(assignment=a["assignment"][:100]), True, "expected int64"),
    ("cluster", "ids >= num_parts"): (lambda a: a.update(assignment=a["assignment"] + 6), True, "num_parts"),
    ("cluster", "float ids"): (lambda a: a.update(assignment=a["assignment"].astype(np.float64)), True, "float64"),
    ("cluster", "edited ids"): (lambda a: a.update(assignment=(a["assignment"] + 1) % 6), False, "checksum"),
    ("saint", "scaled counts"): (_scale_counts, False, "checksum"),
    ("saint", "scaled counts, checksum redone"): (_scale_counts, True, "num_samples"),
    ("saint", "scaled edge counts, checksum redone"): (lambda a: a.update(edge_count=a["edge_count"] * 2), True,
                                                       "edge is counted"),
    ("saint", "wrong shape"): (lambda a: a.update(node_count=a["node_count"][:-1]), True, "expected int32"),
    ("saint", "no samples"): (lambda a: a.update(num_samples=np.array(0, dtype=np.int64)), True, "num_samples"),
    ("saint", "extra array"): (lambda a: a.update(extra=np.zeros(3)), True, "holds"),
}


@pytest.mark.parametrize("kind,case", list(CACHE_EDITS), ids=[f"{k}-{c}" for k, c in CACHE_EDITS])
def test_invalid_cache_contents_are_recomputed(kind, case, graph, reference, tmp_path, monkeypatch):
    change, rechecksum, what = CACHE_EDITS[kind, case]
    path, data = _planted(kind, reference, tmp_path)
    _edit(path, data, tmp_path, change, rechecksum)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        sampler = MAKERS[kind](graph, tmp_path)
    _one_cache_warning(record, path, what)
    if kind == "cluster":
        assert sampler.assignment.shape == (graph.num_nodes(),) and int(sampler.assignment.max()) < 6
    else:
        for a, b in zip(_result(sampler), reference[kind][0]):
            assert torch.equal(a, b)
    _reuses_cache(kind, graph, tmp_path, monkeypatch, _result(sampler))


@pytest.mark.parametrize("kind", ["saint", "cluster"])
def test_cache_of_another_graph_or_setting_is_not_used(kind, graph, reference, tmp_path, monkeypatch):
    """A valid file copied under another name (here: another graph's) is recognised by its stored meta."""
    other_graph = _graph(seed=5)
    other = MAKERS[kind](other_graph, tmp_path / "other")
    path, _ = _planted(kind, reference, tmp_path)
    path.write_bytes(open(other.cache_path, "rb").read())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        MAKERS[kind](graph, tmp_path)
    _one_cache_warning(record, path, "made for something else")


@pytest.mark.parametrize("kind", ["saint", "cluster"])
@pytest.mark.parametrize("how", ["empty", "truncated", "random", "folder"])
def test_corrupt_cache_file_is_recomputed(kind, how, graph, reference, tmp_path, monkeypatch):
    path, data = _planted(kind, reference, tmp_path)
    if how == "folder":
        path.mkdir()
    else:
        path.write_bytes({"empty": b"", "truncated": data[: len(data) // 2],
                          "random": np.random.default_rng(1).integers(0, 256, len(data), dtype=np.uint8).tobytes()
                          }[how])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        sampler = MAKERS[kind](graph, tmp_path)
    msgs = [str(w.message) for w in record if issubclass(w.category, CacheWarning)]
    assert msgs and str(path) in msgs[0] and "recomputing" in msgs[0], msgs
    if how == "folder":  # cannot be overwritten either: a second warning says so, the run goes on
        assert len(msgs) == 2 and "could not write" in msgs[1], msgs
    else:
        assert len(msgs) == 1, msgs
        _reuses_cache(kind, graph, tmp_path, monkeypatch, _result(sampler))


@pytest.mark.parametrize("kind", ["saint", "cluster"])
@pytest.mark.parametrize("how", ["under-a-file", "read-only"])
def test_unwritable_cache_folder_computes_in_memory(kind, how, graph, reference, tmp_path):
    if how == "under-a-file":
        (tmp_path / "file").write_text("")
        cache_dir = tmp_path / "file" / "cache"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders")
        cache_dir = tmp_path / "ro"
        cache_dir.mkdir()
        cache_dir.chmod(0o500)
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            sampler = MAKERS[kind](graph, cache_dir)
    finally:
        if how == "read-only":
            cache_dir.chmod(0o700)
    _one_cache_warning(record, sampler.cache_path, "could not write")
    if kind == "saint":
        for a, b in zip(_result(sampler), reference[kind][0]):
            assert torch.equal(a, b)


@pytest.mark.parametrize("kind", ["saint", "cluster"])
def test_cache_on_a_full_disk_computes_in_memory_and_leaves_nothing(kind, tmp_path, full_disk):
    cache_dir = tmp_path / "cache"
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        sampler = MAKERS[kind](_graph(), cache_dir)
    _one_cache_warning(record, sampler.cache_path, "no space left on device")
    assert os.listdir(cache_dir) == []  # no temporary file, no cut-off cache
    assert all(len(r) > 0 for r in _result(sampler))
