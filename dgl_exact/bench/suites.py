"""A suite folder's README.md (``benchmarks/<machine>/<suite>/``), generated from its result files.

Each suite folder holds its results and a manifest, ``runs.json``: one entry per run (a command whose result file
is in the folder), in the order the README shows them::

    {"results": "arxiv.jsonl",             # the run's rows: JSON lines, JSON (a list), CSV, or a text file/log
     "command": "dgl-exact bench plan ...", # the command that wrote it, as run
     "machine": "Intel Xeon, 2 threads",    # where it ran
     "code": "37c5519",                     # the code measured (commit or version)
     "date": "2026-12-01",                  # optional
     "title": "GCN, SAGE, GCNII",           # optional: the run's own heading line
     "columns": ["model", "setting", ...],  # optional: the table's columns (default: the suite's, COLUMNS)
     "rows": {"setting": ["INT2", ...]},    # optional: only the rows whose column holds one of these values
     "table": 0,                            # text file: its Markdown table of this index (-1: the last)
     "grep": "GB/s",                        # text file: its lines holding this text (column "line")
     "note": "..."}                         # optional: a sentence printed under the table (no figures of its own)

:func:`render_suite` writes the heading, the suite's description (:data:`ABOUT`), then for every run its command,
machine and code, its table (figures formatted from the rows as they are in the file) and links to its files.
``dgl-exact bench all`` records its runs here (:func:`record_run`); ``dgl-exact bench report`` rebuilds every
suite's README.md of a machine (and BENCHMARKS.md) from the manifests, without measuring anything."""
from __future__ import annotations

import contextlib
import csv
import json
import os
import re
from typing import Dict, List

try:
    import fcntl
except ImportError:  # Windows: no folder lock (two suites recording at once in one folder may lose a run)
    fcntl = None

from .._files import atomic_write
from ..errors import WriteError
from .results import markdown_table, read_rows

MANIFEST = "runs.json"
README = "README.md"

#: the table columns of each suite's runs, unless a run names its own
COLUMNS = {
    "memory": ["model", "setting", "activation_MiB", "ratio_vs_baseline", "step_peak_MiB", "peak_ratio_vs_baseline"],
    "speed": ["model", "setting", "epoch_ms", "epoch_ms_std", "ratio_vs_baseline"],
    "kernels": ["backend", "op", "setting", "shape", "ms", "GB_per_s"],
    "accuracy": ["dataset", "model", "setting", "runs", "test_mean", "test_std", "delta_vs_fp32"],
    "profile": ["model", "setting", "ops", "ops_ratio", "syncs", "MiB", "bytes_ratio"],
    "plan": ["model", "setting", "act_pred_MiB", "act_meas_MiB", "act_err_pct", "peak_pred_MiB", "peak_meas_MiB",
             "peak_err_pct"],
    "budget": ["setting", "plan", "runs", "test_mean", "test_std", "grad_rel_variance", "grad_variance",
               "peak_pred_MiB", "peak_meas_MiB"],
    "minibatch": ["setting", "batch_size", "predicted_step_peak_mib", "measured_step_peak_mib", "error_pct",
                  "epoch_s"],
    "checks": ["log", "summary"],
}

#: what each suite measures (no figures: those come from the result files)
ABOUT = {
    "memory": "Bytes saved for backward by one training forward pass (`activation_MiB`) and the step peak "
              "(`step_peak_MiB`: forward, loss, backward, Adam step; each setting in a fresh process, the second "
              "step after a warm-up); ratios against the first setting of the same command.",
    "speed": "Epoch time of full-graph training, mean and standard deviation over the timed epochs.",
    "kernels": "Throughput of the compression kernels (best of the repeats).",
    "accuracy": "Test accuracy over seeds with the default `dgl-exact train` hyperparameters unless the command "
                "names a `--conf`; `delta_vs_fp32` against dgl_exact fp32 over the same seeds.",
    "profile": "Counts, not times: operator calls, host synchronisations and bytes read + written by one training "
               "step along the CUDA code path (`--emulate-gpu`); ratios against dgl_exact fp32. Per-op tables: "
               "`opcount_<model>_<setting>.txt`.",
    "plan": "`dgl-exact plan` predicts a training step's activation memory and step peak; `dgl-exact bench plan` "
            "measures the same settings (each in a fresh process: warm-up step, then the second step) beside the "
            "prediction. `err_pct`: (predicted - measured) / measured.",
    "budget": "`dgl-exact bench budget` trains, over the same seeds, uniform settings and budgeted plans (`train "
              "--memory-budget`: per kept activation, the compression that adds the least gradient variance "
              "within the budget) and records test accuracy, gradient variance (relative to each parameter's "
              "gradient / plain sum) and the step peak, predicted and measured.",
    "minibatch": "`dgl-exact bench minibatch`: per setting, the largest neighbour-sampled batch whose step peak "
                 "the planner puts within `--memory-budget` (as `train --batch-size auto` picks it), its measured "
                 "step peak (resident high-water mark over its sampled batches) and the epoch time extrapolated "
                 "from the timed batches.",
    "checks": "The CUDA-marked tests and the GPU check's log.",
}

_PYTEST_SUMMARY = re.compile(r"^=*\s*(\d+ passed.*?)(?: in [\d.]+s.*)?\s*=*$")
_ENTRY_KEYS = {"results", "command", "machine", "code", "date", "title", "columns", "rows", "note", "table", "grep"}


def read_manifest(folder: str) -> List[Dict]:
    """The runs of ``folder``'s ``runs.json`` ([] without one); a malformed one raises ValueError naming it."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        try:
            runs = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e}); fix or remove it") from None
    if not isinstance(runs, list):
        raise ValueError(f"{path}: expected a list of runs")
    for i, run in enumerate(runs):
        missing = {"results", "command", "machine", "code"} - set(run)
        unknown = set(run) - _ENTRY_KEYS
        if missing or unknown:
            raise ValueError(f"{path}: run {i} " + (f"lacks {sorted(missing)}" if missing else
                                                    f"has unknown keys {sorted(unknown)}"))
    return runs


def _write_json(path: str, value) -> None:
    with atomic_write(path, "w", encoding="utf-8", shared=True) as f:
        f.write(json.dumps(value, indent=1) + "\n")


def record_run(folder: str, run: Dict) -> str:
    """Add ``run`` to ``folder``'s manifest, replacing the run of the same result file; returns its path."""
    unknown = set(run) - _ENTRY_KEYS
    if unknown:
        raise ValueError(f"unknown run keys {sorted(unknown)}")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise WriteError(folder, e) from None
    path = os.path.join(folder, MANIFEST)
    with _folder_locked(folder):  # two suites of one folder finishing at once: each reads the other's run
        runs = [r for r in read_manifest(folder) if r["results"] != run["results"]] + [run]
        _write_json(path, runs)
    return path


def write_manifest(folder: str, runs: List[Dict]) -> str:
    """Replace ``folder``'s manifest with ``runs`` (in this order); returns its path."""
    path = os.path.join(folder, MANIFEST)
    with _folder_locked(folder):
        _write_json(path, runs)
    return path


@contextlib.contextmanager
def _folder_locked(folder: str):
    """An exclusive ``flock`` on the folder itself (no lock file left behind), waited for."""
    if fcntl is None:
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _markdown_tables(lines: List[str]) -> List[List[Dict]]:
    tables, block = [], []
    for line in lines + [""]:
        if line.strip().startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if len(block) >= 2 and set("".join(block[1])) <= set("-: "):
            tables.append([dict(zip(block[0], cells)) for cells in block[2:]])
        block = []
    return tables


def load_results(path: str, table=None, grep=None) -> List[Dict]:
    """The rows of a result file: JSON lines (``.jsonl``), a JSON list (``.json``), CSV (``.csv``); of a text file
    (a log, a command's printed table): its Markdown table ``table`` (an index, -1 the last), or its lines that
    hold ``grep`` (column ``line``), or else its pytest summary line (column ``summary``: "240 passed, ...")."""
    if path.endswith(".jsonl"):
        return read_rows(path)
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            return list(json.load(f))
    if path.endswith(".csv"):
        with open(path, encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    if table is not None:
        tables = _markdown_tables(lines)
        if not -len(tables) <= table < len(tables):
            raise ValueError(f"{path}: no Markdown table {table} (it has {len(tables)})")
        return tables[table]
    if grep is not None:
        rows = [{"line": line.strip()} for line in lines if grep in line]
        if not rows:
            raise ValueError(f"{path}: no line holds {grep!r}")
        return rows
    summaries = [m.group(1) for m in map(_PYTEST_SUMMARY.match, lines) if m]
    if not summaries:
        raise ValueError(f"{path}: no pytest summary line ('N passed ...')")
    return [{"log": os.path.basename(path), "summary": summaries[-1]}]


def _flat(row: Dict, prefix: str = "") -> Dict:
    """A row with its nested mappings spread into dotted columns (``{"gib": {"rss": 1}}`` -> ``gib.rss``)."""
    out = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _selected(rows: List[Dict], where: Dict) -> List[Dict]:
    for column, values in where.items():
        by_value = {str(v): i for i, v in enumerate(values)}
        rows = sorted((r for r in rows if str(r.get(column)) in by_value), key=lambda r: by_value[str(r[column])])
    return rows


def _files_of(folder: str, results: str) -> List[str]:
    """The result file and its siblings of the same stem (``arxiv.jsonl`` -> ``arxiv.md``, ``arxiv.csv``, ...)."""
    stem = os.path.splitext(results)[0]
    here = os.path.join(folder, os.path.dirname(results))
    names = sorted(n for n in os.listdir(here) if os.path.splitext(n)[0] == os.path.basename(stem)
                   and not n.endswith(".previous")) if os.path.isdir(here) else []
    return [os.path.join(os.path.dirname(results), n).replace(os.sep, "/") for n in names] or [results]


def render_run(folder: str, suite: str, run: Dict) -> str:
    rows = _selected([_flat(r) for r in load_results(os.path.join(folder, run["results"]), run.get("table"),
                                                      run.get("grep"))], run.get("rows", {}))
    if not rows:
        raise ValueError(f"{folder}: no rows of {run['results']} to show")
    default = ["line"] if "grep" in run else None if "table" in run else COLUMNS.get(suite)
    columns = run.get("columns") or default or [c for c in rows[0] if c not in ("commit", "code")]
    files = ", ".join(f"[{name}]({name})" for name in _files_of(folder, run["results"]))
    head = [f"**{run['title']}**", ""] if run.get("title") else []
    when = f"; {run['date']}" if run.get("date") else ""
    lines = head + [f"Command: `{run['command']}`", "", f"Machine: {run['machine']}{when}. Code: {run['code']}. "
                    f"Results: {files}.", "", markdown_table(rows, columns), ""]
    if run.get("note"):
        lines += [run["note"], ""]
    return "\n".join(lines)


def render_suite(folder: str, suite: str, title: str) -> str:
    """The README.md text of a suite folder from its manifest (ValueError if it has none)."""
    runs = read_manifest(folder)
    if not runs:
        raise ValueError(f"{folder}: no {MANIFEST} (no recorded runs)")
    parts = [f"### {title}", "", ABOUT.get(suite, ""), ""] if ABOUT.get(suite) else [f"### {title}", ""]
    for run in runs:
        parts.append(render_run(folder, suite, run))
    figures = sorted(n for n in os.listdir(folder) if n.endswith(".png"))
    parts += [f"![{n}]({n})\n" for n in figures]
    return "\n".join(parts).rstrip("\n") + "\n"


def write_suite(folder: str, suite: str, title: str) -> str:
    """Rewrite ``folder``'s README.md from its manifest; returns its path."""
    text = render_suite(folder, suite, title)
    path = os.path.join(folder, README)
    with atomic_write(path, "w", encoding="utf-8", shared=True) as f:
        f.write(text)
    return path
