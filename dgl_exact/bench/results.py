"""Benchmark rows: written to a JSON-lines file as they are measured (a run that dies keeps them), then
rendered as CSV and Markdown. Every file names the code measured (:mod:`.provenance`): each JSONL row and
CSV row has ``commit`` and ``code`` columns, the Markdown a ``Code:`` line. Every file is written whole and
atomically (:func:`dgl_exact._files.atomic_write`): a failure (disk full, ...) leaves the previous file as
it was and ends in one :class:`~dgl_exact.errors.WriteError`."""
from __future__ import annotations

import csv
import json
import os
from typing import Dict, Iterable, List, Sequence

from .._files import atomic_write
from ..errors import WriteError
from . import provenance


class ResultSink:
    """Writes this run's rows to ``<out>/<name>.jsonl`` as they come, each with the provenance columns;
    ``rows`` holds them (without). ``fresh``: the file holds this run's rows only, and an earlier file is
    kept as ``<name>.jsonl.previous`` once the first row is written; else this run's rows follow its rows.
    Each row rewrites the whole file atomically (old rows and new), so a failure leaves the file of the
    row before."""

    def __init__(self, out_dir: str, name: str, fresh: bool = True):
        try:
            os.makedirs(out_dir, exist_ok=True)  # the grids write their per-row files there too
        except OSError as e:
            raise WriteError(out_dir, e) from None
        self.out_dir, self.name = out_dir, name
        self.path = os.path.join(out_dir, f"{name}.jsonl")
        self._keep_previous = fresh and os.path.isfile(self.path)
        self._head = ""  # the earlier rows this run's follow
        if not fresh and os.path.isfile(self.path):
            with open(self.path, encoding="utf-8") as f:
                self._head = f.read()
            if self._head and not self._head.endswith("\n"):
                self._head += "\n"
        self.rows: List[Dict] = []

    def add(self, row: Dict) -> None:
        self.rows.append(row)
        self._write()

    def replace_rows(self, rows: Iterable[Dict]) -> None:
        """This run's rows replaced by ``rows`` (e.g. completed with columns known only at the end)."""
        self.rows = list(rows)
        self._write()

    def _write(self) -> None:
        if self._keep_previous:  # the earlier run's file, still whole: copied aside before it is replaced
            with open(self.path, "rb") as f:
                previous = f.read()
            with atomic_write(self.path + ".previous", shared=True) as f:
                f.write(previous)
            self._keep_previous = False
        stamp = provenance.stamp()
        with atomic_write(self.path, "w", encoding="utf-8", shared=True) as f:
            f.write(self._head)
            for row in self.rows:
                f.write(json.dumps({**row, **stamp}, default=str) + "\n")

    def finish(self, columns: Sequence[str], title: str, header: str = "") -> str:
        """Write CSV and Markdown next to the JSONL; return the Markdown text."""
        stamp = provenance.stamp()
        write_csv(os.path.join(self.out_dir, f"{self.name}.csv"), [{**r, **stamp} for r in self.rows],
                  list(columns) + [c for c in stamp if c not in columns])
        md = markdown_table(self.rows, columns)
        code = f"Code: {stamp['code']}."
        header = f"{header}\n\n{code}" if header else code
        text = f"### {title}\n\n{header}\n\n{md}\n"
        with atomic_write(os.path.join(self.out_dir, f"{self.name}.md"), "w", encoding="utf-8", shared=True) as f:
            f.write(text)
        return text


def read_rows(path: str) -> List[Dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_csv(path: str, rows: Iterable[Dict], columns: Sequence[str]) -> None:
    with atomic_write(path, "w", encoding="utf-8", newline="", shared=True) as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: _fmt(r.get(c)) for c in columns})


def _fmt(v):
    if isinstance(v, float):
        if v != v:
            return "n/a"
        if abs(v) >= 100:
            return f"{v:.1f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.4f}"
    return "n/a" if v is None else str(v)


def markdown_table(rows: Iterable[Dict], columns: Sequence[str]) -> str:
    rows = list(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |")
    return "\n".join(lines)
