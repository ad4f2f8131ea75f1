"""``--resume`` is checked against everything that decides the result (dgl_exact.training.resume): a difference in
any recorded field is refused in one line naming it and both values; the fields that may change are listed; the
trainer records what it runs with; ``--resume-mismatch-ok`` continues with one warning line per difference.

The per-field cases test the comparison directly; the trainer and the CLI are run end to end on a 200-node
synthetic graph (one or two epochs), the budget planner's own run and two processes in the slow tests."""
import dataclasses
import re
import signal

import dgl

import pytest
import torch

import dgl_exact  # noqa: F401  (DGL compatibility shim)
from dgl_exact.cli import main
from dgl_exact.data import load_dataset
from dgl_exact.training import resume
from dgl_exact.training.checkpoint import load_checkpoint, save_checkpoint
from dgl_exact.training.config import TrainConfig
from dgl_exact.training.distributed import GlobalBatchTrainer
from dgl_exact.training.trainer import Trainer

SMALL = "synthetic-small:num_nodes=200,num_features=8,num_classes=3"
SAINT = dict(sampler="saint", saint_budget=60, sample_coverage=5)


@pytest.fixture(scope="module")
def small():
    return load_dataset(SMALL, "unused")


def _cfg(tmp_path, **kw):
    return TrainConfig(dataset=SMALL, hidden=8, data_root=str(tmp_path / "data"), **{"epochs": 2, **kw})


def _trainer(small, tmp_path, cls=Trainer, args=(), budget=None, plan=None, log=None, **kw):
    """A trainer of ``_cfg(**kw)`` (``cls(config, *args, ...)``) whose record holds ``budget`` and ``plan``."""
    trainer = cls(_cfg(tmp_path, **kw), *args, dataset=small, progress=False, log=log)
    trainer.memory_budget, trainer.memory_plan = budget, plan
    return trainer


def _checkpoint(small, tmp_path, name="c.pt", epochs=1, **kw):
    """A checkpoint after ``epochs`` epochs of a run of ``_trainer(**kw)``; its path."""
    path = str(tmp_path / name)
    _trainer(small, tmp_path, epochs=epochs, **kw).fit(checkpoint=path)
    return path


def _cli(args, capsys):
    """``dgl-exact ARGS`` in this process: (exit status, stdout, stderr); train's signal handlers undone."""
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    code = 0
    try:
        main(args)
    except SystemExit as e:
        code = e.code
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------------------------
# The comparison, one case per recorded field
# ------------------------------------------------------------------------------------------------
_PLAN = [[1, "fp32"], [3, "INT2"], [4, "INT2"]]
_BASE_RUN = {"world_size": 1, "memory_budget": 2**30, "memory_plan": _PLAN, "data_nodes": 200, "data_edges": 1890,
             "data_features": 8, "data_classes": 3, "data_split": [120, 40, 40], "data_graph_hash": "76ec749bf4ab2e42",
             "data_values_hash": "a933b807b4b399fd"}
# realistic other values where the generic rule (_other) would make an odd one
_OTHER = {"world_size": 2, "memory_budget": 512 * 2**20, "memory_plan": [[1, "INT2"], [3, "INT2"], [4, "INT2"]],
          "data_split": [100, 60, 40], "model": "sage", "sampler": "saint", "levels": "optimal", "bits": 4,
          "optimizer": "sgd", "loss": "exact_log", "saint_mode": "node", "nonfinite": "raise", "kept_frac": 0.5,
          "recompute": "2", "fanouts": "10,5", "dataset": "cora", "device": "cpu", "data_root": "elsewhere"}


def _other(name, value):
    """A value of field ``name`` other than ``value``."""
    if name in _OTHER and _OTHER[name] != value:
        return _OTHER[name]
    if value is None:
        return 7
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1 if isinstance(value, int) else value / 2 + 0.125
    return value + "-other"


def _baseline():
    return TrainConfig().to_dict(), dict(_BASE_RUN)


def test_the_table_covers_every_option_and_run_field(small, tmp_path):
    """Every TrainConfig option and every run field is recorded, each either checked or declared free; the
    trainer's record has exactly the run fields (a new option or field cannot slip past the check)."""
    run_names = [f.name for f in resume.RUN_FIELDS]
    assert resume.recorded_fields() == list(TrainConfig.fields()) + run_names
    assert set(resume.MAY_CHANGE) <= set(resume.recorded_fields())
    assert set(resume.checked_fields()) == set(resume.recorded_fields()) - set(resume.MAY_CHANGE)
    assert sorted(_trainer(small, tmp_path).recorded()) == sorted(run_names)


@pytest.mark.parametrize("name", resume.checked_fields())
def test_a_difference_in_any_checked_field_is_refused_in_one_line_naming_it(name):
    config, run = _baseline()
    current = {**config, **run}
    current[name] = _other(name, current[name])
    differences, unrecorded = resume.compare(config, run, current)
    assert [d[0] for d in differences] == [name] and not unrecorded
    _, saved, now = differences[0]
    assert saved != now
    with pytest.raises(ValueError) as e:
        resume.check_resume(config, run, current, "ck.pt")
    message = str(e.value)
    assert message.startswith(f"--resume: checkpoint ck.pt was written with {name}={saved}, this run has "
                              f"{name}={now}; "), message
    assert "\n" not in message and resume.MISMATCH_FLAG in message
    warned = []
    resume.check_resume(config, run, current, "ck.pt", mismatch_ok=True, warn=warned.append)
    assert len(warned) == 1 and f"{name}={saved}, this run has {name}={now}" in warned[0]


@pytest.mark.parametrize("name", sorted(resume.MAY_CHANGE))
def test_the_fields_that_may_change_are_not_refused(name):
    config, run = _baseline()
    current = {**config, **run, name: _other(name, config[name])}
    assert resume.compare(config, run, current) == ([], [])
    resume.check_resume(config, run, current, "ck.pt")


@pytest.mark.parametrize("saved, now, shown", [
    (2**30, None, "memory_budget=1.00GiB, this run has memory_budget=none"),
    (None, 2**30, "memory_budget=none, this run has memory_budget=1.00GiB"),
    (2**30, 512 * 2**20, "memory_budget=1.00GiB, this run has memory_budget=512.00MiB"),
    (2**30, 2**30 + 1, "memory_budget=1073741824, this run has memory_budget=1073741825"),  # read the same: bytes
])
def test_budgets_are_named_as_sizes(saved, now, shown):
    config, run = _baseline()
    run["memory_budget"] = saved
    with pytest.raises(ValueError, match=re.escape(shown)):
        resume.check_resume(config, run, {**config, **run, "memory_budget": now}, "ck.pt")


@pytest.mark.parametrize("now, shown", [
    (None, "memory_plan=3 tensors: INT2 2, fp32 1, this run has memory_plan=none (uniform compression)"),
    ([[1, "INT2"], [3, "INT2"], [4, "INT2"]], "memory_plan=3 tensors: INT2 2, fp32 1, this run has "
                                              "memory_plan=3 tensors: INT2 3"),
    ([[1, "INT2"], [3, "fp32"], [4, "INT2"]], "memory_plan=slot 1 kept as fp32, this run has "
                                              "memory_plan=slot 1 kept as INT2"),
])
def test_plans_are_named_by_what_differs(now, shown):
    config, run = _baseline()
    with pytest.raises(ValueError, match=re.escape(shown)):
        resume.check_resume(config, run, {**config, **run, "memory_plan": now}, "ck.pt")


def test_several_differences_are_one_line_naming_each():
    config, run = _baseline()
    current = {**config, **run, "world_size": 2, "bits": 8, "memory_budget": None}
    with pytest.raises(ValueError) as e:
        resume.check_resume(config, run, current, "ck.pt")
    message = str(e.value)
    assert "\n" not in message
    assert ("was written with bits=2 (this run: 8), world_size=1 (this run: 2), memory_budget=1.00GiB "
            "(this run: none);") in message
    warned = []
    resume.check_resume(config, run, current, "ck.pt", mismatch_ok=True, warn=warned.append)
    assert [w.split(" was written with ")[1].split(",")[0] for w in warned] == ["bits=2", "world_size=1",
                                                                                "memory_budget=1.00GiB"]


def test_an_option_newer_than_the_checkpoint_had_its_default():
    config, run = _baseline()
    del config["use_labels"]
    assert resume.compare(config, run, {**TrainConfig().to_dict(), **run}) == ([], [])
    differences, _ = resume.compare(config, run, {**TrainConfig(use_labels=True).to_dict(), **run})
    assert [d[0] for d in differences] == ["use_labels"]


def test_a_checkpoint_without_the_run_record_is_refused_naming_what_it_lacks():
    """Written before world size, budget, plan and data were recorded: none of them can be checked."""
    config, run = _baseline()
    with pytest.raises(ValueError) as e:
        resume.check_resume(config, None, {**config, **run}, "ck.pt")
    names = ", ".join(f.name for f in resume.RUN_FIELDS if f.name not in resume.UNKNOWN_IF_ABSENT)
    assert str(e.value).startswith(f"--resume: checkpoint ck.pt does not record {names} (written by an older "
                                   f"dgl_exact, they cannot be checked); if this run has the settings it was written "
                                   f"with, add {resume.MISMATCH_FLAG} to continue it"), str(e.value)
    warned = []
    resume.check_resume(config, None, {**config, **run}, "ck.pt", mismatch_ok=True, warn=warned.append)
    assert len(warned) == 1 and f"does not record {names}" in warned[0]
    with pytest.raises(ValueError, match=r"incomplete or damaged \(bad: recorded\)"):
        resume.check_resume(config, ["not", "a", "dict"], {**config, **run}, "ck.pt")


# ------------------------------------------------------------------------------------------------
# The trainer: what it records, what it refuses, what it says
# ------------------------------------------------------------------------------------------------
def test_the_checkpoint_records_the_run(small, tmp_path):
    path = _checkpoint(small, tmp_path, budget=3 * 2**20, plan=_PLAN)
    state = load_checkpoint(path)  # weights-only, as --resume reads it: the values compare equal after it
    assert state["recorded"] == {"world_size": 1, "memory_budget": 3 * 2**20, "memory_plan": _PLAN,
                                 "data_nodes": small.num_nodes, "data_edges": small.num_edges, "data_features": 8,
                                 "data_classes": 3, "data_split": [int(small.mask(s).sum())
                                                                   for s in ("train", "val", "test")],
                                 "data_graph_hash": resume.structure_fingerprint(small.graph),
                                 "data_values_hash": resume.values_fingerprint(small)}
    assert state["config"] == _cfg(tmp_path, epochs=1).to_dict()


def test_unchanged_resume_continues_and_says_from_where(small, tmp_path):
    path = _checkpoint(small, tmp_path, budget=3 * 2**20, plan=_PLAN)
    lines = []
    res = _trainer(small, tmp_path, budget=3 * 2**20, plan=_PLAN, log=lines.append).fit(checkpoint=path, resume=True)
    assert lines[0] == f"resuming from {path}: epoch 1 of 2 done"
    assert [h["epoch"] for h in res.runs[0].history] == [0, 1]


@pytest.mark.parametrize("saved, now, shown", [
    (dict(budget=2**20, plan=_PLAN), dict(), "memory_budget=1.00MiB (this run: none), memory_plan=3 tensors: "
                                             "INT2 2, fp32 1 (this run: none (uniform compression))"),
    (dict(budget=2**20, plan=_PLAN), dict(budget=2 * 2**20, plan=_PLAN),
     "memory_budget=1.00MiB, this run has memory_budget=2.00MiB"),
    (dict(), dict(budget=2**20, plan=_PLAN), "memory_budget=none (this run: 1.00MiB)"),
    (dict(budget=2**20, plan=_PLAN), dict(budget=2**20, plan=[[1, "INT2"], [3, "fp32"], [4, "INT2"]]),
     "memory_plan=slot 1 kept as fp32, this run has memory_plan=slot 1 kept as INT2"),
    (dict(), dict(seed=1), "seed=0, this run has seed=1"),
    (dict(), dict(bits=8), "bits=2, this run has bits=8"),
    (dict(), dict(model="sage"), "model=gcn, this run has model=sage"),
])
def test_resume_with_another_budget_plan_or_setting_is_refused_before_training(small, tmp_path, monkeypatch, saved,
                                                                                now, shown):
    path = _checkpoint(small, tmp_path, **saved)
    before = open(path, "rb").read()
    monkeypatch.setattr(Trainer, "train_epoch", lambda *a, **k: pytest.fail("trained"))
    with pytest.raises(ValueError) as e:
        _trainer(small, tmp_path, **now).fit(checkpoint=path, resume=True)
    assert shown in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert open(path, "rb").read() == before


def test_other_data_under_the_same_name_is_refused(small, tmp_path):
    """The dataset's files changed (here: another graph passed under the config's name): its counts differ."""
    path = _checkpoint(small, tmp_path)
    other = load_dataset("synthetic-small:num_nodes=240,num_features=8,num_classes=3", "unused")
    with pytest.raises(ValueError, match=r"data_nodes=200 \(this run: 240\), data_edges="):
        Trainer(_cfg(tmp_path), dataset=other, progress=False, log=None).fit(checkpoint=path, resume=True)


def _same_sizes(small, edges=False, features=False):
    """``small`` with the same counts and split sizes, and other edges (each edge's destination moved to the
    next node) or features (one value changed)."""
    src, dst = small.graph.edges(order="eid")
    g = dgl.graph((src, (dst + 1) % small.num_nodes if edges else dst), num_nodes=small.num_nodes)
    for key, value in small.graph.ndata.items():
        g.ndata[key] = value.clone()
    if features:
        g.ndata["feat"][7, 3] += 1.0
    return dataclasses.replace(small, graph=g)


@pytest.mark.parametrize("changed, field", [("edges", "data_graph_hash"), ("features", "data_values_hash")])
def test_a_same_sized_dataset_with_other_content_is_refused_naming_the_hash(small, tmp_path, changed, field):
    path = _checkpoint(small, tmp_path)
    other = _same_sizes(small, **{changed: True})
    saved, now = resume.data_record(small), resume.data_record(other)
    assert [k for k in saved if saved[k] != now[k]] == [field]  # the counts alone would not tell them apart
    with pytest.raises(ValueError) as e:
        Trainer(_cfg(tmp_path), dataset=other, progress=False, log=None).fit(checkpoint=path, resume=True)
    assert str(e.value).startswith(f"--resume: checkpoint {path} was written with {field}={saved[field]}, this run "
                                   f"has {field}={now[field]}; "), str(e.value)


def test_a_checkpoint_without_the_data_hashes_resumes_with_no_word(small, tmp_path):
    """Written before the hashes were recorded: unknown, not checked, no error and no warning; the counts
    still are, and the hashes are recorded from then on."""
    path = _checkpoint(small, tmp_path)
    state = load_checkpoint(path)
    for name in resume.UNKNOWN_IF_ABSENT:
        del state["recorded"][name]
    save_checkpoint(state, path)
    warned = []
    trainer = _trainer(small, tmp_path, log=None)
    trainer.warn = warned.append
    res = trainer.fit(checkpoint=path, resume=True)
    assert warned == [] and [h["epoch"] for h in res.runs[0].history] == [0, 1]
    assert load_checkpoint(path)["recorded"] == trainer.recorded()
    config, run = _baseline()
    old = {k: v for k, v in run.items() if k not in resume.UNKNOWN_IF_ABSENT}
    assert resume.compare(config, old, {**config, **run, "data_graph_hash": "other"}) == ([], [])
    assert [d[0] for d in resume.compare(config, old, {**config, **run, "data_nodes": 201})[0]] == ["data_nodes"]


def test_world_size_two_resumed_in_one_process_is_refused(small, tmp_path):
    """The one-process emulation of 2 ranks records world size 2 (a --nproc 2 run's checkpoint does: the slow
    test in tests/training/test_distributed.py); one process resuming it is refused, and the reverse."""
    two = _checkpoint(small, tmp_path, "two.pt", cls=GlobalBatchTrainer, args=(2,), **SAINT)
    assert load_checkpoint(two)["recorded"]["world_size"] == 2
    with pytest.raises(ValueError, match="was written with world_size=2, this run has world_size=1;"):
        _trainer(small, tmp_path, **SAINT).fit(checkpoint=two, resume=True)
    one = _checkpoint(small, tmp_path, "one.pt", **SAINT)
    with pytest.raises(ValueError, match="was written with world_size=1, this run has world_size=2;"):
        _trainer(small, tmp_path, GlobalBatchTrainer, (2,), **SAINT).fit(checkpoint=one, resume=True)
    lines = []
    _trainer(small, tmp_path, GlobalBatchTrainer, (2,), log=lines.append, **SAINT).fit(checkpoint=two, resume=True)
    assert lines[0] == f"resuming from {two}: epoch 1 of 2 done"


def test_mismatch_ok_warns_once_per_difference_and_records_the_new_settings(small, tmp_path):
    path = _checkpoint(small, tmp_path, budget=2**20, plan=_PLAN)
    warned = []
    trainer = _trainer(small, tmp_path, bits=8)
    trainer.warn = warned.append
    res = trainer.fit(checkpoint=path, resume=True, resume_mismatch_ok=True)
    assert [w.split(" was written with ")[1].split("=")[0] for w in warned] == ["bits", "memory_budget",
                                                                                "memory_plan"]
    assert all(w.endswith(f"continuing with this run's ({resume.MISMATCH_FLAG})") for w in warned)
    assert len(res.runs[0].history) == 2
    state = load_checkpoint(path)
    assert state["config"]["bits"] == 8 and state["recorded"]["memory_budget"] is None


def test_mismatch_ok_without_a_warn_hook_is_a_python_warning(small, tmp_path):
    path = _checkpoint(small, tmp_path)
    with pytest.warns(resume.ResumeMismatchWarning, match="seed=0, this run has seed=3"):
        _trainer(small, tmp_path, seed=3).fit(checkpoint=path, resume=True, resume_mismatch_ok=True)


def test_an_old_checkpoint_is_refused_unless_allowed(small, tmp_path):
    """A checkpoint written before the run record (no ``recorded``): refused; allowed, one warning line."""
    path = _checkpoint(small, tmp_path)
    state = load_checkpoint(path)
    del state["recorded"], state["format"]
    save_checkpoint(state, path)
    with pytest.raises(ValueError, match="does not record world_size, memory_budget, memory_plan, data_nodes"):
        _trainer(small, tmp_path).fit(checkpoint=path, resume=True)
    warned = []
    trainer = _trainer(small, tmp_path)
    trainer.warn = warned.append
    trainer.fit(checkpoint=path, resume=True, resume_mismatch_ok=True)
    assert len(warned) == 1 and "does not record" in warned[0]
    assert load_checkpoint(path)["recorded"] == trainer.recorded()  # recorded from now on


@pytest.mark.parametrize("epochs, runs, line", [
    (3, 1, "epoch 2 of 3 done"),
    (2, 1, "all 1 run(s) finished (2 epochs each): nothing to train"),
    (2, 2, "run 1 of 2 finished (2 epochs); starting run 2"),
    (4, 2, "run 1 of 2, epoch 2 of 4 done"),
])
def test_the_resume_line(small, tmp_path, epochs, runs, line):
    path = _checkpoint(small, tmp_path, epochs=2)
    lines = []
    _trainer(small, tmp_path, epochs=epochs, runs=runs, log=lines.append).fit(checkpoint=path, resume=True)
    assert lines[0] == f"resuming from {path}: {line}"


def test_the_resume_line_inside_an_epoch(small, tmp_path, monkeypatch):
    path, saint = str(tmp_path / "c.pt"), {**SAINT, "saint_budget": 20}  # 4 batches per epoch
    trainer = _trainer(small, tmp_path, **saint)
    trainer.checkpoint_batches = 1
    original = Trainer._step
    calls = []

    def dying(self, *args, **kwargs):  # the third batch of epoch 0 never finishes
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "_step", dying)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(checkpoint=path)
    monkeypatch.setattr(Trainer, "_step", original)
    lines = []
    _trainer(small, tmp_path, log=lines.append, **saint).fit(checkpoint=path, resume=True)
    assert lines[0] == f"resuming from {path}: epoch 0 of 2 done, and 2 batch(es) of epoch 1"


# ------------------------------------------------------------------------------------------------
# The command line
# ------------------------------------------------------------------------------------------------
def _train_args(tmp_path, *extra):
    return ["train", "--dataset", SMALL, "--hidden", "8", "--epochs", "2", "--quiet",
            "--data-root", str(tmp_path / "data"), *extra]


def test_cli_resume_line_without_a_terminal(small, tmp_path, capsys):
    path = _checkpoint(small, tmp_path)
    code, out, err = _cli(_train_args(tmp_path, "--checkpoint", path, "--resume"), capsys)
    assert code == 0, err
    assert f"resuming from {path}: epoch 1 of 2 done" in out.splitlines()


def test_cli_mismatch_is_one_error_line_and_ok_flag_warns(small, tmp_path, capsys):
    path = _checkpoint(small, tmp_path)
    code, out, err = _cli(_train_args(tmp_path, "--checkpoint", path, "--resume", "--bits", "4"), capsys)
    assert code == 2 and err == (f"error: --resume: checkpoint {path} was written with bits=2, this run has bits=4; "
                                 "resume with the settings it was written with, start a new checkpoint (another "
                                 "--checkpoint path), or add --resume-mismatch-ok to continue with this run's\n")
    code, out, err = _cli(_train_args(tmp_path, "--checkpoint", path, "--resume", "--bits", "4",
                                      "--resume-mismatch-ok"), capsys)
    assert code == 0 and err == (f"warning: --resume: checkpoint {path} was written with bits=2, this run has bits=4; "
                                 "continuing with this run's (--resume-mismatch-ok)\n"), err
    code, _, err = _cli(_train_args(tmp_path, "--checkpoint", path, "--resume-mismatch-ok"), capsys)
    assert code == 2 and err.startswith("error: --resume-mismatch-ok goes with --resume") and err.count("\n") == 1


@pytest.mark.parametrize("budget, shown", [
    ("3MiB", "memory_budget=2.00MiB, this run has memory_budget=3.00MiB"),
    (None, "memory_budget=2.00MiB (this run: none)"),
])
def test_cli_other_budget_is_refused_before_planning(small, tmp_path, capsys, monkeypatch, budget, shown):
    """Another budget is refused before the planner's probe steps, none at once (no planning)."""
    from dgl_exact.planning import budget as planner

    path = _checkpoint(small, tmp_path, budget=2 * 2**20, plan=_PLAN)
    monkeypatch.setattr(planner, "plan_for_training", lambda *a, **k: pytest.fail("planned"))
    extra = ["--memory-budget", budget] if budget else []
    code, _, err = _cli(_train_args(tmp_path, "--checkpoint", path, "--resume", *extra), capsys)
    assert code == 2 and err.startswith("error: --resume: checkpoint") and shown in err and err.count("\n") == 1, err


def test_cli_nproc_resume_of_a_one_process_checkpoint_is_refused_before_launching(small, tmp_path, capsys,
                                                                                   monkeypatch):
    from dgl_exact.training import distributed

    path = _checkpoint(small, tmp_path, **SAINT)
    monkeypatch.setattr(distributed, "launch", lambda *a, **k: pytest.fail("launched"))
    code, _, err = _cli(_train_args(tmp_path, "--sampler", "saint", "--saint-budget", "60", "--sample-coverage", "5",
                                    "--device", "cpu", "--nproc", "2", "--checkpoint", path, "--resume"), capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"checkpoint {path} was written with world_size=1, this run has world_size=2;" in err


@pytest.mark.slow
def test_cli_memory_budget_run_resumed_without_or_with_another_budget(tmp_path, capsys):
    """The reported case, with the planner's own plan: a --memory-budget run's checkpoint resumed without
    the budget, or with another, is refused naming it; the same budget resumes (the same plan)."""
    path = str(tmp_path / "c.pt")
    common = ["train", "--dataset", SMALL, "--hidden", "8", "--quiet", "--data-root", str(tmp_path / "data"),
              "--checkpoint", path]
    code, out, err = _cli([*common, "--epochs", "1", "--memory-budget", "2MiB"], capsys)
    assert code == 0, out + err
    recorded = torch.load(path, weights_only=True)["recorded"]
    assert recorded["memory_budget"] == 2 * 2**20 and recorded["memory_plan"], recorded
    code, _, err = _cli([*common, "--epochs", "2", "--resume"], capsys)
    assert code == 2 and "was written with memory_budget=2.00MiB (this run: none), memory_plan=" in err, err
    code, _, err = _cli([*common, "--epochs", "2", "--resume", "--memory-budget", "3MiB"], capsys)
    assert code == 2 and "memory_budget=2.00MiB, this run has memory_budget=3.00MiB" in err, err
    code, out, err = _cli([*common, "--epochs", "2", "--resume", "--memory-budget", "2MiB"], capsys)
    assert code == 0 and f"resuming from {path}: epoch 1 of 2 done" in out, out + err


def test_structure_fingerprint_reads_whichever_format_the_graph_holds_and_creates_none():
    """The same edges with the same ids hash alike from a COO, a CSC or a CSR, in int32 or int64, and reading
    it creates no format (a products-sized COO is 2 GB); another edge changes it."""
    import dgl

    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 50, (300,), generator=gen), torch.randint(0, 50, (300,), generator=gen)
    g = dgl.graph((src, dst), num_nodes=50)
    csc = dgl.graph((src, dst), num_nodes=50).formats("csc")
    csc.create_formats_()
    csr = dgl.graph((src.int(), dst.int()), num_nodes=50).formats("csr")
    csr.create_formats_()
    hashes = {resume.structure_fingerprint(x) for x in (g, csc, csr)}
    assert len(hashes) == 1
    assert csc.formats()["created"] == ["csc"] and csr.formats()["created"] == ["csr"]
    moved = dst.clone()
    moved[7] = (moved[7] + 1) % 50
    assert resume.structure_fingerprint(dgl.graph((src, moved), num_nodes=50)) not in hashes
    swapped = torch.cat([src[1:2], src[:1], src[2:]]), torch.cat([dst[1:2], dst[:1], dst[2:]])  # other ids
    if (src[0], dst[0]) != (src[1], dst[1]):
        assert resume.structure_fingerprint(dgl.graph(swapped, num_nodes=50)) not in hashes
