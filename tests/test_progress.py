"""dgl_exact/_progress.py: the bars, and the lines a hidden bar prints within progress_lines."""
import io
import re

from dgl_exact._progress import LineProgress, _LINES, progress_bar, progress_lines


def _epochs(n, start=0, evaluate_every=1):
    lines = []
    with progress_lines(lines.append):
        bar = progress_bar(range(start, n), False, desc="run 1/1", unit="epoch", initial=start, total=n, leave=False)
        for epoch in bar:
            if (epoch + 1) % evaluate_every == 0:
                bar.set_postfix(loss=f"{1 / (epoch + 1):.4f}", val="0.5000")
        bar.close()
    return lines


def test_one_line_per_epoch_with_what_the_bar_shows():
    lines = _epochs(3)
    assert len(lines) == 3
    assert re.fullmatch(r"run 1/1: epoch 1/3, loss=1\.0000, val=0\.5000 \(\d+\.\d\d s\)", lines[0]), lines[0]
    assert lines[2].startswith("run 1/1: epoch 3/3, loss=0.3333")


def test_an_epoch_without_evaluation_shows_no_earlier_values():
    lines = _epochs(4, evaluate_every=2)
    assert [", loss=" in line for line in lines] == [False, True, False, True]
    assert lines[3].startswith("run 1/1: epoch 4/4, loss=0.2500, val=0.5000 (")


def test_a_resumed_loop_counts_from_where_it_starts():
    lines = _epochs(5, start=3)
    assert [line.split(",")[0] for line in lines] == ["run 1/1: epoch 4/5", "run 1/1: epoch 5/5"]


def test_long_batch_passes_write_a_tenth_at_a_time_short_ones_nothing():
    for total, expected in ((100, [f"batch {10 * k}/100" for k in range(1, 11)]), (95, None), (20, [])):
        lines = []
        with progress_lines(lines.append):
            for _ in progress_bar(range(total), False, total=total, desc="epoch 0", unit="batch"):
                pass
        if expected is None:  # 95 batches: every 10th, and the last
            assert [line.split(": ")[1].split(" (")[0] for line in lines] == \
                [f"batch {10 * k}/95" for k in range(1, 10)] + ["batch 95/95"]
        else:
            assert [line.split(": ")[1].split(" (")[0] for line in lines] == expected


def test_shown_bars_and_bars_outside_progress_lines_are_tqdm():
    lines = []
    with progress_lines(lines.append):
        bar = progress_bar(range(2), True, file=io.StringIO())
        assert not isinstance(bar, LineProgress)
        bar.close()
    bar = progress_bar(range(2), False)
    assert not isinstance(bar, LineProgress) and list(bar) == [0, 1]
    assert lines == [] and _LINES.get() is None  # the scope is left as found
