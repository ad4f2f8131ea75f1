"""End-to-end training: every sampler and model on small data, checkpoint/resume bit-for-bit, CLI behaviour."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from dgl_exact.data import load_dataset
from dgl_exact.training.config import TrainConfig, bundled_configs, load_conf
from dgl_exact.training.trainer import Trainer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = "synthetic-small:num_nodes=300,num_features=16,num_classes=4"


@pytest.fixture(scope="module")
def small():
    return load_dataset(SMALL, "unused")


def _fit(dataset, tmp_path, **kw):
    cfg = TrainConfig(dataset=SMALL, data_root=str(tmp_path), epochs=kw.pop("epochs", 3), hidden=16, **kw)
    trainer = Trainer(cfg, dataset=dataset, progress=False, log=None)
    return trainer, trainer.fit()


@pytest.mark.parametrize("model", ["gcn", "sage", "gat", "gcn2"])
def test_full_graph_each_model(small, tmp_path, model):
    trainer, res = _fit(small, tmp_path, model=model, epochs=4, layers=2, batch_norm=True)
    (run,) = res.runs
    assert 0.0 <= run.test <= 1.0 and 0 <= run.best_epoch < 4
    assert len(run.history) == 4 and all(torch.isfinite(torch.tensor(h["loss"])) for h in run.history)


@pytest.mark.parametrize("sampler,extra", [
    ("saint", dict(saint_mode="walk", saint_budget=60, walk_length=2, sample_coverage=5)),
    ("saint", dict(saint_mode="node", saint_budget=100, sample_coverage=5)),
    ("saint", dict(saint_mode="edge", saint_budget=100, sample_coverage=5)),
    ("cluster", dict(num_parts=6, parts_per_batch=2)),
])
@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_minibatch_samplers_end_to_end(small, tmp_path, sampler, extra, model):
    trainer, res = _fit(small, tmp_path, sampler=sampler, model=model, **extra)
    assert res.runs[0].history[-1]["loss"] == res.runs[0].final_loss
    assert os.path.isdir(tmp_path / "cache")  # partitions / SAINT statistics cached under the data root


def test_training_learns_on_synthetic(small, tmp_path):
    _, res = _fit(small, tmp_path, model="sage", epochs=40, lr=0.02)
    assert res.runs[0].test > 0.6  # 4 classes: chance is 0.25


def test_multiple_runs_summary(small, tmp_path):
    _, res = _fit(small, tmp_path, runs=3, epochs=2)
    s = res.summary()
    assert len(res.runs) == 3 and s["test"]["std"] >= 0
    assert [r.seed for r in res.runs] == [0, 1, 2]


def test_debug_mem_and_test_speed(small, tmp_path):
    trainer = Trainer(TrainConfig(dataset=SMALL, hidden=16, epochs=2, data_root=str(tmp_path)), dataset=small,
                      progress=False, log=None)
    res = trainer.fit(debug_mem=True, test_speed=2)
    run = res.runs[0]
    assert run.activation_bytes and run.activation_bytes > 0
    assert run.epochs_per_second and run.epochs_per_second > 0
    assert len(run.history) == 3 + 2  # warm-up epochs + timed ones


@pytest.mark.parametrize("sampler", ["full", "saint", "cluster"])
def test_checkpoint_resume_is_bit_for_bit(small, tmp_path, sampler, monkeypatch):
    extra = dict(saint_budget=60, sample_coverage=5) if sampler == "saint" else dict(num_parts=6, parts_per_batch=2)
    cfg = TrainConfig(dataset=SMALL, hidden=16, epochs=6, sampler=sampler, data_root=str(tmp_path), **extra)
    full = Trainer(cfg, dataset=small, progress=False, log=None)
    full.fit(checkpoint=str(tmp_path / "a.pt"))
    reference = {k: v.clone() for k, v in full.model.state_dict().items()}

    interrupted = Trainer(cfg, dataset=small, progress=False, log=None)
    original = Trainer.train_epoch

    def dying(self, model, optimizer, scaler, epoch, measure=False):
        if epoch == 3:
            raise KeyboardInterrupt
        return original(self, model, optimizer, scaler, epoch, measure)

    monkeypatch.setattr(Trainer, "train_epoch", dying)
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit(checkpoint=str(tmp_path / "b.pt"))
    monkeypatch.setattr(Trainer, "train_epoch", original)
    torch.manual_seed(12345)  # the resumed run must not depend on the global RNG state at restart
    resumed = Trainer(cfg, dataset=small, progress=False, log=None)
    res = resumed.fit(checkpoint=str(tmp_path / "b.pt"), resume=True)
    assert [h["epoch"] for h in res.runs[0].history] == list(range(6))
    for k, v in resumed.model.state_dict().items():
        assert torch.equal(v, reference[k]), k


_CTRL_C_WHILE_SAVING = r"""
import os, signal, sys
import torch
from dgl_exact.training import checkpoint as ckpt

path = sys.argv[1]
# a program as a user runs it: Ctrl-C raises KeyboardInterrupt (a test runner's worker may ignore SIGINT, and a
# child inherits an ignored signal)
signal.signal(signal.SIGINT, signal.default_int_handler)
handler = signal.getsignal(signal.SIGINT)
ckpt.save_checkpoint({"epoch": 1}, path)
real_save = torch.save


def interrupted_save(obj, f):  # Ctrl-C arrives while torch.save is writing the file
    os.kill(os.getpid(), signal.SIGINT)
    return real_save(obj, f)


ckpt.torch.save = interrupted_save
try:
    ckpt.save_checkpoint({"epoch": 2, "payload": torch.arange(1000)}, path)
    print("not interrupted")
except KeyboardInterrupt:  # delivered, but only once the new file is complete and in place
    print("interrupted")
ckpt.torch.save = real_save
state = ckpt.load_checkpoint(path)
same = bool(torch.equal(state["payload"], torch.arange(1000)))
print(state["epoch"], same, signal.getsignal(signal.SIGINT) is handler)
"""


def test_ctrl_c_while_writing_a_checkpoint_waits_for_the_file(tmp_path):
    """Run in a fresh interpreter with Python's default SIGINT handler: pytest-xdist's workers ignore SIGINT
    (the controller handles Ctrl-C), and the checkpoint code rightly re-delivers a held signal to the handler
    that was there before, which then ignores it."""
    path = tmp_path / "c.pt"
    proc = subprocess.run([sys.executable, "-c", _CTRL_C_WHILE_SAVING, str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["interrupted", "2", "True", "True"], proc.stdout + proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["c.pt"]  # no temporary file left behind


def test_resume_refuses_other_settings(small, tmp_path):
    cfg = TrainConfig(dataset=SMALL, hidden=16, epochs=2, data_root=str(tmp_path))
    Trainer(cfg, dataset=small, progress=False, log=None).fit(checkpoint=str(tmp_path / "c.pt"))
    other = Trainer(cfg.replace(bits=8), dataset=small, progress=False, log=None)
    with pytest.raises(ValueError, match=r"was written with bits=2, this run has bits=8; .*--resume-mismatch-ok"):
        other.fit(checkpoint=str(tmp_path / "c.pt"), resume=True)


def test_bundled_configs_are_valid():
    names = bundled_configs()
    assert {"arxiv_gcn", "arxiv_sage", "products_sage", "yelp_sage", "cora_gcn"} <= set(names)
    for name in names:
        TrainConfig(**load_conf(name))  # every bundled config validates


@pytest.mark.parametrize("bad", [dict(bits=3), dict(kept_frac=0.0), dict(kept_frac=1.5), dict(model="mlp"),
                                 dict(sampler="random-walk"), dict(layers=0), dict(dropout=1.0), dict(lr=0)])
def test_config_validation(bad):
    with pytest.raises(ValueError):
        TrainConfig(**bad)


# --- the command line --------------------------------------------------------------------------------
def cli(*args, timeout=300, **kw):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "dgl_exact", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, env=env, **kw)


@pytest.mark.parametrize("args,needle", [
    (["train", "--dataset", "nope"], "unknown dataset"),
    (["train", "--model", "mlp"], "--model"),
    (["train", "--sampler", "random-walk"], "--sampler"),
    (["train", "--bits", "3"], "--bits"),
    (["train", "--kept-frac", "0"], "kept-frac"),
    (["train", "--kept-frac", "1.5"], "kept-frac"),
    (["train", "--device", "cuda:7"], "cuda:7"),
    (["train", "--conf", "/no/such.yaml"], "not found"),
    (["train", "--dataset", "ogbn-arxiv", "--data-root", "/nonexistent-root"], "ogbn_arxiv"),
    (["train", "--resume"], "--checkpoint"),
])
def test_cli_bad_input_is_one_clean_error(args, needle, capsys, tmp_path, monkeypatch):
    from dgl_exact.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main([*args, "--epochs", "1", "--quiet"])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert err.startswith("error:") and needle in err


def test_cli_bad_input_in_a_real_process_has_no_traceback():
    proc = cli("train", "--bits", "3")
    assert proc.returncode == 2 and proc.stderr.startswith("error:") and "Traceback" not in proc.stderr


@pytest.fixture
def in_process_cli(tmp_path, monkeypatch, capsys):
    """``dgl-exact ARGS`` run in this process (no interpreter start, no second torch + DGL import), in
    ``tmp_path``, returning (exit status, stdout, stderr); the signal handlers ``train`` installs are put back.
    The module's entry point in a real process: test_cli_bad_input_in_a_real_process_has_no_traceback."""
    from tests.cli._helpers import run

    monkeypatch.chdir(tmp_path)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield lambda *args: run(args, capsys)
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_cli_default_train_on_bundled_cora_json(tmp_path, in_process_cli):
    out = tmp_path / "r.json"
    code, stdout, stderr = in_process_cli("train", "--epochs", "3", "--quiet", "--json", out, "--debug-mem")
    assert code == 0, stderr
    assert "cora: 2,708 nodes" in stdout and "test acc" in stdout
    data = json.loads(out.read_text())
    assert data["config"]["dataset"] == "cora" and data["config"]["bits"] == 2
    assert set(data["summary"]) >= {"train", "val", "test", "epoch_time", "activation_bytes"}
    assert data["environment"]["backend"] and data["environment"]["torch"] == torch.__version__


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_cli_interrupt_then_resume_matches_uninterrupted(tmp_path, sig):
    common = ["train", "--epochs", "40", "--eval-every", "5", "--quiet", "--model", "sage", "--hidden", "16"]
    ref = cli(*common, "--json", str(tmp_path / "ref.json"), cwd=str(tmp_path))
    assert ref.returncode == 0, ref.stderr
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ckpt = tmp_path / "run.pt"
    proc = subprocess.Popen([sys.executable, "-m", "dgl_exact", *common, "--checkpoint", str(ckpt)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path),
                            stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal
    deadline = time.time() + 240
    while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(sig)  # most likely lands while the next checkpoint is being written
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("training finished before the interrupt arrived")
    assert proc.returncode == 130 and "--resume" in err and "Traceback" not in err, err
    resumed_from = torch.load(ckpt, weights_only=False)["epoch"] + 1
    res = cli(*common, "--checkpoint", str(ckpt), "--resume", "--json", str(tmp_path / "res.json"),
              cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    a = json.loads((tmp_path / "ref.json").read_text())["runs"][0]["history"]
    b = json.loads((tmp_path / "res.json").read_text())["runs"][0]["history"]
    assert [h["epoch"] for h in a] == [h["epoch"] for h in b] == list(range(40))
    loss_a, loss_b = (torch.tensor([h["loss"] for h in x], dtype=torch.float64) for x in (a, b))
    # Across processes the CPU BLAS may round differently (its kernel choice depends on memory layout; within one
    # process resume is bit for bit, test_checkpoint_resume_is_bit_for_bit), and last-bit differences grow
    # slowly as training goes on. Up to the first resumed epoch (saved weights, saved random state) the losses
    # agree to rounding; a restarted dropout stream or a replayed epoch changes them by ~1e-2.
    torch.testing.assert_close(loss_b[:resumed_from + 1], loss_a[:resumed_from + 1], rtol=1e-5, atol=0)
    # Lost optimizer state or a replayed step moves the later losses by ~1e-2; rounding drift stays < 1e-4.
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-3, atol=0)


def test_cli_datasets_and_info(tmp_path, in_process_cli):
    code, out, _ = in_process_cli("datasets", "--data-root", tmp_path)
    assert code == 0 and "cora" in out and "ogbn-arxiv" in out
    code, out, _ = in_process_cli("info")  # in a fresh process, naming the versions: tests/cli/test_dialect.py
    assert code == 0 and "kernel backend" in out and "dgl" in out


def test_example_script_runs(tmp_path, in_process_cli, monkeypatch, capsys):
    """examples/cora.py as ``python examples/cora.py ...`` runs it (``__main__``), in this process."""
    import runpy

    monkeypatch.setattr(sys, "argv", ["cora.py", "--model", "sage", "--epochs", "2", "--quiet"])
    try:
        runpy.run_path(os.path.join(REPO, "examples", "cora.py"), run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "model sage" in out
