"""A user's mistake on the command line gets one line on stderr (``error: ...``) and exit status 2, before any
work is done: bad ``--conf`` files and values, bad dataset names, empty splits, seeds out of range, output paths
that could not be written, bad benchmark numbers. Runs the CLI in-process (``dgl_exact.cli.main``)."""
import json
import os

import pytest

from tests.cli._helpers import TINY, _in_tmp_and_signals_restored, assert_one_line_error, run  # noqa: F401


def write(path, text):
    path.write_text(text)
    return path


def unwritable_folder(tmp_path):
    """A folder in which nothing can be created, for whoever runs the tests: a 0o555 folder for a normal user;
    for root (who writes through permissions) a path under /sys, which is read-only for everyone."""
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return str(folder)
    candidate = "/sys/dgl-exact-test-read-only"
    try:
        os.mkdir(candidate)
    except OSError:
        return candidate
    os.rmdir(candidate)  # pragma: no cover - a writable /sys: no read-only place to test with
    pytest.skip("no read-only folder available")


# --------------------------------------------------------------------------------------------------
# --conf files
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, needles", [
    ("bits: [1, 2\nepochs: 3\n", ["not valid YAML", "line 2"]),
    ("bits: two\n", ["bits must be an int in {1, 2, 4, 8}, got 'two' (str)"]),
    ("bits: 2.7\n", ["bits must be an int in {1, 2, 4, 8}, got 2.7 (float)"]),
    ("bits: true\n", ["bits must be an int", "got True (bool)"]),
    ('act_fp: "false"\n', ["act-fp must be true or false, got 'false' (str)", "without quotes"]),
    ("epochs: 2.5\n", ["epochs must be an int in [1, 2**31 - 1], got 2.5 (float)"]),
    ("epochs: 2.0\n", ["epochs must be an int in [1, 2**31 - 1], got 2.0 (float)"]),
    ("dataset: 5\n", ["dataset must be a string, got 5 (int)"]),
    ('lr: "1e-3"\n', ["lr must be a number > 0, got '1e-3' (str)"]),
    ("lr: .nan\n", ["lr must be a number > 0, got nan"]),
    ("kept-frac: 0\n", ["kept-frac must be a number in (0, 1]"]),
    ("seed: -3\n", ["seed must be an int in [0, 2**64 - 1]"]),
    ("grad_norm: 0\n", ["grad-norm must be a number > 0 or null"]),
    ("model: GCN\n", ["model must be one of gcn"]),
    ("epochs: 1\nepochs: 2\n", ["key 'epochs' given twice"]),
    ("kept-frac: 0.5\nkept_frac: 0.25\n", ["kept-frac given twice"]),
    ("bitz: 2\n", ["unknown option 'bitz'", "valid options: dataset, model"]),
    ("- bits\n- 2\n", ["expected a mapping of option: value, got a list"]),
])
def test_bad_conf_is_one_line(tmp_path, capsys, text, needles):
    conf = write(tmp_path / "run.yaml", text)
    line = assert_one_line_error(run(["train", "--conf", conf, "--epochs", "1", "-q"], capsys), *needles)
    assert f"conf {conf}:" in line  # the message names the file


def test_conf_folder_and_binary_file(tmp_path, capsys):
    (tmp_path / "confs").mkdir()
    assert_one_line_error(run(["train", "--conf", tmp_path / "confs"], capsys), "is a folder")
    (tmp_path / "bin.yaml").write_bytes(b"\x89PNG\x00\xff\xfe")
    assert_one_line_error(run(["train", "--conf", tmp_path / "bin.yaml"], capsys), "not a text file")


def test_conf_values_reach_training_with_their_types(tmp_path, capsys):
    """``lr: 1e-3`` (a string to YAML 1.1) is the float 0.001; the command line still overrides the file, and
    ``--bits`` arrives as an int."""
    conf = write(tmp_path / "run.yaml", f"lr: 1e-3\nweight-decay: 5E-4\nbits: 8\nhidden: 8\ndataset: '{TINY}'\n")
    code, out, err = run(["train", "--conf", conf, "--bits", "4", "--epochs", "1", "-q", "--json", "r.json"], capsys)
    assert code == 0, err
    config = json.loads((tmp_path / "r.json").read_text())["config"]
    assert config["lr"] == 0.001 and config["weight_decay"] == 0.0005 and config["bits"] == 4
    assert "activations INT4" in out


# --------------------------------------------------------------------------------------------------
# options and dataset names
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, needles", [
    (["--dataset", "synthetic:foo=1"], ["bad synthetic parameter 'foo=1'", "num_nodes"]),
    (["--dataset", "synthetic:num_nodes"], ["bad synthetic parameter 'num_nodes'"]),
    (["--dataset", "synthetic:num_nodes=1.5"], ["num_nodes", "must be an integer, got '1.5'"]),
    (["--dataset", "synthetic:num_nodes=x"], ["num_nodes", "must be an integer, got 'x'"]),
    (["--dataset", "synthetic:avg_degree=inf"], ["avg_degree", "must be a finite number"]),
    (["--dataset", "synthetic-foo"], ["unknown synthetic dataset 'synthetic-foo'"]),
    (["--seed", str(2**70)], ["seed must be an int in [0, 2**64 - 1]"]),
    (["--seed", "-1"], ["seed must be an int in [0, 2**64 - 1]"]),
    (["--seed", str(2**64 - 1), "--runs", "2"], ["seed + runs - 1 must be <= 2**64 - 1"]),
    (["--lr", "nan"], ["lr must be a number > 0, got nan"]),
    (["--lr", "inf"], ["lr must be a number > 0, got inf"]),
    (["--grad-norm", "nan"], ["grad-norm must be a number > 0"]),
    (["--weight-decay", "-1"], ["weight-decay must be a number >= 0"]),
    (["--dist-timeout", "nan"], ["--dist-timeout must be a finite number of seconds > 0"]),
])
def test_bad_option_is_one_line(capsys, args, needles):
    result = run(["train", "--epochs", "1", "-q", *args], capsys)
    assert_one_line_error(result, *needles)
    assert result[1] == ""  # refused before loading anything


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_empty_split_is_refused_before_training(capsys, split):
    """An empty training split used to train on nothing and report a test score; an empty validation split
    ended in KeyError 'test'; an empty test split reported a test score of nan."""
    result = run(["train", "--dataset", f"{TINY},{split}_frac=0", "--epochs", "1", "-q", "--hidden", "8"], capsys)
    assert_one_line_error(result, f"the {split} split is empty (0 of 60 nodes)")
    assert "test acc" not in result[1]


# --------------------------------------------------------------------------------------------------
# output paths: checked before the first epoch, so no work is lost
# --------------------------------------------------------------------------------------------------
def test_output_under_a_file_is_refused_before_training(tmp_path, capsys):
    write(tmp_path / "afile", "x")
    for option in ("--json", "--checkpoint"):
        result = run(["train", "--epochs", "1", "-q", option, "afile/sub/out"], capsys)
        assert_one_line_error(result, f"{option} afile/sub/out: cannot create the folder", "is not a folder")
        assert result[1] == ""


def test_output_in_an_unwritable_folder_is_refused_before_training(tmp_path, capsys):
    folder = unwritable_folder(tmp_path)
    result = run(["train", "--epochs", "1", "-q", "--json", f"{folder}/sub/r.json"], capsys)
    assert_one_line_error(result, "--json", "cannot write in", "give a path in a writable folder")
    assert result[1] == ""
    result = run(["train", "--epochs", "1", "-q", "--checkpoint", f"{folder}/c.pt"], capsys)
    assert_one_line_error(result, "--checkpoint", "cannot write in")


def test_json_and_checkpoint_must_differ(tmp_path, capsys):
    (tmp_path / "sub").mkdir()
    os.symlink(tmp_path / "sub", tmp_path / "link")
    for a, b in [("x.pt", "x.pt"), ("x.pt", str(tmp_path / "x.pt")), ("sub/x.pt", "link/./x.pt")]:
        result = run(["train", "--epochs", "1", "-q", "--json", a, "--checkpoint", b], capsys)
        assert_one_line_error(result, "--json and --checkpoint name the same file")
        assert not os.path.exists(tmp_path / "x.pt") and not os.path.exists(tmp_path / "sub" / "x.pt")


def test_read_only_data_root_with_sampler_caches_trains(tmp_path, capsys):
    """The samplers' cache folder under a read-only --data-root: the CLI creates nothing there and the
    run trains (the caches fall back to memory with a warning)."""
    folder = unwritable_folder(tmp_path)
    code, out, err = run(["train", "--dataset", TINY, "--sampler", "cluster", "--num-parts", "4",
                          "--parts-per-batch", "2", "--hidden", "8", "--epochs", "1", "-q", "--data-root", folder],
                         capsys)
    assert code == 0, err
    assert "test acc" in out and "Traceback" not in err


# --------------------------------------------------------------------------------------------------
# benchmarks
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, needle", [
    (["kernels", "--rows", "-5"], "Invalid value for '--rows': -5 is not in the range 1<=x<=2147483647"),
    (["kernels", "--cols", "0"], "Invalid value for '--cols'"),
    (["kernels", "--repeats", "0"], "Invalid value for '--repeats'"),
    (["speed", "--epochs", "0"], "Invalid value for '--epochs'"),
    (["speed", "--warmup", "-1"], "Invalid value for '--warmup'"),
    (["memory", "--layers", "0"], "Invalid value for '--layers'"),
    (["memory", "--hidden", "0"], "Invalid value for '--hidden'"),
    (["accuracy", "--runs", "0"], "Invalid value for '--runs'"),
    (["accuracy", "--epochs", "0"], "Invalid value for '--epochs'"),
    (["all", "--runs", "0"], "Invalid value for '--runs'"),
    (["all", "--speed-epochs", "0"], "Invalid value for '--speed-epochs'"),
    (["memory", "--dataset", "synthetic:foo=1"], "bad synthetic parameter"),
    (["memory", "--out", "afile/x"], "--out afile/x: cannot create the folder"),
    (["kernels", "--out", "afile/x"], "--out afile/x: cannot create the folder"),
    (["all", "--accuracy-dataset", "nope"], "unknown dataset 'nope'"),
    (["all", "--benchmarks-md", "afile/B.md"], "--benchmarks-md afile/B.md: cannot create the folder"),
])
def test_bench_bad_input_is_one_line_before_any_work(tmp_path, capsys, args, needle):
    write(tmp_path / "afile", "x")
    if args[0] in ("memory", "speed", "accuracy") and "--dataset" not in args:
        args = [*args, "--dataset", TINY]
    result = run(["bench", *args, "-q"], capsys)
    assert_one_line_error(result, needle)
    assert sorted(os.listdir(tmp_path)) == ["afile"]  # nothing measured, nothing written


def test_bench_accuracy_bad_conf(tmp_path, capsys):
    conf = write(tmp_path / "acc.yaml", "bits: 2.7\n")
    assert_one_line_error(run(["bench", "accuracy", "--conf", conf, "--runs", "1", "--epochs", "1", "-q"], capsys),
                          "bits must be an int in {1, 2, 4, 8}, got 2.7 (float)")


@pytest.mark.parametrize("command", [["info"], ["datasets"], ["train", "--sampler", "saint", "--dataset", TINY],
                                     ["plan", "--nodes", "100", "--edges", "200", "--features", "8", "--classes", "3"]])
@pytest.mark.parametrize("name,value,needle", [
    ("DGL_EXACT_BACKEND", "bogus", "expected one of ext, numba, dgl, torch"),
    ("WORLD_SIZE", "abc", "expected an integer from 1 to"),
    ("MASTER_PORT", "0", "expected a TCP port from 1 to 65535"),
])
def test_bad_environment_is_one_line_before_any_work(monkeypatch, capsys, command, name, value, needle):
    monkeypatch.setenv(name, value)
    result = run(command, capsys)
    assert_one_line_error(result, f"environment variable {name}={value!r}", needle)
    assert result[1] == ""  # nothing ran
