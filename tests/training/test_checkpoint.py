"""Checkpoints dgl_exact reads back from disk never run code from the file, are validated, and a bad one gives
one clear error (the sampler caches' counterpart: tests/training/test_samplers_cache_trust.py).
Also the checkpoint / resume contract of :meth:`Trainer.fit` (what --resume trains, reports and refuses).

Runs on every supported torch (``tox -e native``: torch 2.1.1, where ``torch.load`` defaults to unpickling
anything and ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` does not exist).
"""
import os
import re
import signal

import numpy as np
import pytest
import torch

import dgl_exact  # noqa: F401  (DGL compatibility shim)
from dgl_exact.data import load_dataset
from dgl_exact.training import checkpoint as ckpt
from dgl_exact.training.config import TrainConfig
from dgl_exact.training.samplers import CacheWarning
from dgl_exact.training.trainer import Trainer
from tests.training._helpers import _write_malicious

SMALL = "synthetic-small:num_nodes=200,num_features=8,num_classes=3"


@pytest.fixture(scope="module")
def small():
    return load_dataset(SMALL, "unused")


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
    """A writer killed mid-save leaves ``.<name>.partial-<pid>-XXXXXXXX``; the next run on that target removes
    it (and the pid-less names of earlier versions), never a live writer's."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    path = tmp_path / "c.pt"
    stale = [tmp_path / ".c.pt.partial-ab12cd34", tmp_path / f".c.pt.partial-{int(dead.stdout)}-ab12cd34"]
    keep = [tmp_path / ".other.pt.partial-ab12cd34", tmp_path / ".c.pt.partial-notours", tmp_path / "c.pt.txt",
            tmp_path / f".c.pt.partial-{os.getppid()}-ab12cd34"]  # a live process's: its own
    for p in [*stale, *keep]:
        p.write_bytes(b"x")
    renamed = []
    real_replace = os.replace
    monkeypatch.setattr(ckpt.os, "replace", lambda src, dst: (renamed.append(os.path.basename(src)),
                                                              real_replace(src, dst)))
    _trainer(small, tmp_path, epochs=1).fit(checkpoint=str(path))
    assert not any(p.exists() for p in stale) and all(p.exists() for p in keep)
    assert renamed and all(re.fullmatch(rf"\.c\.pt\.partial-{os.getpid()}-[a-z0-9_]{{8}}", n) for n in renamed), renamed
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


def test_trainer_with_unwritable_data_root_trains(small, tmp_path):
    (tmp_path / "file").write_text("")
    cfg = TrainConfig(dataset=SMALL, hidden=8, epochs=1, sampler="cluster", num_parts=4, parts_per_batch=2,
                      data_root=str(tmp_path / "file"))
    with pytest.warns(CacheWarning, match="could not write"):
        res = Trainer(cfg, dataset=small, progress=False, log=None).fit()
    assert len(res.runs) == 1
