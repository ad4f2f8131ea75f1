"""Files dgl_exact reads back from disk: checkpoints and sampler caches never run code from the file, are
validated, and a bad one gives one clear error (checkpoint) or one warning and a recomputation (cache).
Also the checkpoint / resume contract of :meth:`Trainer.fit` (what --resume trains, reports and refuses).

Runs on every supported torch (``tox -e native``: torch 2.1.1, where ``torch.load`` defaults to unpickling
anything and ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` does not exist).
"""
import os
import pickle
import re
import signal
import warnings

import numpy as np
import pytest
import torch

import dgl_exact  # noqa: F401  (DGL compatibility shim)
import dgl
from dgl_exact.data import load_dataset
from dgl_exact.training import checkpoint as ckpt
from dgl_exact.training import samplers as S
from dgl_exact.training.config import TrainConfig
from dgl_exact.training.samplers import CacheWarning, ClusterGCNSampler, SAINTSampler
from dgl_exact.training.trainer import Trainer

SMALL = "synthetic-small:num_nodes=200,num_features=8,num_classes=3"


class _Payload:
    """Unpickling this creates ``path`` (what ``os.system`` in a crafted file would do, harmlessly)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def small():
    return load_dataset(SMALL, "unused")


@pytest.fixture(params=[False, True], ids=["default-env", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"])
def hostile_env(request, monkeypatch):
    """Both with torch's defaults and with the variable that turns torch.load's default unsafe (torch >= 2.4)."""
    if request.param:
        monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    else:
        monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", raising=False)
    return request.param


def _write_malicious(path, marker, kind):
    """A file at ``path`` whose unpickling creates ``marker``: torch's zip format or a raw pickle."""
    obj = {"format": ckpt.FORMAT_VERSION, "config": {}, "run": 0, "epoch": 0, "payload": _Payload(marker)}
    if kind == "torch.save":
        torch.save(obj, str(path))
    else:
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=2)


def _cfg(tmp_path, **kw):
    return TrainConfig(dataset=SMALL, hidden=8, data_root=str(tmp_path / "data"), **{"epochs": 2, **kw})


def _trainer(small, tmp_path, **kw):
    return Trainer(_cfg(tmp_path, **kw), dataset=small, progress=False, log=None)


# ------------------------------------------------------------------------------------------------
# Checkpoints: no code runs, one clear ValueError for anything that is not a checkpoint
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["torch.save", "pickle"])
def test_malicious_checkpoint_runs_no_code(small, tmp_path, hostile_env, kind):
    path, marker = tmp_path / "evil.pt", tmp_path / "PWNED"
    _write_malicious(path, marker, kind)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        ckpt.load_checkpoint(str(path))
    with pytest.raises(ValueError, match="--checkpoint"):
        _trainer(small, tmp_path).fit(checkpoint=str(path), resume=True)
    assert not marker.exists()


def test_malicious_checkpoint_message_says_why(tmp_path):
    path, marker = tmp_path / "evil.pt", tmp_path / "PWNED"
    _write_malicious(path, marker, "torch.save")
    with pytest.raises(ValueError, match="could run code") as err:
        ckpt.load_checkpoint(str(path))
    assert "open" in str(err.value) and not marker.exists()


def _damage(path, how):
    data = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "random":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, len(data), dtype=np.uint8).tobytes())
    elif how == "text":
        path.write_text("epoch: 3\n")
    elif how == "not-a-dict":
        torch.save([1, 2, 3], str(path))
    elif how == "missing-keys":
        torch.save({"format": ckpt.FORMAT_VERSION, "epoch": 1}, str(path))


@pytest.fixture(scope="module")
def finished_checkpoint(small, tmp_path_factory):
    """A finished 2-epoch, 1-run checkpoint (bytes) and the trainer's results."""
    tmp = tmp_path_factory.mktemp("finished")
    trainer = _trainer(small, tmp)
    res = trainer.fit(checkpoint=str(tmp / "c.pt"))
    return (tmp / "c.pt").read_bytes(), res, {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("how", ["empty", "truncated", "random", "text", "not-a-dict", "missing-keys"])
def test_damaged_checkpoint_is_one_value_error(small, tmp_path, finished_checkpoint, how):
    path = tmp_path / "c.pt"
    path.write_bytes(finished_checkpoint[0])
    _damage(path, how)
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*(delete it|another --checkpoint)"):
        _trainer(small, tmp_path).fit(checkpoint=str(path), resume=True)


@pytest.mark.parametrize("how", ["empty", "random", "evil"])
def test_cli_damaged_checkpoint_is_one_error_line(tmp_path, monkeypatch, capsys, finished_checkpoint, how):
    """The empty file used to raise EOFError, which click turns into "aborted" with exit status 130."""
    from dgl_exact.cli import main

    path, marker = tmp_path / "c.pt", tmp_path / "PWNED"
    path.write_bytes(finished_checkpoint[0])
    if how == "evil":
        _write_malicious(path, marker, "torch.save")
    else:
        _damage(path, how)
    monkeypatch.chdir(tmp_path)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exc:
            main(["train", "--dataset", SMALL, "--hidden", "8", "--epochs", "2", "--quiet", "--checkpoint", str(path),
                  "--resume", "--data-root", str(tmp_path / "data")])
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error:") and str(path) in err and "aborted" not in err, err
    assert not marker.exists()


def test_everything_the_trainer_saves_loads_weights_only(small, tmp_path, finished_checkpoint):
    path = tmp_path / "c.pt"
    path.write_bytes(finished_checkpoint[0])
    state = torch.load(str(path), map_location="cpu", weights_only=True)  # raises if anything is not plain
    ckpt.check_trainer_state(state, str(path))
    assert isinstance(state["rng_cpu"], torch.Tensor) and state["rng_cpu"].dtype == torch.uint8
    assert [r["run"] for r in state["completed"]] == [0] and state["optimizer"]["state"]


def test_save_refuses_what_weights_only_cannot_read(tmp_path):
    ckpt.save_checkpoint({"x": np.float64(1.5), "n": np.int64(3), "ok": (1, [2.0, None])}, str(tmp_path / "a.pt"))
    state = ckpt.load_checkpoint(str(tmp_path / "a.pt"))
    assert state["x"] == 1.5 and type(state["x"]) is float and type(state["n"]) is int
    with pytest.raises(TypeError, match="weights-only"):
        ckpt.save_checkpoint({"bad": object()}, str(tmp_path / "b.pt"))
    assert not (tmp_path / "b.pt").exists()


# ------------------------------------------------------------------------------------------------
# Resume semantics
# ------------------------------------------------------------------------------------------------
def test_resume_finished_run_with_more_epochs_extends_it(small, tmp_path, finished_checkpoint):
    """2 finished epochs, --epochs 4: the same run continues (reported once), as if trained for 4 epochs."""
    path = tmp_path / "c.pt"
    path.write_bytes(finished_checkpoint[0])
    resumed = _trainer(small, tmp_path, epochs=4)
    res = resumed.fit(checkpoint=str(path), resume=True)
    assert [r.run for r in res.runs] == [0]
    assert [h["epoch"] for h in res.runs[0].history] == [0, 1, 2, 3]
    reference = _trainer(small, tmp_path, epochs=4)
    reference.fit()
    for k, v in reference.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[k], v), k
    state = ckpt.load_checkpoint(str(path))
    assert state["epoch"] == 3 and [r["run"] for r in state["completed"]] == [0]


def test_resume_finished_checkpoint_trains_nothing(small, tmp_path, finished_checkpoint, monkeypatch):
    path = tmp_path / "c.pt"
    path.write_bytes(finished_checkpoint[0])
    monkeypatch.setattr(Trainer, "train_epoch", lambda *a, **k: pytest.fail("a finished run was trained again"))
    res = _trainer(small, tmp_path).fit(checkpoint=str(path), resume=True)
    assert len(res.runs) == 1 and res.runs[0].test == finished_checkpoint[1].runs[0].test


def test_resume_with_fewer_epochs_is_a_clear_error(small, tmp_path, finished_checkpoint):
    path = tmp_path / "c.pt"
    path.write_bytes(finished_checkpoint[0])
    with pytest.raises(ValueError, match=r"is at epoch 2 of run 1 but --epochs is 1; resume with --epochs 2"):
        _trainer(small, tmp_path, epochs=1).fit(checkpoint=str(path), resume=True)


def test_resume_more_runs_trains_only_the_new_ones(small, tmp_path, monkeypatch):
    path = str(tmp_path / "c.pt")
    first = _trainer(small, tmp_path, runs=2).fit(checkpoint=path)
    trained = []
    original = Trainer.run

    def spy(self, run, **kw):
        trained.append(run)
        return original(self, run, **kw)

    monkeypatch.setattr(Trainer, "run", spy)
    res = _trainer(small, tmp_path, runs=3).fit(checkpoint=path, resume=True)
    assert trained == [2] and [r.run for r in res.runs] == [0, 1, 2]
    assert [r.test for r in res.runs[:2]] == [r.test for r in first.runs]
    with pytest.raises(ValueError, match="finished runs of 2 epoch"):  # run 1 cannot be extended: its model is gone
        _trainer(small, tmp_path, runs=3, epochs=3).fit(checkpoint=path, resume=True)
    with pytest.raises(ValueError, match="holds 3 run"):
        _trainer(small, tmp_path, runs=2).fit(checkpoint=path, resume=True)


def test_run_state_is_the_checkpoint(small, tmp_path, finished_checkpoint):
    """A checkpoint reads as a RunState and a RunState writes the same checkpoint; one that lacks what the
    trainer needs is refused naming the key."""
    data, res, weights = finished_checkpoint
    (tmp_path / "c.pt").write_bytes(data)
    state = ckpt.RunState.load(str(tmp_path / "c.pt"))
    assert (state.run, state.epoch, len(state.history), state.best["epoch"]) == (0, 1, 2, res.runs[0].best_epoch)
    assert [r["test"] for r in state.completed] == [res.runs[0].test]
    assert state.config == _cfg(tmp_path).to_dict() | {"data_root": state.config["data_root"]}
    for name, value in weights.items():
        assert torch.equal(state.model[name], value), name
    state.save(str(tmp_path / "again.pt"))
    again = ckpt.load_checkpoint(str(tmp_path / "again.pt"))
    assert again.keys() == ckpt.load_checkpoint(str(tmp_path / "c.pt")).keys()
    assert ckpt.RunState.from_checkpoint(again, "again.pt").history == state.history
    del again["history"]
    with pytest.raises(ValueError, match="bad or missing: history"):
        ckpt.RunState.from_checkpoint(again, "again.pt")


def test_optimizer_step_is_the_one_step_hook(small, tmp_path, monkeypatch):
    """Every optimiser step of the trainer and of the one-process distributed emulator goes through
    Trainer.optimizer_step (one call per step), so a subclass changes stepping in one place."""
    from dgl_exact.training.distributed import GlobalBatchTrainer

    calls = []
    original = Trainer.optimizer_step
    monkeypatch.setattr(Trainer, "optimizer_step", lambda self, *a: (calls.append(type(self)), original(self, *a)))
    _trainer(small, tmp_path, epochs=2).fit()
    assert calls == [Trainer, Trainer]
    calls.clear()
    cfg = _cfg(tmp_path, epochs=1, sampler="cluster", num_parts=8, parts_per_batch=2)
    GlobalBatchTrainer(cfg, 2, dataset=small, progress=False, log=None).fit()
    assert calls == [GlobalBatchTrainer] * 2  # 4 batches, 2 per global step


def test_fit_writes_each_state_once_and_reads_nothing_back(small, tmp_path, monkeypatch):
    writes = []
    real_save = ckpt.save_checkpoint
    monkeypatch.setattr(ckpt, "save_checkpoint",
                        lambda state, path: (writes.append(state["epoch"]), real_save(state, path)))
    monkeypatch.setattr(ckpt, "load_checkpoint", lambda path: pytest.fail("fit read the checkpoint back"))
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("fit read the checkpoint back"))
    _trainer(small, tmp_path, runs=2, epochs=3).fit(checkpoint=str(tmp_path / "c.pt"))
    assert writes == [0, 1, 2, 0, 1, 2]


def test_new_checkpoint_never_overwrites_an_existing_file(small, tmp_path, finished_checkpoint):
    path = tmp_path / "c.pt"
    path.write_bytes(finished_checkpoint[0])
    with pytest.raises(ValueError, match="already exists.*--resume"):
        _trainer(small, tmp_path, bits=8).fit(checkpoint=str(path))
    assert path.read_bytes() == finished_checkpoint[0]


def test_stale_temporary_checkpoints_are_removed(small, tmp_path, monkeypatch):
    """A writer killed mid-save leaves ``.<name>.partial-XXXXXXXX``; the next run on that target removes it."""
    path = tmp_path / "c.pt"
    stale = tmp_path / ".c.pt.partial-ab12cd34"
    keep = [tmp_path / ".other.pt.partial-ab12cd34", tmp_path / ".c.pt.partial-notours", tmp_path / "c.pt.txt"]
    for p in [stale, *keep]:
        p.write_bytes(b"x")
    renamed = []
    real_replace = os.replace
    monkeypatch.setattr(ckpt.os, "replace", lambda src, dst: (renamed.append(os.path.basename(src)),
                                                              real_replace(src, dst)))
    _trainer(small, tmp_path, epochs=1).fit(checkpoint=str(path))
    assert not stale.exists() and all(p.exists() for p in keep)
    assert renamed and all(re.fullmatch(r"\.c\.pt\.partial-[a-z0-9_]{8}", n) for n in renamed), renamed
    assert sorted(os.listdir(tmp_path)) == sorted(["c.pt", *(p.name for p in keep)])  # no temporary left


@pytest.mark.parametrize("stop_at", [0, 1])
def test_cli_interrupt_message_tells_whether_a_checkpoint_exists(tmp_path, monkeypatch, capsys, stop_at):
    from dgl_exact.cli import main

    original = Trainer.train_epoch

    def interrupted(self, model, optimizer, scaler, epoch, measure=False):
        if epoch == stop_at:
            raise KeyboardInterrupt
        return original(self, model, optimizer, scaler, epoch, measure)

    monkeypatch.setattr(Trainer, "train_epoch", interrupted)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "c.pt"
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exc:
            main(["train", "--dataset", SMALL, "--hidden", "8", "--epochs", "3", "--quiet", "--checkpoint", str(path),
                  "--data-root", str(tmp_path / "data")])
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    err = capsys.readouterr().err
    assert exc.value.code == 130
    if stop_at == 0:
        assert not path.exists() and "no checkpoint was written" in err and "--resume" not in err, err
    else:
        assert path.exists() and "saved in" in err and "--resume" in err, err


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
        checksum = S._checksum(meta, arrays)
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


def test_trainer_with_unwritable_data_root_trains(small, tmp_path):
    (tmp_path / "file").write_text("")
    cfg = TrainConfig(dataset=SMALL, hidden=8, epochs=1, sampler="cluster", num_parts=4, parts_per_batch=2,
                      data_root=str(tmp_path / "file"))
    with pytest.warns(CacheWarning, match="could not write"):
        res = Trainer(cfg, dataset=small, progress=False, log=None).fit()
    assert len(res.runs) == 1
