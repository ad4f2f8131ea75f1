"""dgl_exact/bench/results.py: the JSONL rows are written whole and atomically as they come (a run that dies
keeps them; a full disk keeps the file of the row before and leaves no empty or cut-off file), the earlier
run's file is kept as ``.previous``, and the CSV and Markdown are written atomically too."""
import json
import os

import pytest

from dgl_exact.bench.results import ResultSink, read_rows
from dgl_exact.errors import WriteError

EARLIER = '{"setting": "earlier", "value": 0}\n'


def _settings(path):
    return [r["setting"] for r in read_rows(str(path))]


def test_a_fresh_sink_keeps_the_earlier_file_as_previous(tmp_path):
    (tmp_path / "grid.jsonl").write_text(EARLIER)
    sink = ResultSink(str(tmp_path), "grid")
    assert (tmp_path / "grid.jsonl").read_text() == EARLIER  # nothing moved before a row exists
    sink.add({"setting": "a", "value": 1})
    sink.add({"setting": "b", "value": 2})
    assert _settings(tmp_path / "grid.jsonl") == ["a", "b"]
    assert (tmp_path / "grid.jsonl.previous").read_text() == EARLIER
    sink.replace_rows([{"setting": "c", "value": 3}])
    assert _settings(tmp_path / "grid.jsonl") == ["c"]
    assert (tmp_path / "grid.jsonl.previous").read_text() == EARLIER


def test_a_sink_that_is_not_fresh_continues_the_file(tmp_path):
    (tmp_path / "grid.jsonl").write_text(EARLIER.rstrip("\n"))
    sink = ResultSink(str(tmp_path), "grid", fresh=False)
    sink.add({"setting": "a", "value": 1})
    sink.replace_rows([{"setting": "b", "value": 2}])
    assert _settings(tmp_path / "grid.jsonl") == ["earlier", "b"]
    assert not (tmp_path / "grid.jsonl.previous").exists()


def test_rows_on_a_full_disk_keep_the_file_of_the_row_before(tmp_path, request):
    sink = ResultSink(str(tmp_path), "grid")
    sink.add({"setting": "a", "value": 1})
    before = (tmp_path / "grid.jsonl").read_bytes()
    request.getfixturevalue("full_disk")
    with pytest.raises(WriteError, match=f"could not write {tmp_path / 'grid.jsonl'}: no space left on device"):
        sink.add({"setting": "b", "value": 2})
    assert (tmp_path / "grid.jsonl").read_bytes() == before
    for write in (lambda: sink.finish(["setting", "value"], "grid"),
                  lambda: sink.replace_rows([{"setting": "c", "value": 3}])):
        with pytest.raises(WriteError, match="no space left on device"):
            write()
    assert sorted(os.listdir(tmp_path)) == ["grid.jsonl"]


def test_first_row_on_a_full_disk_leaves_the_earlier_file_and_no_empty_one(tmp_path, full_disk):
    (tmp_path / "grid.jsonl").write_text(EARLIER)
    sink = ResultSink(str(tmp_path), "grid")
    with pytest.raises(WriteError, match="no space left on device"):
        sink.add({"setting": "a", "value": 1})
    assert sorted(os.listdir(tmp_path)) == ["grid.jsonl"] and (tmp_path / "grid.jsonl").read_text() == EARLIER


def test_csv_and_markdown_are_written_whole(tmp_path):
    sink = ResultSink(str(tmp_path), "grid")
    sink.add({"setting": "a", "value": 1.5})
    text = sink.finish(["setting", "value"], "Grid")
    assert (tmp_path / "grid.md").read_text() == text and "| a | 1.50 |" in text
    header, row = (tmp_path / "grid.csv").read_text().splitlines()[:2]
    assert header.startswith("setting,value,") and row.startswith("a,1.50,")
    assert json.loads((tmp_path / "grid.jsonl").read_text())["value"] == 1.5
