"""The accuracy benchmark of the user models (dgl_exact/bench/accuracy.py) and its within-noise verdict."""
import math
import statistics

import pytest

from dgl_exact.bench.accuracy import NOISE_SE, compare_to_baseline, user_accuracy_grid
from dgl_exact.bench.results import ResultSink
from dgl_exact.planning.settings import select


def _row(model, setting, tests):
    return {"model": model, "setting": setting, "tests": tests, "test_mean": statistics.fmean(tests)}


def test_verdict_is_the_difference_of_means_against_its_standard_error():
    base, close, far = [0.80, 0.82, 0.78, 0.81, 0.79], [0.79, 0.81, 0.77, 0.80, 0.78], [0.70, 0.72, 0.68, 0.71, 0.69]
    rows = [_row("m", "INT2", close), _row("m", "DGL fp32", base), _row("m", "INT4", far),
            _row("other", "dgl_exact fp32", far), _row("other", "INT2", base), _row("lone", "INT2", base)]
    compare_to_baseline(rows)
    se = math.sqrt(statistics.variance(close) / 5 + statistics.variance(base) / 5)  # Welch's, unpaired
    assert rows[0]["se_delta"] == pytest.approx(se) and rows[0]["delta_vs_fp32"] == pytest.approx(-0.01)
    assert abs(rows[0]["delta_vs_fp32"]) <= NOISE_SE * se and rows[0]["verdict"] == "within noise"
    assert rows[1]["verdict"] == "baseline" and rows[1]["delta_vs_fp32"] == 0
    assert rows[2]["verdict"].startswith("outside noise") and rows[2]["delta_vs_fp32"] == pytest.approx(-0.10)
    # each model against its own baseline; dgl_exact fp32 where DGL fp32 is not measured
    assert rows[4]["delta_vs_fp32"] == pytest.approx(0.10) and rows[4]["verdict"].startswith("outside")
    assert rows[5]["delta_vs_fp32"] is None and rows[5]["verdict"] == ""


def test_one_seed_gives_a_difference_but_no_verdict():
    rows = [_row("m", "DGL fp32", [0.8]), _row("m", "INT2", [0.7])]
    compare_to_baseline(rows)
    assert rows[1]["delta_vs_fp32"] == pytest.approx(-0.1) and rows[1]["se_delta"] is None
    assert rows[1]["verdict"] == ""


@pytest.mark.parametrize("model", ["arxiv-gcn-user", "arxiv-gat-user", "user-gcn2"])
def test_user_models_train_as_written_and_converted(tmp_path, model):
    from dgl_exact.data import load_dataset

    ds = load_dataset("synthetic-small:num_nodes=60,num_features=8,num_classes=3", quiet=True)
    sink = ResultSink(str(tmp_path), "accuracy")
    rows = user_accuracy_grid(ds, [model], select("DGL fp32,INT2"), 2, 2, sink, progress=False)
    assert [r["setting"] for r in rows] == ["DGL fp32", "INT2"] and [r["seed"] for r in rows] == [0, 0]
    assert all(len(r["tests"]) == 2 and 0 <= r["test_mean"] <= 1 for r in rows)
    assert rows[0]["verdict"] == "baseline" and rows[1]["se_delta"] is not None
    assert sink.rows == rows  # written as they came, then completed


def test_user_gcn2_takes_the_model_options_it_is_given(tmp_path, monkeypatch):
    """--conf's hidden/layers/dropout/batch_norm reach the user model (user-gcn2 without batch norm: the recipe
    that learns a small label set at depth)."""
    import torch.nn as nn

    from dgl_exact.bench import accuracy
    from dgl_exact.data import load_dataset

    built = []
    real = accuracy.Workload.build

    def spy(self, model, impl, seed=0, recompute=None):
        built.append(real(self, model, impl, seed=seed, recompute=recompute))
        return built[-1]

    monkeypatch.setattr(accuracy.Workload, "build", spy)
    ds = load_dataset("synthetic-small:num_nodes=60,num_features=8,num_classes=3", quiet=True)
    user_accuracy_grid(ds, ["user-gcn2"], select("DGL fp32"), 1, 1, ResultSink(str(tmp_path), "accuracy"),
                       progress=False, hidden=12, layers=3, dropout=0.25, batch_norm=False)
    model = built[0]
    assert len(model.convs) == 3 and model.inp.out_features == 12
    assert not any(isinstance(m, nn.BatchNorm1d) for m in model.modules())
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.25] * 3
