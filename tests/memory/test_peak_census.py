"""``dgl_exact.memory.census``: the tensors alive at a step's forward and backward peaks, by source line.

Small graphs (a few thousand nodes) with ``min_bytes`` below the layer sizes, so every layer output is
followed. The checks are on what the census attributes, not on thresholds: the line of this file that makes
a large fp32 tensor is named at the forward peak; a compressed model's saved data is reported as compressed;
the backward peak is found after the forward one and holds gradients charged to the forward line that made
their node; storages from before the step are not counted.
"""
from __future__ import annotations

import inspect
import json

import pytest
import torch
import torch.nn.functional as F

import dgl_exact
from dgl_exact import CompressionConfig
from dgl_exact.memory import CensusReport, census

import dgl  # noqa: E402  (after dgl_exact)

pytestmark = pytest.mark.usefixtures("one_thread")

N, E, IN, HIDDEN, CLASSES = 2000, 16000, 32, 64, 4
ROW_BYTES = N * HIDDEN * 4          # one fp32 hidden activation: 500 KiB


class WideNet(torch.nn.Module):
    """Two GraphConvs around a user line that makes a tensor four times a hidden activation."""

    def __init__(self):
        super().__init__()
        self.conv1 = dgl.nn.GraphConv(IN, HIDDEN)
        self.conv2 = dgl.nn.GraphConv(4 * HIDDEN, CLASSES)

    def forward(self, g, x):
        h = torch.relu(self.conv1(g, x))
        wide = torch.cat([h, h * 2, h * 3, h * 4], dim=1)  # the big fp32 line
        return self.conv2(g, wide)


def _line_of(marker: str) -> int:
    lines, start = inspect.getsourcelines(WideNet)
    return start + next(i for i, text in enumerate(lines) if marker in text)


@pytest.fixture(scope="module")
def data():
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, N, (E,), generator=gen)
    dst = torch.randint(0, N, (E,), generator=gen)
    g = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=N))
    x = torch.randn(N, IN, generator=gen)
    y = torch.randint(0, CLASSES, (N,), generator=gen)
    return g, x, y


def _step(model, g, x, y):
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(g, x), y).backward()
        opt.step()
    return step


def test_the_user_line_of_a_big_fp32_tensor_heads_the_forward_peak(data):
    torch.manual_seed(0)
    report = census(_step(WideNet(), *data), min_bytes=64 * 1024)
    forward = report.peak("forward")
    top = forward.rows()[0]
    assert f"test_peak_census.py:{_line_of('the big fp32 line')} forward" in top.line
    assert "torch.cat" in top.line                     # the code of the line is shown
    assert top.data == "fp32" and top.bytes == 4 * ROW_BYTES and top.largest_shape == (N, 4 * HIDDEN)
    # `wide` is held by forward's local variable while conv2 runs; conv2 saves its normalised copy instead
    assert top.role == "forward value"
    normalised = [r for r in forward.rows() if r.line.endswith("return self.conv2(g, wide)")]
    assert [(r.role, r.bytes, r.data) for r in normalised] == [("saved for backward", 4 * ROW_BYTES, "fp32")]
    # the peak is exactly the storages listed, and nothing of the model or data is among them
    assert forward.peak_bytes == sum(t.bytes for t in forward.tensors)
    assert all(t.compressed is False for t in forward.tensors)


def test_forward_and_backward_peaks_are_found(data):
    torch.manual_seed(0)
    report = census(_step(WideNet(), *data), min_bytes=64 * 1024)
    assert [p.phase for p in report.peaks][:2] == ["forward", "backward"]
    forward, backward = report.peak("forward"), report.peak("backward")
    assert forward.index < backward.index <= report.operators
    grads = [t for t in backward.tensors if t.role == "backward"]
    assert grads, "the backward peak holds gradients"
    # a gradient is charged to the forward line whose autograd node made it, not to the .backward() call
    assert all("test_peak_census.py" in t.line and "backward()" not in t.line for t in grads)
    assert any(t.operator.endswith("Backward0") or "Backward" in t.operator for t in grads)


def test_a_compressed_models_saved_data_is_reported_as_compressed(data):
    torch.manual_seed(0)
    model = dgl_exact.compress_model(WideNet(), config=CompressionConfig(bits=2))
    report = census(_step(model, *data), min_bytes=16 * 1024)
    # the forward peaks at the user's torch.cat, before conv2 compresses anything; during the backward the
    # compressed input of conv2 is still held
    assert report.peak("forward").compressed_bytes == 0
    backward = report.peak("backward")
    packed = [t for t in backward.tensors if t.compressed]
    assert packed and all(t.role == "saved for backward" and t.phase == "forward" for t in packed)
    # conv2's input is kept at 2 bits (N x 256 values: 2000 * 256 / 4 bytes of codes), not in fp32
    assert any(t.bytes == N * 4 * HIDDEN // 4 and "self.conv2(g, wide)" in t.line for t in packed)
    assert backward.compressed_bytes == sum(t.bytes for t in packed) < backward.peak_bytes
    assert all(t.op.startswith("ops/") for t in packed)   # the dgl_exact op that kept it is named


def test_storages_from_before_the_step_are_not_counted():
    big = torch.randn(512, 1024)              # 2 MiB, alive before the step

    def step():
        view = big.view(1024, 512)            # a view of it: not new memory
        fresh = view * 2                      # new: 2 MiB
        del fresh

    report = census(step, warmup=0)
    forward = report.peak("forward")
    assert forward.peak_bytes == big.numel() * 4 and len(forward.tensors) == 1
    assert forward.tensors[0].operator == "mul"
    assert "fresh = view * 2" in forward.tensors[0].line


def test_dgl_formats_from_before_the_step_are_not_counted():
    """DGL's sparse formats of a graph alive before the step are memory from before it, though the step
    exports them anew (``update_all`` hands dgl_exact a new graph object at every call, whose structure is
    exported again); a format the step makes DGL create is the step's."""
    before = dgl.rand_graph(4000, 64000)
    before.adj_tensors("csc")                 # created before the step
    later = dgl.rand_graph(4000, 64000)       # COO alone: its CSR is created by the step
    assert "csr" not in later.formats()["created"]
    index_bytes = 64000 * 8

    def step():
        _, old, _ = before.adj_tensors("csc")
        _, new, _ = later.adj_tensors("csr")
        both = old + new                      # reads both first here; new: 500 KiB
        del both, old, new

    forward = census(step, warmup=0).peak("forward")
    rows = sorted((t.operator, t.data, t.bytes) for t in forward.tensors)
    assert rows == [("add", "int64", index_bytes), ("add (first read)", "int64 outside torch", index_bytes)]


def test_warmup_steps_run_first_and_the_report_prints_and_serialises(data):
    calls = []
    torch.manual_seed(0)
    inner = _step(WideNet(), *data)

    def step():
        calls.append(1)
        inner()

    report = census(step, warmup=2, min_bytes=64 * 1024, top=1)
    assert len(calls) == 3
    text = str(report)
    assert "forward peak" in text and "backward peak" in text and "| MiB | data | role |" in text
    assert "more rows" in text                               # only the top row printed per peak
    as_dict = json.loads(report.to_json())
    assert as_dict["min_bytes"] == 64 * 1024 and as_dict["device"] == "cpu"
    assert as_dict["peaks"][0]["phase"] == "forward"
    assert as_dict["peaks"][0]["peak_bytes"] == sum(t["bytes"] for t in as_dict["peaks"][0]["tensors"])
    assert isinstance(report, CensusReport)


def test_bad_arguments_say_what_to_pass():
    with pytest.raises(TypeError, match="step must be a callable"):
        census(None)
    with pytest.raises(ValueError, match="warmup must be >= 0"):
        census(lambda: None, warmup=-1)
