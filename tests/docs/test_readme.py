"""The README is short and everything in it works as written.

* its Python blocks run, in order, in one namespace (in this process: a graph of 1,000 nodes);
* every command of its shell blocks is one this file knows how to check, and is checked: ``dgl-exact`` commands
  against the CLI's own options (and, for blocks not marked ``<!-- no-run: ... -->``, run in the slow suite:
  ``dgl-exact train`` on the bundled Cora); ``pip install`` lines name extras that setup.cfg declares and the
  PyTorch index; ``pytest`` is the command ``.ci/run`` runs as "the README's test command";
* its relative links point to files that exist.
"""
from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys

import pytest

from tests.docs._blocks import PYTHON, ROOT, SHELL, blocks, check_cli_command, dgl_exact_args, run_python_blocks

README = ROOT / "README.md"
MAX_LINES = 150


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, (f"README.md has {len(lines)} lines, at most {MAX_LINES}: move the detail into "
                                     "docs/guide/")


@pytest.mark.usefixtures("one_thread")
def test_python_blocks_run(tmp_path, monkeypatch):
    ran, skipped = run_python_blocks(README, tmp_path, monkeypatch)
    assert ran >= 1, "the README's 'convert your model' block is gone"


def _commands():
    for block in blocks(README):
        if block.lang in SHELL and not block.skip:
            for argv in block.commands:
                yield block, argv


def _extras() -> set:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return set(cfg["options.extras_require"])


def test_every_command_is_checked():
    """A command this file cannot check fails here, so a new kind of command in the README gets a check."""
    unknown = [f"{b.where}: {' '.join(argv)}" for b, argv in _commands()
               if dgl_exact_args(argv) is None and argv[:2] != ["pip", "install"] and argv[0] != "pytest"]
    assert not unknown, f"README commands without a check in tests/docs/test_readme.py: {unknown}"


def test_dgl_exact_commands_parse():
    bad = []
    for block, argv in _commands():
        args = dgl_exact_args(argv)
        if args is not None:
            why = check_cli_command(args)
            if why:
                bad.append(f"{block.where}: {' '.join(argv)}: {why}")
    assert not bad, "commands the CLI refuses:\n" + "\n".join(bad)


def test_pip_commands_name_declared_extras():
    """Not run (they need the network and change the environment): the extras they name exist, and torch comes
    from PyTorch's own index when an index is given."""
    extras, seen = _extras(), 0
    for block, argv in _commands():
        if argv[:2] != ["pip", "install"]:
            continue
        seen += 1
        for arg in argv[2:]:
            m = re.fullmatch(r"(?:\.|dgl-exact)\[([\w,-]+)\]", arg)
            if m:
                missing = set(m.group(1).split(",")) - extras
                assert not missing, f"{block.where}: {' '.join(argv)} names extras setup.cfg lacks: {missing}"
            if arg.startswith("https://"):
                assert arg.startswith("https://download.pytorch.org/whl/"), f"{block.where}: unexpected index {arg}"
    assert seen, "the README has no install command"


def test_pytest_is_ci_test_command():
    """``pytest`` (the README's test command) is what ``.ci/run`` runs as the README's test command: not run again
    here (it is the whole default suite)."""
    assert any(argv[0] == "pytest" for _, argv in _commands())
    assert re.search(r"^python -m pytest -q$", (ROOT / ".ci" / "run").read_text(), re.M)


def test_relative_links_exist():
    text = README.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not missing, f"README links to missing files: {missing}"


def _runnable():
    for block, argv in _commands():
        args = dgl_exact_args(argv)
        if args is not None and not block.no_run:
            yield pytest.param(args, id=" ".join(args) or "dgl-exact")


@pytest.mark.slow
@pytest.mark.parametrize("args", list(_runnable()))
def test_dgl_exact_commands_run(args, tmp_path):
    """``dgl-exact train`` (the quickstart: GCN, INT2, bundled Cora) runs to the end."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "dgl_exact", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"dgl-exact {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}"


def test_every_readme_block_has_a_language():
    """A fence without a language would escape every check above."""
    untyped = [b.where for b in blocks(README) if b.lang not in PYTHON | SHELL]
    assert not untyped, f"README blocks without python/bash: {untyped}"
