"""Flags with odd values: every size is read by one parser that refuses what it cannot represent, output paths
are checked (or their folders created, the same way for every command) before any work, and a synthetic graph
that cannot fit the machine is refused before anything is allocated. Each is one ``error:`` line, exit 2."""
import json

import pytest

import dgl_exact.planning.predict as P
from dgl_exact.data import load_dataset
from tests.cli._helpers import TINY, _in_tmp_and_signals_restored, assert_one_line_error, run  # noqa: F401

PLAN = ["plan", "--nodes", "600", "--edges", "3000", "--features", "16", "--classes", "4", "--model", "sage",
        "--hidden", "16", "--layers", "2", "--settings", "INT2"]


@pytest.mark.parametrize("text", ["1e400GiB", "1e309", "inf", "nan", "1e19", "99999999999TiB"])
def test_parse_bytes_refuses_what_it_cannot_represent(text):
    with pytest.raises(ValueError, match="--x"):
        P.parse_bytes(text, "--x")


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1, True])
def test_parse_bytes_refuses_odd_numbers(value):
    with pytest.raises(ValueError):
        P.parse_bytes(value)


def test_parse_bytes_is_exact():
    assert P.parse_bytes("17.42MiB") == int(17.42 * 2**20) == 18266193
    assert P.parse_bytes("9e18") == 9 * 10**18 and P.parse_bytes("0") == 0
    assert P.parse_bytes("1e-99999GiB") == 0


def _no_work(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("work started before the flags were checked")

    monkeypatch.setattr(P, "plan", boom)
    import dgl_exact.training.trainer as T

    monkeypatch.setattr(T.Trainer, "__init__", boom)


@pytest.mark.parametrize("value", ["1e400GiB", "1e309"])
def test_train_memory_budget_overflow_is_one_line(capsys, monkeypatch, value):
    _no_work(monkeypatch)
    assert_one_line_error(run(["train", "--dataset", TINY, "--memory-budget", value], capsys), "--memory-budget",
                          value)


@pytest.mark.parametrize("flag", ["--memory-budget", "--device"])
def test_plan_size_overflow_is_one_line(capsys, monkeypatch, flag):
    _no_work(monkeypatch)
    args = [a for a in PLAN] + [flag, "1e400GiB"]
    assert_one_line_error(run(args, capsys), "1e400GiB")


def test_plan_json_under_a_file_is_refused_before_work(tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    (tmp_path / "afile").write_text("x")
    assert_one_line_error(run(PLAN + ["--json", tmp_path / "afile" / "x.json"], capsys), "--json")


def test_plan_json_in_a_missing_folder_is_created_as_train_does(tmp_path, capsys):
    out = tmp_path / "missing-dir" / "x.json"
    code, stdout, err = run(PLAN + ["--device", "1GiB", "--json", out], capsys)
    assert code == 0, err
    assert [r["setting"] for r in json.loads(out.read_text())] == ["INT2"]


def test_train_json_in_a_missing_folder_is_created(tmp_path, capsys):
    out = tmp_path / "missing-dir" / "x.json"
    code, stdout, err = run(["train", "--dataset", TINY, "--epochs", "1", "--runs", "1", "-q", "--json", out], capsys)
    assert code == 0, err
    assert out.is_file()


def test_synthetic_too_large_for_the_machine_is_one_line_before_allocating(capsys, monkeypatch):
    _no_work(monkeypatch)
    line = assert_one_line_error(run(["train", "--dataset", "synthetic:num_nodes=50,avg_degree=1e9"], capsys),
                                 "GiB", "avg_degree")
    assert "available" in line


def test_synthetic_too_large_from_python_is_a_value_error():
    with pytest.raises(ValueError, match="GiB"):
        load_dataset("synthetic:num_nodes=50,avg_degree=1e9")


# ---------------------------------------------------------------------------------------------------
# the budget's minimum is a fixed point; a measured step over the budget is said
# ---------------------------------------------------------------------------------------------------
def test_suggested_budget_given_back_is_at_least_the_minimum():
    from dgl_exact.planning.budget import suggested_budget

    for needed in (18266194, 18_270_000, 2**20, 2**20 + 1, 3 * 2**30 + 7, 1000, 5):
        text, value = suggested_budget(needed)
        assert P.parse_bytes(text) == value >= needed, (needed, text)


@pytest.mark.nightly
def test_refused_budget_minimum_is_accepted_when_given_back():
    import re

    import dgl_exact.planning.budget as B

    spec = P.PlanSpec(model="sage", nodes=3000, edges=15000, features=32, classes=4, hidden=32, layers=3)
    with pytest.raises(B.BudgetError) as err:
        B.budget_plan(spec, 0, replicas=1, sample_nodes=600)
    msg = str(err.value)
    text = re.search(r"--memory-budget (\S+)", msg).group(1)
    assert "checked" in msg, msg
    plan = B.budget_plan(spec, P.parse_bytes(text), replicas=1, sample_nodes=600)
    assert plan.record.fits


def test_budget_report_says_by_how_much_a_measured_step_is_over():
    from types import SimpleNamespace

    from dgl_exact.planning.budget import budget_report

    plan = SimpleNamespace(budget=1000, record=SimpleNamespace(static_bytes=300, step_peak_bytes=650,
                                                               total_bytes=950))
    over = budget_report(plan, 800)
    assert over["measured_total_bytes"] == 1100 and over["over_budget_bytes"] == 100
    assert budget_report(plan, 600)["over_budget_bytes"] == 0
    assert budget_report(plan, None)["measured_step_peak_bytes"] is None


BIG = str(10**30)


@pytest.mark.parametrize("args, needles", [
    (["train", "--dataset", TINY, "--block-rows", BIG], ["block-rows must be an int in [1, 2**31 - 1]"]),
    (["train", "--dataset", TINY, "--hidden", BIG], ["hidden must be an int in [1, 2**31 - 1]"]),
    (["train", "--dataset", TINY, "--layers", BIG], ["layers must be an int in [1, 2**31 - 1]"]),
    (["train", "--dataset", TINY, "--model", "gat", "--heads", BIG], ["heads must be an int in [1, 2**31 - 1]"]),
    (["train", "--dataset", TINY, "--epochs", BIG], ["epochs must be an int in [1, 2**31 - 1]"]),
    (["train", "--dataset", TINY, "--sampler", "neighbor", "--batch-size", BIG], ["batch-size must be an int in"]),
    (["train", "--dataset", TINY, "--sampler", "neighbor", "--fanouts", f"5,{BIG}"], ["each from 1 to 2147483647"]),
    (["train", "--dataset", TINY, "--sampler", "saint", "--saint-budget", BIG], ["saint-budget must be an int in"]),
    (["train", "--dataset", TINY, "--sampler", "cluster", "--num-parts", BIG], ["num-parts must be an int in"]),
    (["train", "--dataset", TINY, "--test-speed", BIG], ["--test-speed needs a number of epochs in [1, 2147483647]"]),
    (["train", "--dataset", TINY, "--sampler", "saint", "--checkpoint", "c.pt", "--checkpoint-batches", BIG],
     ["--checkpoint-batches must be in [1, 2147483647]"]),
    (["train", "--dataset", TINY, "--sampler", "saint", "--dist-timeout", "1e308"],
     ["--dist-timeout must be a finite number of seconds > 0, at most 8.64e+13"]),
    (["plan", "--nodes", BIG, "--edges", "10", "--features", "8", "--classes", "3"], ["--nodes", "2<=x<="]),
    (["plan", "--nodes", "100", "--edges", BIG, "--features", "8", "--classes", "3"], ["--edges"]),
    (["plan", "--nodes", "100", "--edges", str(2**62), "--features", "8", "--classes", "3"],
     ["more than nodes x (nodes - 1)"]),
    (["plan", "--nodes", str(10**10), "--edges", str(2**62), "--features", "8", "--classes", "3"],
     ["sample graph", "edges per node"]),
    (["plan", "--nodes", "100", "--edges", "10", "--features", BIG, "--classes", "3"], ["--features"]),
    (["plan", "--nodes", "100", "--edges", "10", "--features", "8", "--classes", "3", "--hidden", BIG], ["--hidden"]),
    (["plan", "--nodes", "100", "--edges", "10", "--features", "8", "--classes", "3", "--layers", "100000"],
     ["plan at most 73 layers"]),
])
def test_sizes_past_what_the_program_handles_are_one_line(capsys, args, needles):
    assert_one_line_error(run(args, capsys), *needles)


def test_plan_sample_step_that_cannot_be_allocated_is_one_line(capsys, monkeypatch):
    """Widths within bounds whose sample step does not fit this machine: one line, not a traceback."""
    def no_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(P, "plan", no_memory)
    result = run([*PLAN[:-2], "--hidden", str(2**31 - 1)], capsys)
    assert_one_line_error(result, "does not fit in this machine's memory")


@pytest.mark.parametrize("args, needle", [
    (["bench", "memory", "--allow-dirty", "--layers", BIG], "--layers"),
    (["bench", "speed", "--allow-dirty", "--hidden", BIG], "--hidden"),
    (["bench", "speed", "--allow-dirty", "--epochs", BIG], "--epochs"),
    (["bench", "profile", "--allow-dirty", "--steps", BIG], "--steps must be in [1, 2147483647]"),
    (["bench", "plan", "--allow-dirty", "--layers", BIG], "--layers"),
    (["bench", "plan", "--allow-dirty", "--layers", "1000", "--dataset", TINY], "plan at most 73 layers"),
    (["bench", "budget", "--allow-dirty", "--hidden", BIG], "--hidden"),
])
def test_bench_sizes_are_bounded_before_any_work(capsys, args, needle):
    assert_one_line_error(run(args, capsys), needle)
