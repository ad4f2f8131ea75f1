"""Rerun a machine's recorded benchmark runs: every run of ``<root>/<machine>/<suite>/runs.json`` by the command
it records (:mod:`.suites`), suite by suite in :data:`ORDER`, then each suite's README.md is regenerated.

A recorded command is split with :func:`shlex.split` and run without a shell. Accepted:
``[VAR=value ...] dgl-exact ARGS``, ``[VAR=value ...] python -m dgl_exact ARGS`` (both run as
``<this python> -m dgl_exact ARGS``) and ``[VAR=value ...] [bash|sh|python] scripts/NAME ARGS`` (a script of the
repository's scripts/ folder); a trailing ``(remark)`` is dropped. Anything else (``cd ... && ...``, pipes, other
programs) is refused with a line that says why. A run whose result file is another suite's
(``../checks/gpu_check.log``) is left to that suite's run. In a command, the word ``DIR`` (also as ``VAR=DIR``)
stands for the folder of the run's result file. A ``dgl-exact bench SUITE`` command writes to a folder of its own
(``--out``; a relative ``--json`` goes to the run's folder) and its result files are moved in under the recorded
result's name (a result that is a text file gets what it printed); another ``dgl-exact`` command's printed output
is written to the result file. A recorded ``dgl-exact bench all ...`` (the measuring suites) runs once, with
``--measure``."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from .._files import atomic_write
from . import suites as manifests

#: the order the suites of a machine are rerun in
ORDER = ("memory", "speed", "kernels", "accuracy", "profile", "plan", "budget", "minibatch", "checks")
_SHELL = ("&&", "||", ";", "|", ">", ">>", "<", "&")
_NAME_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789"


@dataclass
class Rerun:
    """One recorded run: its suite, folder, manifest entry and, unless ``refused``, the argv and env to run."""
    suite: str
    folder: str
    run: Dict
    argv: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    stdout_to: Optional[str] = None  # the result file, for commands that print their result
    out_dir: Optional[str] = None  # a `bench SUITE` command: the folder its results are moved to from --out
    scratch: Optional[str] = None  # ... and its --out, a folder of its own (its files take the result's name)
    refused: str = ""
    skipped: str = ""  # a run whose result another suite's run writes
    same_as: Optional["Rerun"] = None  # a `bench all` run already in the plan (run once)

    @property
    def command(self) -> str:
        return self.run["command"]


def _words(command: str) -> List[str]:
    text = command.strip()
    if text.endswith(")") and " (" in text:  # "cmd (remark)"
        text = text[:text.rindex(" (")].rstrip()
    try:
        return shlex.split(text)
    except ValueError as e:
        raise ValueError(f"cannot split it ({e})") from None


def _set_option(args: List[str], name: str, value: str) -> List[str]:
    """``args`` with option ``name`` set to ``value`` (replacing ``name X`` / ``name=X``, else appended)."""
    out, i = [], 0
    while i < len(args):
        if args[i] == name:
            i += 2
            continue
        if args[i].startswith(name + "="):
            i += 1
            continue
        out.append(args[i])
        i += 1
    return out + [name, value]


def _option(args: List[str], name: str) -> Optional[str]:
    for i, word in enumerate(args):
        if word == name and i + 1 < len(args):
            return args[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def _dgl_exact(item: Rerun, args: List[str], out_dir: str, root: str) -> None:
    if args[:2] == ["bench", "all"]:
        args = _set_option(args, "--out", root) + ([] if "--measure" in args else ["--measure"])
    elif args[:1] == ["bench"] and len(args) > 1 and args[1] != "report":
        stem = os.path.splitext(os.path.basename(item.run["results"]))[0]
        item.out_dir, item.scratch = out_dir, os.path.join(out_dir, f".rerun-{stem}")
        args = _set_option(args, "--out", item.scratch)
        if os.path.splitext(item.run["results"])[1] not in (".jsonl", ".json", ".csv", ".md"):
            item.stdout_to = os.path.join(item.folder, item.run["results"])  # a log of what it printed
        json_path = _option(args, "--json")
        if json_path and not os.path.isabs(json_path):
            args = _set_option(args, "--json", os.path.join(out_dir, json_path))
        conf = _option(args, "--conf")  # a YAML kept beside the results
        if conf and not os.path.isabs(conf) and not os.path.exists(conf) and os.path.exists(
                os.path.join(out_dir, conf)):
            args = _set_option(args, "--conf", os.path.join(out_dir, conf))
    elif args[:1] == ["bench"]:
        raise ValueError("`bench report` measures nothing")
    else:
        item.stdout_to = os.path.join(item.folder, item.run["results"])
    item.argv = [sys.executable, "-m", "dgl_exact"] + args


def _prepare(item: Rerun, root: str, scripts: str) -> None:
    out_dir = os.path.normpath(os.path.join(item.folder, os.path.dirname(item.run["results"])))
    if os.path.normpath(item.run["results"]).startswith(os.pardir + os.sep):
        item.skipped = f"its result, {item.run['results']}, is written by another suite's run"
        return None
    words = [out_dir if w == "DIR" else w for w in _words(item.command)]
    shell = [w for w in words if w in _SHELL or w.startswith("(")]
    if shell:
        raise ValueError(f"a shell command ({shell[0]!r}); record it as one program with its arguments")
    while words and "=" in words[0] and words[0].split("=", 1)[0].strip(_NAME_CHARS) == "":
        name, value = words.pop(0).split("=", 1)
        item.env[name] = out_dir if value == "DIR" else value
    if words[:1] == ["dgl-exact"]:
        return _dgl_exact(item, words[1:], out_dir, root)
    if words[:1] and os.path.basename(words[0]).startswith("python") and words[1:3] == ["-m", "dgl_exact"]:
        return _dgl_exact(item, words[3:], out_dir, root)
    program = words[1:] if words[:1] and words[0] in ("bash", "sh") or os.path.basename(
        words[0] if words else "").startswith("python") else words
    if program and os.path.normpath(program[0]).startswith("scripts" + os.sep) and os.path.isfile(
            os.path.join(scripts, os.path.relpath(program[0], "scripts"))):
        runner = words[:len(words) - len(program)]
        runner = [sys.executable if r.startswith("python") else r for r in runner]
        item.argv = runner + program
        return None
    raise ValueError("not a `dgl-exact ...`, `python -m dgl_exact ...` or `scripts/...` command")


def plan(root: str, machine: str, only=None, scripts: str = "scripts") -> List[Rerun]:
    """The recorded runs of ``<root>/<machine>/``, suite by suite in :data:`ORDER` (then other suites, sorted),
    each prepared to run or ``refused``; ``only``: the suites to take (ValueError for one without a manifest)."""
    machine_dir = os.path.join(root, machine)
    if not os.path.isdir(machine_dir):
        raise ValueError(f"no folder {machine_dir}: the machine's results go to {root}/MACHINE/SUITE/")
    present = [d for d in os.listdir(machine_dir)
               if os.path.isfile(os.path.join(machine_dir, d, manifests.MANIFEST))]
    names = [s for s in ORDER if s in present] + sorted(set(present) - set(ORDER))
    if only:
        missing = [s for s in only if s not in present]
        if missing:
            raise ValueError(f"no {manifests.MANIFEST} in {', '.join(os.path.join(machine_dir, s) for s in missing)}"
                             f" (suites with one: {', '.join(names) or 'none'})")
        names = [s for s in names if s in only]
    items, by_command = [], {}
    for suite in names:
        folder = os.path.join(machine_dir, suite)
        for run in manifests.read_manifest(folder):
            item = Rerun(suite, folder, run)
            try:
                _prepare(item, root, scripts)
            except ValueError as e:
                item.refused = str(e)
            if item.argv[3:5] == ["bench", "all"]:
                item.same_as = by_command.setdefault(tuple(item.argv), item)
                item.same_as = None if item.same_as is item else item.same_as
            items.append(item)
    return items


def _run(item: Rerun) -> int:
    env = {**os.environ, **item.env}
    if item.scratch is not None:
        shutil.rmtree(item.scratch, ignore_errors=True)
    if item.stdout_to is None:
        return subprocess.run(item.argv, env=env).returncode
    done = subprocess.run(item.argv, env=env, stdout=subprocess.PIPE)
    if done.returncode == 0:
        with atomic_write(item.stdout_to, "wb", shared=True) as f:
            f.write(done.stdout)
    return done.returncode


def _move_results(item: Rerun) -> Dict:
    """Move what a `bench SUITE` run wrote to its own --out into the run's folder, its result file (and the
    files of the same stem) under the recorded result's name; returns what the run recorded of itself."""
    recorded = manifests.read_manifest(item.scratch)
    if len(recorded) != 1:
        raise ValueError(f"{item.scratch}: expected the run to record one result, found {len(recorded)}")
    made = None if item.stdout_to else os.path.splitext(recorded[0]["results"])[0]
    stem = os.path.splitext(os.path.basename(item.run["results"]))[0]
    for name in sorted(os.listdir(item.scratch)):
        if name in (manifests.MANIFEST, manifests.README) or name.startswith("."):
            continue
        base, ext = os.path.splitext(name)
        os.replace(os.path.join(item.scratch, name), os.path.join(item.out_dir, (stem if base == made else base) + ext))
    shutil.rmtree(item.scratch, ignore_errors=True)
    return recorded[0]


def _keep_entries(folder: str, before: List[Dict], fresh: Optional[Dict] = None) -> None:
    """The manifest as it was (its order, commands, titles, notes), each run's machine, code and date updated
    from what the rerun recorded (``fresh``: the entry of the run of ``fresh["results"]``); runs the rerun added
    are kept after them."""
    now = {r["results"]: r for r in manifests.read_manifest(folder)}
    if fresh is not None:
        now[fresh["results"]] = fresh
    kept = [{**r, **{k: now[r["results"]][k] for k in ("machine", "code", "date") if k in now.get(r["results"], {})}}
            for r in before]
    known = {r["results"] for r in before}
    manifests.write_manifest(folder, kept + [r for r in now.values() if r["results"] not in known])


def _after(item: Rerun, before: Dict[str, List[Dict]]) -> None:
    """Put a finished run's results in place and update the manifests (their order and commands kept)."""
    fresh = None
    if item.scratch is not None:
        fresh = {**_move_results(item), "results": item.run["results"]}
    elif item.same_as is None and not item.argv[3:5] == ["bench", "all"]:  # a run that does not record itself
        from .provenance import stamp

        fresh = {"results": item.run["results"], "code": stamp()["code"]}
    for folder, runs in before.items():  # `bench all` records in four suites
        _keep_entries(folder, runs, fresh if folder == item.folder else None)


def rerun(items: List[Rerun], echo: Callable[[str], None],
          runner: Optional[Callable[[Rerun], int]] = None) -> List[str]:
    """Run ``items`` in order, one progress line each (suite, command, outcome, elapsed); a failed or refused run
    is reported and the others go on; Ctrl-C stops after reporting the run it interrupted. Returns the failure
    lines."""
    runner = runner or _run
    failures = []
    for i, item in enumerate(items, 1):
        head = f"[{i}/{len(items)}] {item.suite}: {item.command}"
        if item.refused:
            failures.append(f"{head}: refused: {item.refused}")
            echo(failures[-1])
            continue
        if item.skipped:
            echo(f"{head}: not rerun: {item.skipped}")
            continue
        if item.same_as is not None:
            echo(f"{head}: done with run {items.index(item.same_as) + 1}")
            continue
        before = {f: manifests.read_manifest(f) for f in dict.fromkeys(it.folder for it in items)}
        start = time.perf_counter()
        try:
            code = runner(item)
        except OSError as e:
            code, why = None, f"could not start ({e})"
        except KeyboardInterrupt:  # what was rerun before stays written; the READMEs are still regenerated
            failures.append(f"{head}: interrupted; the runs after it were not rerun")
            echo(failures[-1])
            break
        else:
            why = f"exit status {code}"
        elapsed = time.perf_counter() - start
        if code == 0:
            try:
                _after(item, before)
            except (ValueError, OSError) as e:
                code, why = None, f"its results: {e}"
        if code == 0:
            echo(f"{head}: ok ({elapsed:.1f} s)")
        else:
            failures.append(f"{head}: failed, {why} ({elapsed:.1f} s)")
            echo(failures[-1])
    return failures
