"""Benchmark rows: appended to a JSON-lines file as they are measured (a run that dies keeps them), then
rendered as CSV and Markdown. Every file names the code measured (:mod:`.provenance`): each JSONL row and
CSV row has ``commit`` and ``code`` columns, the Markdown a ``Code:`` line."""
from __future__ import annotations

import csv
import json
import os
from typing import Dict, Iterable, List, Sequence

from . import provenance


class ResultSink:
    """Appends rows to ``<out>/<name>.jsonl``, each with the provenance columns; ``rows`` holds this run's
    rows (without them)."""

    def __init__(self, out_dir: str, name: str, fresh: bool = True):
        os.makedirs(out_dir, exist_ok=True)
        self.out_dir, self.name = out_dir, name
        self.path = os.path.join(out_dir, f"{name}.jsonl")
        if fresh and os.path.exists(self.path):
            os.replace(self.path, self.path + ".previous")
        self.rows: List[Dict] = []

    def add(self, row: Dict) -> None:
        self.rows.append(row)
        with open(self.path, "a") as f:
            f.write(json.dumps({**row, **provenance.stamp()}, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def replace_rows(self, rows: Iterable[Dict]) -> None:
        """This run's rows replaced by ``rows`` (e.g. completed with columns known only at the end), written
        atomically."""
        self.rows = list(rows)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            for row in self.rows:
                f.write(json.dumps({**row, **provenance.stamp()}, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def finish(self, columns: Sequence[str], title: str, header: str = "") -> str:
        """Write CSV and Markdown next to the JSONL; return the Markdown text."""
        stamp = provenance.stamp()
        write_csv(os.path.join(self.out_dir, f"{self.name}.csv"), [{**r, **stamp} for r in self.rows],
                  list(columns) + [c for c in stamp if c not in columns])
        md = markdown_table(self.rows, columns)
        code = f"Code: {stamp['code']}."
        header = f"{header}\n\n{code}" if header else code
        text = f"### {title}\n\n{header}\n\n{md}\n"
        with open(os.path.join(self.out_dir, f"{self.name}.md"), "w") as f:
            f.write(text)
        return text


def read_rows(path: str) -> List[Dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_csv(path: str, rows: Iterable[Dict], columns: Sequence[str]) -> None:
    with open(path, "w", newline="") as f:
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
