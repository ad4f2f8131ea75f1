"""Fenced code blocks of the documentation's Markdown pages (the guide, the README), and the ``dgl-exact``
commands in their shell blocks.

A block is skipped, with the reason, when the line before its opening fence is an HTML comment
``<!-- skip: REASON -->`` (a block that needs a real dataset, a GPU, several machines or a network).
``<!-- no-run: REASON -->`` before a shell block keeps its ``dgl-exact`` commands checked against the CLI's
options (fast, in the default suite) but never runs them (they would take minutes or need data); shell
blocks without it are also run, in the slow suite.
"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = {"python", "py", "pycon"}
SHELL = {"bash", "sh", "shell", "console"}
# modules of the extras (setup.cfg): a page whose block imports one that is not installed is skipped from there on
OPTIONAL = {"torch_geometric": 'pip install ".[pyg]"', "matplotlib": 'pip install ".[plot]"'}
_MARK = re.compile(r"<!--\s*(skip|no-run|needs)\s*:\s*(.+?)\s*-->")


@dataclass
class Block:
    path: Path
    line: int           # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None = None     # reason, from <!-- skip: ... --> (or an unmet <!-- needs: torch>=X.Y -->)
    no_run: str | None = None   # reason, from <!-- no-run: ... -->
    commands: list = field(default_factory=list)

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, in order (``` and ~~~ fences; MyST ``{directive}`` fences are
    not code and are left out)."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w{}-]*)", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        if lang.startswith("{"):
            continue
        prev = lines[start - 1].strip() if start else ""
        mark = _MARK.fullmatch(prev)
        block = Block(path, start + 1, lang, "\n".join(body) + "\n")
        if mark and mark.group(1) == "needs":
            block.skip = unmet(mark.group(2))
        elif mark:
            setattr(block, "skip" if mark.group(1) == "skip" else "no_run", mark.group(2))
        if lang in SHELL:
            block.commands = shell_commands(block.code)
        out.append(block)
    return out


def unmet(requirement: str) -> str | None:
    """``torch>=2.4``: None where the installed torch satisfies it, else the reason to skip."""
    m = re.fullmatch(r"torch\s*>=\s*(\d+)\.(\d+)", requirement.strip())
    if not m:
        raise ValueError(f"<!-- needs: {requirement} -->: only torch>=X.Y is understood")
    import torch

    have = tuple(int(p) for p in re.findall(r"\d+", torch.__version__)[:2])
    want = (int(m.group(1)), int(m.group(2)))
    return None if have >= want else f"needs {requirement} (torch {torch.__version__} installed)"


def shell_commands(code: str) -> list[list[str]]:
    """Each command line of a shell block as argv (``\\`` continuations joined, comments dropped; ``a && b``
    gives two commands)."""
    joined = re.sub(r"\\\n\s*", " ", code)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        if not line or line.startswith("#"):
            continue
        for part in re.split(r"\s*&&\s*", line):
            argv = shlex.split(part, comments=True)
            if argv:
                out.append(argv)
    return out


def dgl_exact_args(argv: list[str]) -> list[str] | None:
    """The arguments of the ``dgl-exact`` command in ``argv`` (also ``python -m dgl_exact ...`` and
    ``torchrun ... -m dgl_exact ...``), else None."""
    env = 0
    while env < len(argv) and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[env]):
        env += 1  # VAR=value prefixes
    argv = argv[env:]
    if argv and argv[0] == "dgl-exact":
        return argv[1:]
    if "-m" in argv:
        k = argv.index("-m")
        if k + 1 < len(argv) and argv[k + 1] == "dgl_exact" and argv[0] in ("python", "python3", "torchrun"):
            return argv[k + 2:]
    return None


def run_python_blocks(page, tmp_path, monkeypatch):
    """Run a page's Python blocks in order in one namespace (cwd: ``tmp_path``); returns (ran, skipped)."""
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__guide__"}
    ran, skipped = 0, []
    for block in blocks(page):
        if block.lang not in PYTHON:
            continue
        if block.skip:
            skipped.append(f"{block.where}: {block.skip}")
            continue
        code = compile(block.code, block.where, "exec")
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                exec(code, namespace)  # noqa: S102
            except ImportError as e:
                # ``import dgl_exact.pyg`` without PyG raises its own ImportError from PyG's ModuleNotFoundError
                missing = (e.name or getattr(e.__cause__, "name", None) or "").split(".")[0]
                if missing not in OPTIONAL:
                    raise AssertionError(f"guide block {block.where} failed: {type(e).__name__}: {e}") from e
                # the page is for an extra that is not installed here: the rest of it needs the same module
                skipped.append(f"{block.where} and after: needs {missing} ({OPTIONAL[missing]})")
                return ran, skipped
            except Exception as e:
                raise AssertionError(f"guide block {block.where} failed: {type(e).__name__}: {e}") from e
        ran += 1
    return ran, skipped


def check_cli_command(args: list[str]) -> str | None:
    """Why ``dgl-exact ARGS`` is not a command to document, or None: parsed by the CLI itself with ``--help``
    appended (an unknown command or option fails, nothing runs), and no option spelled the old way (hidden
    options that ``cli._common.renamed`` keeps working for one release)."""
    import click
    from click.testing import CliRunner

    from dgl_exact.cli import cli

    result = CliRunner().invoke(cli, [*args, "--help"])
    if result.exit_code != 0:
        return (result.output.strip().splitlines() or [repr(result.exception)])[-1]
    command, rest, path = cli, list(args), ["dgl-exact"]
    while isinstance(command, click.Group) and rest and rest[0] in command.commands:
        command, rest = command.commands[rest[0]], rest[1:]
        path.append(command.name)
    hidden = {opt for p in command.params if isinstance(p, click.Option) and p.hidden for opt in p.opts}
    old = [a.split("=", 1)[0] for a in rest if a.split("=", 1)[0] in hidden]
    if old:
        return f"deprecated spelling {', '.join(old)}: use the name `{' '.join(path)} --help` shows"
    return None


def inline_commands(path: Path) -> list[tuple[int, list[str]]]:
    """``dgl-exact ...`` code spans in a page's prose, as (line, arguments), a span wrapped over lines joined;
    spans written as a pattern (``[--compile]``, ``A|B``, ``<what>``, ``...``) are left out."""
    text = path.read_text()
    text = re.sub(r"^(```|~~~).*?^\1", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    out = []
    for m in re.finditer(r"`(dgl-exact [^`]+)`", text):
        command = " ".join(m.group(1).split())
        if any(c in command for c in "[|<") or "..." in command:
            continue
        out.append((text.count("\n", 0, m.start()) + 1, shlex.split(command)[1:]))
    return out


def resolve(dotted: str):
    """The object ``dgl_exact.a.b.c`` names (modules imported as needed); AttributeError/ImportError if none."""
    import importlib

    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[:i + 1]))
    return obj
