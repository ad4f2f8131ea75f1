"""Every code block of the user guide (``docs/guide/*.md``, also pages added later) runs as written.

* Python blocks of a page run in order, in one namespace per page, in this process (the guide's examples use
  the bundled Cora or graphs of a few hundred nodes, so a page takes seconds).
* ``dgl-exact`` commands in shell blocks: every one is parsed by the CLI itself (``--help`` appended: an option
  that does not exist fails, nothing runs); those of blocks not marked ``<!-- no-run: ... -->`` also run, in
  the slow suite, in a fresh process.
* A block after ``<!-- skip: REASON -->`` (it needs a real dataset, a GPU, several machines) is skipped with
  that reason. See ``tests/docs/_blocks.py``.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from tests.docs._blocks import (ROOT, SHELL, blocks, check_cli_command, dgl_exact_args, inline_commands,
                                resolve, run_python_blocks)

NEEDS_EXTRA = {"dgl_exact.pyg": "torch_geometric"}  # names in these modules are checked where the extra is installed

PAGES = sorted((ROOT / "docs" / "guide").glob("*.md")) + [ROOT / "docs" / "index.md",
                                                           ROOT / "docs" / "glossary.md"]
PAGE_IDS = [str(p.relative_to(ROOT / "docs")) for p in PAGES]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_python_blocks_run(page, tmp_path, monkeypatch):
    ran, skipped = run_python_blocks(page, tmp_path, monkeypatch)
    if not ran:
        pytest.skip("no Python block to run" + (f" ({'; '.join(skipped)})" if skipped else ""))


def _cli_commands(page):
    for block in blocks(page):
        if block.lang in SHELL and not block.skip:
            for argv in block.commands:
                args = dgl_exact_args(argv)
                if args is not None:
                    yield block, args


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_cli_commands_parse(page):
    """Every ``dgl-exact`` command of the page names a command and options that exist."""
    commands = list(_cli_commands(page))
    if not commands:
        pytest.skip("no dgl-exact command")
    bad = []
    for block, args in commands:
        why = check_cli_command(args)
        if why:
            bad.append(f"{block.where}: dgl-exact {' '.join(args)}: {why}")
    assert not bad, "commands the CLI refuses:\n" + "\n".join(bad)


def test_inline_commands_parse():
    """``dgl-exact ...`` written in the prose of the guide and the README (``dgl-exact bench accuracy --dataset cora
    --runs 10`` beside a number) names options that exist, in their current spelling."""
    bad = []
    for page in [*PAGES, ROOT / "README.md"]:
        for line, args in inline_commands(page):
            why = check_cli_command(args)
            if why:
                bad.append(f"{page.relative_to(ROOT)}:{line}: dgl-exact {' '.join(args)}: {why}")
    assert not bad, "commands the CLI refuses:\n" + "\n".join(bad)


def _runnable():
    seen = set()  # a command on several pages (dgl-exact info) runs once
    for page in PAGES:
        for block, args in _cli_commands(page):
            if not block.no_run and tuple(args) not in seen:
                seen.add(tuple(args))
                yield pytest.param(args, id=f"{block.where}:{' '.join(args)[:40]}")


@pytest.mark.slow
@pytest.mark.parametrize("args", list(_runnable()))
def test_cli_commands_run(args, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "dgl_exact", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"dgl-exact {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}"


def test_blocks_are_found_and_marks_read(tmp_path):
    """The extraction the tests above rely on: fences, languages, skip/no-run marks, continuations."""
    page = tmp_path / "page.md"
    page.write_text("text\n\n```python\nx = 1\n```\n\n<!-- skip: needs a GPU -->\n```python\ny = 2\n```\n\n"
                    "<!-- no-run: takes minutes -->\n```bash\ndgl-exact train \\\n    --model sage  # comment\n"
                    "pip install . && dgl-exact info\n```\n\n```{toctree}\nx\n```\n")
    found = blocks(page)
    assert [(b.lang, b.skip, b.no_run) for b in found] == [
        ("python", None, None), ("python", "needs a GPU", None), ("bash", None, "takes minutes")]
    assert found[2].commands == [["dgl-exact", "train", "--model", "sage"], ["pip", "install", "."],
                                 ["dgl-exact", "info"]]
    assert [dgl_exact_args(a) for a in found[2].commands] == [["train", "--model", "sage"], None, ["info"]]
    assert dgl_exact_args(["torchrun", "--nproc-per-node", "4", "-m", "dgl_exact", "train"]) == ["train"]
    page.write_text("<!-- needs: torch>=2.0 -->\n```python\nx = 1\n```\n"
                    "<!-- needs: torch>=99.0 -->\n```python\ny = 2\n```\n")
    assert [b.skip for b in blocks(page)][0] is None
    assert blocks(page)[1].skip.startswith("needs torch>=99.0")
    page.write_text("Run `dgl-exact train\n  --epochs 3` or `dgl-exact train [--compile]`.\n"
                    "```bash\n`dgl-exact x`\n```\n")
    assert inline_commands(page) == [(1, ["train", "--epochs", "3"])]
    assert resolve("dgl_exact.ops.keep") is importlib.import_module("dgl_exact.ops.keep")
    with pytest.raises(ImportError):
        resolve("dgl_exact.ops.no_such_name")


_PATH = re.compile(r"(?<![\w/.-])((?:benchmarks|scripts|dgl_exact|tests|examples|cuda|docs)/[\w./*<>-]*[\w*/])")


def test_repository_paths_exist():
    """Files and folders of the repository the pages name (``benchmarks/cpu-2core/...``, ``scripts/...``,
    ``dgl_exact/ops/keep.py``) exist: a moved or deleted file fails here instead of leaving a dead reference."""
    missing = []
    for page in [*PAGES, ROOT / "README.md"]:
        for lineno, line in enumerate(page.read_text().splitlines(), 1):
            for path in _PATH.findall(line):
                if "<" in path or path.startswith("docs/_build"):
                    continue  # a pattern (benchmarks/MACHINE/<what>/), not a path
                if not any(ROOT.glob(path.rstrip("/"))):
                    missing.append(f"{page.relative_to(ROOT)}:{lineno}: {path}")
    assert not missing, "pages name paths that do not exist:\n" + "\n".join(missing)


def test_cli_check_refuses_unknown_and_old_spellings():
    import click

    from dgl_exact.cli import cli

    assert check_cli_command(["train", "--epochs", "3"]) is None
    assert "--no-such-option" in check_cli_command(["train", "--no-such-option"])
    assert check_cli_command(["no-such-command"]) is not None

    def commands(group, path):
        for name, command in group.commands.items():
            if isinstance(command, click.Group):
                yield from commands(command, [*path, name])
            else:
                yield [*path, name], command

    old = [(path, opt) for path, command in commands(cli, []) for p in command.params
           if isinstance(p, click.Option) and p.hidden and not p.is_flag for opt in p.opts]
    if not old:
        pytest.skip("no option has an old spelling in this release")
    path, opt = old[0]
    assert "deprecated spelling" in check_cli_command([*path, opt, "x"])


_NAME = re.compile(r"(?<![\w/.])(dgl_exact(?:\.\w+)+)")


def test_named_objects_exist():
    """Every ``dgl_exact.x.y`` the pages name (a function, a class, a module, an attribute) exists."""
    missing = []
    for page in [*PAGES, ROOT / "README.md"]:
        for lineno, line in enumerate(page.read_text().splitlines(), 1):
            for name in _NAME.findall(line):
                module = ".".join(name.split(".")[:2])
                if module in NEEDS_EXTRA and importlib.util.find_spec(NEEDS_EXTRA[module]) is None:
                    continue
                try:
                    resolve(name)
                except (AttributeError, ImportError) as e:
                    missing.append(f"{page.relative_to(ROOT)}:{lineno}: {name} ({type(e).__name__}: {e})")
    assert not missing, "pages name objects that do not exist:\n" + "\n".join(missing)
