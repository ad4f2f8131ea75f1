"""dgl_exact/bench/plot.py: figures are written atomically (a full disk leaves an earlier figure as it was)."""
import os

import pytest

from dgl_exact.errors import WriteError

ROWS = [{"model": "gcn", "setting": "INT2", "epoch_ms": 3.0, "epoch_ms_std": 0.1, "ratio_vs_baseline": 1.2},
        {"model": "gcn", "setting": "DGL fp32", "epoch_ms": 2.5, "epoch_ms_std": 0.1}]


def test_figure_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from dgl_exact.bench.plot import plot_speed

    path = plot_speed(ROWS, str(tmp_path / "speed.png"))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.listdir(tmp_path) == ["speed.png"]


def test_figure_on_a_full_disk_keeps_the_earlier_one(tmp_path, full_disk):
    pytest.importorskip("matplotlib")
    from dgl_exact.bench.plot import plot_speed

    path = tmp_path / "speed.png"
    path.write_bytes(b"the earlier figure")
    with pytest.raises(WriteError, match=f"could not write {path}: no space left on device"):
        plot_speed(ROWS, str(path))
    assert path.read_bytes() == b"the earlier figure" and os.listdir(tmp_path) == ["speed.png"]
