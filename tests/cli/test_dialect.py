"""One CLI dialect: the same option name for the same thing in every command, defaults shown in every --help, one
error prefix, suggestions for mistyped names, old spellings working for one release; and the console entry
importing neither torch nor DGL until a command body runs."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest

from dgl_exact.cli import _common, cli
from dgl_exact.cli.train import TRAIN_DEFAULTS
from tests.cli._helpers import _in_tmp_and_signals_restored, assert_one_line_error, run  # noqa: F401

REPO = Path(__file__).resolve().parents[2]

# Names that mean the same thing: at most one of each group may be an option anywhere in `dgl-exact`.
SYNONYMS = [
    {"--model", "--models", "--arch", "--architecture"},
    {"--memory-budget", "--budget", "--budgets", "--mem-budget", "--memory-budgets"},
    {"--out", "--root", "--output", "--out-dir", "--output-dir", "--results"},
    {"--json", "--json-out", "--output-json", "--json-path"},
    {"--device", "--devices", "--dev"},
    {"--data-root", "--data-dir", "--root-dir", "--datadir"},
    {"--dataset", "--datasets", "--data", "--graph"},
    {"--settings", "--setting", "--compressions"},
    {"--quiet", "--silent", "--no-progress"},
    {"--epochs", "--num-epochs", "--n-epochs"},
    {"--runs", "--seeds", "--num-runs"},
    {"--hidden", "--hidden-size", "--num-hidden", "--width"},
    {"--layers", "--num-layers", "--depth"},
]


def _commands(group=cli, path=()):
    """(path, command) of every command under ``group``."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from _commands(command, path + (name,))
        else:
            yield path + (name,), command


def _default(param):
    """An option's default; None where it has none (click 8.2+ marks that with a sentinel)."""
    return None if param.default is None or type(param.default).__name__ == "Sentinel" else param.default


def _visible_options(command):
    return [p for p in command.params if isinstance(p, click.Option) and not p.hidden and p.name != "help"]


ALL = list(_commands())


def test_every_command_is_walked():
    names = {" ".join(path) for path, _ in ALL}
    assert {"train", "plan", "datasets", "info", "bench memory", "bench speed", "bench all", "bench plan",
            "bench budget", "bench minibatch"} <= names


def test_no_two_option_names_for_one_thing():
    used = {}
    for path, command in ALL:
        for param in _visible_options(command):
            for opt in param.opts + param.secondary_opts:
                used.setdefault(opt, set()).add(" ".join(path))
    for group in SYNONYMS:
        present = {name: sorted(used[name]) for name in group if name in used}
        assert len(present) <= 1, f"one thing, several option names: {present}"


@pytest.mark.parametrize("path,command", ALL, ids=[" ".join(p) for p, _ in ALL])
def test_every_option_shows_its_default(path, command):
    ctx = click.Context(command, info_name=path[-1], show_default=True)
    missing = []
    for param in _visible_options(command):
        if param.is_flag and not param.secondary_opts and not isinstance(param.show_default, str):
            continue  # an on/off flag: off unless given
        if param.name == "version":
            continue
        extra = param.get_help_extra(ctx) if hasattr(param, "get_help_extra") else None
        shown = extra.get("default") if extra is not None else (
            param.show_default if isinstance(param.show_default, str) else _default(param))
        if shown in (None, "", "None"):
            missing.append(param.opts[0])
    assert not missing, f"{' '.join(path)}: no default shown for {missing}"


def test_help_of_every_command_renders_with_defaults(capsys):
    for path, _ in ALL:
        code, out, err = run([*path, "--help"], capsys)
        assert code == 0 and "Usage: dgl-exact" in out, (path, err)
    code, out, _ = run(["train", "--help"], capsys)
    assert "--framework pyg only).  [default: (gcn)]" in out and "[default: (200)]" in out


def test_same_default_model_and_device_everywhere():
    for path, command in ALL:
        for param in _visible_options(command):
            if param.name == "model":
                assert (_default(param) or param.show_default) == _common.DEFAULT_MODEL, path
            if param.name == "device":
                assert (_default(param) or param.show_default) == _common.DEFAULT_DEVICE, path
    assert TRAIN_DEFAULTS["model"] == _common.DEFAULT_MODEL and TRAIN_DEFAULTS["device"] == _common.DEFAULT_DEVICE


def test_names_and_defaults_known_without_torch_match_training():
    """The CLI keeps its choices and train's shown defaults without importing torch: they must equal the
    training package's."""
    from dgl_exact.training import config, models, workloads

    assert _common.MODELS == tuple(models.MODELS)
    assert _common.PYG_MODELS == workloads.PYG_MODELS
    assert _common.TRAIN_MODELS == config.TRAIN_MODELS
    assert _common.SAMPLERS == tuple(config.SAMPLERS) and _common.SAINT_MODES == tuple(config.SAINT_MODES)
    assert _common.MAX_COUNT == config.MAX_COUNT
    assert _common.bundled_configs() == config.bundled_configs()
    defaults = config.TrainConfig().to_dict()
    train_options = {p.name for p in cli.commands["train"].params}
    for name, value in defaults.items():
        if name not in train_options:
            continue  # a config field without an option (input_dropout, alpha, ...)
        assert name in TRAIN_DEFAULTS, name
        if value is None or name == "data_root":
            assert isinstance(TRAIN_DEFAULTS[name], str), name  # described in words: decided from other options
        else:
            assert TRAIN_DEFAULTS[name] == value, (name, TRAIN_DEFAULTS[name], value)


@pytest.mark.parametrize("args,suggestion", [
    (["train", "--dataset", "coraa"], "did you mean 'cora'?"),
    (["train", "--model", "gcnn"], "did you mean 'gcn'"),
    (["train", "--conf", "cora_gnc"], "did you mean 'cora_gcn'"),
    (["train", "--sampler", "nieghbor"], "did you mean 'neighbor'?"),
    (["bench", "plan", "--model", "saeg", "--allow-dirty"], "did you mean 'sage'?"),
])
def test_mistyped_names_get_a_suggestion_not_the_whole_list(capsys, args, suggestion):
    line = assert_one_line_error(run(args, capsys), suggestion)
    assert "known:" not in line and "choose from" not in line


def test_a_name_close_to_nothing_lists_the_names(capsys):
    line = assert_one_line_error(run(["train", "--dataset", "zzzzzz"], capsys), "unknown dataset")
    assert "cora" in line and "did you mean" not in line


@pytest.mark.parametrize("args", [["nope"], ["train", "--epochs", "abc"], ["train", "--no-such-option"],
                                  ["plan", "--layers", "0"]])
def test_one_error_prefix(capsys, args):
    code, out, err = run(args, capsys)
    assert code == 2 and err.startswith("error: ") and "Error:" not in err, err


def test_old_spelling_works_with_one_deprecation_line(capsys):
    code, out, err = run(["plan", "--nodes", "600", "--edges", "3000", "--features", "8", "--classes", "3",
                          "--budget", "1e400GiB"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 2, err
    assert lines[0] == "warning: --budget is deprecated and goes in the next release; use --memory-budget"
    assert lines[1].startswith("error: ") and "--memory-budget" in lines[1]  # the value went to --memory-budget


@pytest.mark.parametrize("args,old,new", [
    (["plan", "--budget", "1GiB", "--memory-budget", "1GiB"], "--budget", "--memory-budget"),
    (["bench", "memory", "--models", "gcn", "--model", "sage", "--allow-dirty"], "--models", "--model"),
    (["bench", "all", "--root", "a", "--out", "b", "--allow-dirty"], "--root", "--out"),
    (["bench", "budget", "--budgets", "INT2", "--memory-budget", "INT1", "--allow-dirty"], "--budgets",
     "--memory-budget"),
])
def test_old_and_new_spelling_together_is_one_line(capsys, args, old, new):
    assert_one_line_error(run(args, capsys), f"{old} is the old spelling of {new}")


def test_old_spelling_hidden_from_help(capsys):
    code, out, _ = run(["bench", "memory", "--help"], capsys)
    assert code == 0 and "--model " in out and "--models" not in out


def _fresh(code: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=180, cwd=str(REPO), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_console_entry_and_help_import_neither_torch_nor_dgl():
    out = _fresh("""
        import contextlib, io, json, sys
        import dgl_exact
        after_package = sorted(m for m in ("torch", "dgl") if m in sys.modules)
        import dgl_exact.cli
        after_cli = sorted(m for m in ("torch", "dgl") if m in sys.modules)
        helps = {}
        for args in (["--help"], ["train", "--help"], ["plan", "--help"], ["bench", "--help"],
                     ["bench", "memory", "--help"], ["bench", "all", "--help"], ["datasets", "--help"]):
            with contextlib.redirect_stdout(io.StringIO()):
                try:
                    dgl_exact.cli.main(args)
                except SystemExit:
                    pass
            helps[" ".join(args)] = sorted(m for m in ("torch", "dgl") if m in sys.modules)
        print(json.dumps({"package": after_package, "cli": after_cli, "helps": helps}))
    """)
    assert out["package"] == [] and out["cli"] == []
    assert all(mods == [] for mods in out["helps"].values()), out["helps"]


def test_info_reports_versions(capsys):
    """`info` (which imports torch and DGL, unlike --help) names the installed versions and the backend."""
    import importlib.metadata

    code, text, err = run(["info"], capsys)
    assert code == 0, err
    out = {"text": text}
    lines = {}
    for line in out["text"].splitlines():
        if line.strip():
            lines.setdefault(line.split()[0], line)  # the first: the backend's report names dgl and torch again
    assert lines["dgl"].split()[1] == importlib.metadata.version("dgl")
    # the local version label (+cpu, +cu121) is in torch.__version__ and not always in the wheel's metadata
    assert lines["torch"].split()[1].split("+")[0] == importlib.metadata.version("torch").split("+")[0]
    assert "kernel backend" in out["text"]
