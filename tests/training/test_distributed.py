"""Data-parallel training (dgl_exact.training.distributed): 2 gloo processes on localhost, bundled Cora.

Every launched job runs under a timeout, so a hang fails the test instead of blocking CI. Workers are
pinned to one thread each (OMP_NUM_THREADS=1): results are then reproducible bit for bit across launches.
"""
import json
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dgl_exact.cli import main
from dgl_exact.training import distributed as D
from dgl_exact.training.distributed import launcher
from dgl_exact.training.checkpoint import load_checkpoint
from dgl_exact.training.config import TrainConfig
from dgl_exact.training.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB_TIMEOUT = 400  # s, one launched job (import + 2 workers + a few tiny epochs: ~30 s on 2 cores, minutes when loaded)
FAIL_BOUND = 30    # s, after a rank died the other one must have exited (--dist-timeout 5 + launcher grace 10)

# tiny epochs: SAINT 4 global batches (2 steps per rank), ClusterGCN 10 batches of 4 of 40 partitions. On the
# CPU even where there is a GPU (NCCL needs one GPU per process; see the cuda tests at the end).
SAINT = ["--sampler", "saint", "--model", "sage", "--saint-budget", "300", "--hidden", "16", "--epochs", "3",
         "--device", "cpu"]
CLUSTER = ["--sampler", "cluster", "--model", "gcn", "--num-parts", "40", "--parts-per-batch", "4", "--hidden", "16",
           "--epochs", "4", "--device", "cpu"]


def worker_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        D.CHILD_ENV, D.TIMEOUT_ENV)}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.update(extra)
    return env


def dgl_exact_cli(args, cwd, timeout=JOB_TIMEOUT, **env):
    """``python -m dgl_exact ARGS`` in a subprocess; returns (CompletedProcess, seconds)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "dgl_exact", *args], cwd=cwd, env=worker_env(**env),
                          capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - t0


# Fault injection: a sitecustomize module on the workers' PYTHONPATH wraps Trainer.train_epoch, which the
# distributed trainer calls once every rank has reached the epoch (after its barrier).
_FAULT = """import os, sys, time

from dgl_exact.training.trainer import Trainer

_train_epoch = Trainer.train_epoch


def train_epoch(self, model, optimizer, scaler, epoch, measure=False):
    if (self.rank, epoch) == ({rank}, {epoch}):
        print(f"rank {{self.rank}}: injected fault: {action} at epoch {{epoch}}", file=sys.stderr, flush=True)
        if "{action}" == "hang":
            time.sleep(24 * 3600)
        os._exit(1)
    return _train_epoch(self, model, optimizer, scaler, epoch, measure)


Trainer.train_epoch = train_epoch
"""


@pytest.fixture
def fault(tmp_path_factory):
    """``fault(rank, epoch, action)``: the environment of workers in which ``rank`` exits with status 1
    (``action="exit"``) or hangs (``"hang"``) when it starts ``epoch``."""

    def env(rank, epoch, action="exit"):
        folder = tmp_path_factory.mktemp("fault")
        (folder / "sitecustomize.py").write_text(_FAULT.format(rank=rank, epoch=epoch, action=action))
        return {"PYTHONPATH": os.pathsep.join([str(folder), worker_env()["PYTHONPATH"]])}

    return env


def losses(results):
    return [h["loss"] for h in results["runs"][0]["history"]]


def emulate(checkpoint, world_size=2):
    """The single-process emulation of the same global batches, with the checkpointed run's config."""
    cfg = TrainConfig(**load_checkpoint(checkpoint)["config"])
    trainer = D.GlobalBatchTrainer(cfg, world_size, progress=False, log=None)
    return trainer.fit(), trainer.model


def assert_matches_emulation(out, results):
    emulated, model = emulate(out / "ckpt.pt")
    got, want = losses(results), [h["loss"] for h in emulated.runs[0].history]
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6), (got, want)
    final = load_checkpoint(out / "ckpt.pt")["model"]  # rank 0's model after the last epoch
    for name, value in model.state_dict().items():
        torch.testing.assert_close(final[name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert emulated.runs[0].val == pytest.approx(results["runs"][0]["val"], abs=0.01)


def check_run(out, results):
    dist_info = results["environment"]["distributed"]
    assert dist_info["world_size"] == 2 and dist_info["backend"] == "gloo"
    (hashes,) = dist_info["replica_hashes"]
    assert len(hashes) == 2 and hashes[0] == hashes[1]  # parameters identical on both ranks
    run = results["runs"][0]
    assert len(run["history"]) == results["config"]["epochs"]
    assert all(0.0 <= h["val"] <= 1.0 for h in run["history"])  # rank 0 evaluated every epoch
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".json") == ["result.json"]


# ------------------------------------------------------------------------------------------------
# Units (no processes launched)
# ------------------------------------------------------------------------------------------------
def test_rank_seed_streams():
    seeds = {D.rank_seed(s, r, e) for s in (0, 1) for r in range(4) for e in range(5)}
    assert len(seeds) == 40 and all(0 <= x < 2**63 for x in seeds)
    assert D.rank_seed(3, 1, 7) == D.rank_seed(3, 1, 7)


def test_device_for_rank():
    assert D.device_for_rank("cpu", 1, 2) == torch.device("cpu")
    if not torch.cuda.is_available():
        assert D.device_for_rank("auto", 1, 2) == torch.device("cpu")
        with pytest.raises(ValueError, match="no CUDA"):
            D.device_for_rank("cuda", 0, 2)
    else:
        assert D.device_for_rank("auto", 0, 2) == torch.device("cuda", 0)


@pytest.mark.parametrize("args, message", [
    (["--nproc", "2", "--sampler", "full"], "mini-batch sampler"),
    (["--nproc", "0", "--sampler", "saint"], "--nproc must be >= 1"),
])
def test_cli_rejects(args, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["train", *args, "--data-root", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_cli_under_torchrun_env(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv(D.CHILD_ENV, raising=False)
    for args, message in ((["--sampler", "full"], "mini-batch sampler"),
                          (["--sampler", "saint", "--nproc", "2"], "leave it out")):
        with pytest.raises(SystemExit) as e:
            main(["train", *args, "--data-root", str(tmp_path)])
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_cpu_workers_bounded_by_cores(monkeypatch, capsys, tmp_path):
    """`--nproc 64` on a 2-core CPU used to start 64 full training processes (15 GB in 30 s): one line,
    exit 2, the limit and why; DGL_EXACT_OVERSUBSCRIBE=1 lifts it."""
    monkeypatch.delenv(D.OVERSUBSCRIBE_ENV, raising=False)
    n = D.cpu_cores() + 1
    with pytest.raises(SystemExit) as e:
        main(["train", "--nproc", str(n), "--sampler", "saint", "--device", "cpu", "--data-root", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"{D.cpu_cores()} CPU core(s)" in err and f"--nproc {D.cpu_cores()} or fewer" in err
    assert D.OVERSUBSCRIBE_ENV in err
    launcher._check_cpu_workers(D.cpu_cores())  # up to one per core is fine
    monkeypatch.setenv(D.OVERSUBSCRIBE_ENV, "1")
    launcher._check_cpu_workers(n)


def test_workers_get_every_option_but_the_config(monkeypatch, tmp_path):
    """The launcher's workers get each non-config `train` option as given (the config goes by YAML file)."""
    seen = {}

    def fake_launch(nproc, cfg, args, **kwargs):
        seen.update(nproc=nproc, cfg=cfg, args=args)
        return 0

    monkeypatch.setattr(D, "launch", fake_launch)
    with pytest.raises(SystemExit) as e:
        main(["train", "--nproc", "2", *SAINT, "--bits", "4", "-q", "--debug-mem", "--test-speed", "2",
              "--json", str(tmp_path / "r.json"), "--checkpoint", str(tmp_path / "c.pt"), "--resume",
              "--resume-mismatch-ok", "--dist-timeout", "7", "--data-root", str(tmp_path)])
    assert e.value.code == 0
    assert seen["nproc"] == 2 and seen["cfg"].compression.bits == 4 and seen["cfg"].sampler == "saint"
    assert sorted(seen["args"]) == sorted(["--debug-mem", "--test-speed", "2", "--json", str(tmp_path / "r.json"),
                                           "--checkpoint", str(tmp_path / "c.pt"), "--resume", "--quiet",
                                           "--resume-mismatch-ok", "--dist-timeout", "7.0"])


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _sigint_as_in_a_terminal():
    """In the child: SIGINT's default disposition (Python then raises KeyboardInterrupt), whatever the test
    runner's: a shell starting a job in the background without job control makes it ignore SIGINT, and
    children inherit an ignored signal."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ctrl_c_launch(tmp_path, ready):
    """Run `train --nproc 2` in its own session, wait until ``ready(launcher_pid, workers)``, then send
    SIGINT to the launcher's process group (what a terminal's Ctrl-C does); returns (proc, stderr, workers)."""
    import signal

    args = [sys.executable, "-m", "dgl_exact", "train", "--nproc", "2", *SAINT[:-4], "--epochs", "500", "--device",
            "cpu", "-q", "--data-root", str(tmp_path), "--checkpoint", str(tmp_path / "ckpt.pt")]
    proc = subprocess.Popen(args, cwd=tmp_path, env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=_sigint_as_in_a_terminal)
    try:
        end = time.monotonic() + JOB_TIMEOUT
        workers = []
        while time.monotonic() < end and proc.poll() is None:
            workers = _children(proc.pid)
            if len(workers) == 2 and ready(proc.pid, workers):
                break
            time.sleep(0.05)
        assert proc.poll() is None and len(workers) == 2, "the launcher did not start its 2 workers"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc, err, workers


def _assert_one_quiet_line(proc, err, workers):
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted: stopping"), err
    assert not any(_alive(w) for w in workers), "a worker outlived its launcher"


@pytest.mark.slow
def test_ctrl_c_while_workers_start_stops_them_quietly(tmp_path):
    """Ctrl-C while the workers still import torch used to print a KeyboardInterrupt traceback per worker
    (63 of them with --nproc 64): now the launcher alone gets it, prints one line and stops them."""
    proc, err, workers = _ctrl_c_launch(tmp_path, lambda pid, workers: time.sleep(0.5) or True)
    _assert_one_quiet_line(proc, err, workers)
    assert "no checkpoint was written" in err


@pytest.mark.nightly
def test_ctrl_c_while_training_stops_workers_quietly(tmp_path):
    """Ctrl-C after the first checkpoint: one line naming the checkpoint to resume from; no worker
    prints anything, none is left running, the checkpoint loads."""
    proc, err, workers = _ctrl_c_launch(tmp_path, lambda pid, workers: (tmp_path / "ckpt.pt").exists())
    _assert_one_quiet_line(proc, err, workers)
    assert f"saved in {tmp_path / 'ckpt.pt'}: rerun with --resume" in err
    assert load_checkpoint(tmp_path / "ckpt.pt")["config"]["epochs"] == 500


@pytest.fixture
def single_process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gcn", "sage", "gat", "gcn2"])
@pytest.mark.parametrize("batch_norm", [False, True])
def test_ddp_without_unused_parameters(model, batch_norm, single_process_group, tmp_path):
    """find_unused_parameters=False is right: every parameter of every model gets a gradient in every step,
    also from a batch without training nodes (GraphSAINT's weighted sum is then 0, still a function of all
    parameters). DDP itself raises at the next step otherwise (checked on a planted unused parameter)."""
    cfg = TrainConfig(model=model, sampler="saint", batch_norm=batch_norm, hidden=12, layers=2, saint_budget=200,
                      device="cpu", data_root=str(tmp_path))
    trainer = Trainer(cfg, progress=False, log=None)
    module, optimizer, _ = trainer.build(0)
    ddp = DistributedDataParallel(module, find_unused_parameters=False)
    batches = list(trainer.sampler.iter_epoch(0))[:2]
    for i, batch in enumerate(batches * 2):
        graph, feat, index, labels, weight, edge_weight = trainer._batch_inputs(batch)
        if i == len(batches):  # no training node in this batch
            index, labels, weight = index[:0], labels[:0], weight[:0]
        optimizer.zero_grad(set_to_none=True)
        trainer._forward_loss(ddp, (graph, feat, index, labels, weight, edge_weight))[0].backward()
        assert [n for n, p in module.named_parameters() if p.grad is None] == []
        optimizer.step()

    module.register_parameter("planted", torch.nn.Parameter(torch.zeros(3)))
    ddp = DistributedDataParallel(module, find_unused_parameters=False)
    inputs = trainer._batch_inputs(batches[0])
    trainer._forward_loss(ddp, inputs)[0].backward()
    with pytest.raises(RuntimeError, match="finished reduction"):
        trainer._forward_loss(ddp, inputs)[0].backward()


@pytest.mark.slow
def test_global_batch_trainer_is_deterministic(tmp_path):
    cfg = TrainConfig(sampler="cluster", model="gcn", num_parts=20, parts_per_batch=2, hidden=8, epochs=2,
                      device="cpu", data_root=str(tmp_path))
    first = D.GlobalBatchTrainer(cfg, 2, progress=False, log=None)
    a = first.fit()
    b = D.GlobalBatchTrainer(cfg, 2, dataset=first.dataset, progress=False, log=None).fit()
    assert losses(a.to_dict()) == losses(b.to_dict())
    assert len(first.shares) == 2 and len(first.shares[0]) == 5  # 10 batches -> 5 steps of 2


# ------------------------------------------------------------------------------------------------
# Two processes
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_processes_saint(tmp_path):
    """`dgl-exact train --nproc 2` end to end (subprocess): rank 0 writes the JSON, replicas agree, and the
    loss curve is the single-process emulation's (fp activations: exact; dropout on, per-rank streams)."""
    out = tmp_path / "saint"
    proc, seconds = dgl_exact_cli(["train", "--nproc", "2", *SAINT, "--act-fp", "-q", "--data-root", str(tmp_path),
                                   "--json", str(out / "result.json"), "--checkpoint", str(out / "ckpt.pt")],
                                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 processes (gloo" in proc.stdout and "results written to" in proc.stdout
    assert proc.stdout.count("test acc:") == 1  # the summary is printed by rank 0 only
    results = json.loads((out / "result.json").read_text())
    check_run(out, results)
    assert_matches_emulation(out, results)
    print(f"2-process saint run: {seconds:.1f} s")


@pytest.mark.slow
def test_two_processes_neighbor(tmp_path):
    """`--nproc 2` with neighbour-sampled blocks: replicas agree and the loss curve is the emulation's."""
    out = tmp_path / "neighbor"
    args = ["--sampler", "neighbor", "--model", "sage", "--fanouts", "5,5", "--batch-size", "16", "--hidden", "16",
            "--epochs", "2", "--device", "cpu"]
    proc, seconds = dgl_exact_cli(["train", "--nproc", "2", *args, "--act-fp", "-q", "--data-root", str(tmp_path),
                                   "--json", str(out / "result.json"), "--checkpoint", str(out / "ckpt.pt")],
                                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((out / "result.json").read_text())
    check_run(out, results)
    assert_matches_emulation(out, results)
    print(f"2-process neighbor run: {seconds:.1f} s")


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    """An uninterrupted 2-process ClusterGCN run through `launch` (what --nproc calls), compression on."""
    root = tmp_path_factory.mktemp("cluster")
    out = root / "full"
    cfg = _cluster_config(root)
    t0 = time.monotonic()
    code = D.launch(2, cfg, ["-q", "--json", str(out / "result.json"), "--checkpoint", str(out / "ckpt.pt")],
                    env=worker_env(), timeout=JOB_TIMEOUT)
    assert code == 0
    print(f"2-process cluster run: {time.monotonic() - t0:.1f} s")
    return root, out, json.loads((out / "result.json").read_text())


def _cluster_config(root):
    """The TrainConfig of the CLUSTER options (launch takes a config, as the CLI builds it)."""
    values = dict(zip(CLUSTER[::2], CLUSTER[1::2]))
    return TrainConfig(sampler=values["--sampler"], model=values["--model"], num_parts=int(values["--num-parts"]),
                       parts_per_batch=int(values["--parts-per-batch"]), hidden=int(values["--hidden"]),
                       epochs=int(values["--epochs"]), device=values["--device"], data_root=str(root))


@pytest.mark.slow
def test_two_processes_cluster(cluster_run):
    """ClusterGCN (one METIS partition, broadcast from rank 0) with INT2 compression: the emulation draws
    the same per-rank random streams, so even the stochastic rounding matches (float tolerance)."""
    _, out, results = cluster_run
    check_run(out, results)
    assert results["config"]["act_fp"] is False
    assert_matches_emulation(out, results)


@pytest.mark.slow
def test_dead_rank_then_resume(cluster_run, capfd, fault):
    """Rank 1 exits at the start of epoch 2: rank 0 reports the failed collective itself and exits
    non-zero within the bound, so does the launcher; --resume finishes the job bit for bit as the
    uninterrupted run."""
    root, full, expected = cluster_run
    out = root / "resumed"
    cfg = _cluster_config(root)
    args = ["-q", "--json", str(out / "result.json"), "--checkpoint", str(out / "ckpt.pt"), "--dist-timeout", "5"]
    events = []
    code = D.launch(2, cfg, args, env=worker_env(**fault(1, 2)), timeout=JOB_TIMEOUT,
                    log=lambda m: events.append((time.monotonic(), m)))
    done = time.monotonic()
    err = capfd.readouterr().err
    assert code == 1, (code, events, err)
    died = [t for t, m in events if "rank 1 exited with status 1" in m]
    assert died, events
    elapsed = done - died[0]  # from the death of rank 1 to the exit of rank 0
    assert elapsed < FAIL_BOUND, (elapsed, events, err)
    assert not any("terminating" in m for _, m in events)  # rank 0 noticed by itself
    assert "error: rank 0: a collective operation failed" in err
    assert not (out / "result.json").exists()
    assert load_checkpoint(out / "ckpt.pt")["epoch"] == 1  # epochs 0 and 1 finished

    assert D.launch(2, cfg, args + ["--resume"], env=worker_env(), timeout=JOB_TIMEOUT) == 0
    resumed = json.loads((out / "result.json").read_text())
    assert resumed["environment"]["distributed"]["replica_hashes"] == \
        expected["environment"]["distributed"]["replica_hashes"]
    assert losses(resumed) == losses(expected)
    print(f"rank 0 exited {elapsed:.1f} s after rank 1 died")


@pytest.mark.slow
def test_two_process_checkpoint_is_not_resumed_in_one(cluster_run, tmp_path, capsys):
    """The checkpoint records the world size: `--resume` in one process (which would continue with other
    global steps) is one error line naming it, before any training; with the flag, one warning line."""
    import shutil
    import signal

    root, full, _ = cluster_run
    path = tmp_path / "ckpt.pt"
    shutil.copy(full / "ckpt.pt", path)
    assert load_checkpoint(path)["recorded"]["world_size"] == 2
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    args = ["train", *CLUSTER[:-4], "--epochs", "5", "--device", "cpu", "-q", "--data-root", str(root),
            "--checkpoint", str(path),
            "--resume"]
    try:
        with pytest.raises(SystemExit) as e:
            main(args)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, err
        assert f"checkpoint {path} was written with world_size=2, this run has world_size=1;" in err
        main(args + ["--resume-mismatch-ok"])
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    out, err = capsys.readouterr()
    assert err.count("warning: ") == 1 and "world_size=2, this run has world_size=1" in err, err
    assert f"resuming from {path}: epoch 4 of 5 done" in out


@pytest.mark.nightly
def test_hung_rank_hits_the_timeout(tmp_path, fault):
    """Rank 1 hangs (alive, silent): rank 0's collective times out after --dist-timeout, it exits 1 and
    the launcher terminates the hung rank."""
    proc, seconds = dgl_exact_cli(["train", "--nproc", "2", *CLUSTER, "-q", "--data-root", str(tmp_path),
                                   "--dist-timeout", "3"], cwd=tmp_path, **fault(1, 1, "hang"))
    assert proc.returncode != 0 and seconds < JOB_TIMEOUT, (seconds, proc.stderr)
    assert "Timed out" in proc.stderr and "terminating them" in proc.stderr


@pytest.mark.nightly
def test_torchrun(cluster_run, tmp_path):
    """`torchrun --nproc-per-node 2 -m dgl_exact train` (c10d rendezvous) trains the same bits as --nproc."""
    root, _, expected = cluster_run
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("no torchrun next to the python executable")
    t0 = time.monotonic()
    proc = subprocess.run([torchrun, "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                           "--rdzv-endpoint", f"127.0.0.1:{D.free_port()}", "-m", "dgl_exact", "train", *CLUSTER,
                           "-q", "--data-root", str(root), "--json", str(tmp_path / "result.json")],
                          cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "result.json").read_text())
    assert results["environment"]["distributed"]["replica_hashes"] == \
        expected["environment"]["distributed"]["replica_hashes"]
    print(f"torchrun: {time.monotonic() - t0:.1f} s")


# ------------------------------------------------------------------------------------------------
# NCCL (GPU machines)
# ------------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("sampler", ["saint", "cluster"])
def test_nccl_single_rank(sampler, monkeypatch, tmp_path):
    """One NCCL rank (all a one-GPU machine allows): the CUDA path of DistributedTrainer (device per local
    rank, NCCL default group + gloo control group, DDP with device_ids, rank-0 evaluation, checkpoint)
    trains exactly the global steps of the single-process emulation."""
    port = D.free_port()
    for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        monkeypatch.setenv(key, value)
    cfg = TrainConfig(sampler=sampler, model="sage" if sampler == "saint" else "gcn", saint_budget=300, num_parts=40,
                      parts_per_batch=4, hidden=16, epochs=3, act_fp=True, data_root=str(tmp_path))
    try:
        trainer = D.DistributedTrainer(cfg, progress=False, log=None, timeout=30)
        assert trainer.ctx.backend == "nccl" and trainer.device == torch.device("cuda", 0)
        results = trainer.fit(checkpoint=str(tmp_path / "ckpt.pt"))
    finally:
        D.shutdown()
    emulated = D.GlobalBatchTrainer(cfg, 1, progress=False, log=None).fit()
    got = [h["loss"] for h in results.runs[0].history]
    want = [h["loss"] for h in emulated.runs[0].history]
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert load_checkpoint(tmp_path / "ckpt.pt")["epoch"] == 2


@pytest.mark.cuda
def test_nccl_two_gpus(tmp_path):
    """`--nproc 2` on two GPUs (NCCL): replicas agree and the loss curve is the emulation's."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (NCCL takes one GPU per process)")
    out = tmp_path / "nccl"
    args = [a if a != "cpu" else "cuda" for a in SAINT]
    proc, _ = dgl_exact_cli(["train", "--nproc", "2", *args, "--act-fp", "-q", "--data-root", str(tmp_path),
                             "--json", str(out / "result.json"), "--checkpoint", str(out / "ckpt.pt")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((out / "result.json").read_text())
    assert results["environment"]["distributed"]["backend"] == "nccl"
    (hashes,) = results["environment"]["distributed"]["replica_hashes"]
    assert hashes[0] == hashes[1]
    emulated, _ = emulate(out / "ckpt.pt")
    assert losses(results) == pytest.approx([h["loss"] for h in emulated.runs[0].history], rel=1e-3, abs=1e-5)


@pytest.mark.cuda
def test_more_processes_than_gpus(capsys, tmp_path):
    n = torch.cuda.device_count() + 1
    with pytest.raises(SystemExit) as e:
        main(["train", "--nproc", str(n), "--sampler", "saint", "--data-root", str(tmp_path)])
    assert e.value.code == 2 and f"needs {n} GPUs" in capsys.readouterr().err
