"""The GPU-path step counter (``dgl_exact.bench.opcount``): its counting rules, and the property it guards:
a training step on the CUDA code path never synchronises the host with the device, in any setting."""
from __future__ import annotations

import json

import pytest
import torch

import dgl_exact
from dgl_exact import kernels
from dgl_exact.bench.opcount import count_step
from dgl_exact.kernels import reference

import dgl  # noqa: E402  (after dgl_exact: installs the import shim)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_sync_counted_only_on_device_tensors():
    dev = torch.randn(10)
    host = torch.randn(10)

    def step():
        (dev * 2).sum().item()      # a device read: sync
        host.sum().item()           # a host tensor: no sync, and no device op
        bool((dev > 0).any())       # is_nonzero / _local_scalar_dense on a device tensor: sync
        dev[dev > 0]                # boolean-mask indexing: sync (nonzero)

    counts = count_step(step, roots=[dev])
    assert counts.syncs == 3
    assert all("test_opcount.py" in site for site in counts.sync_sites)
    assert counts.per_op["aten::sum"] == 1  # the host sum is not a GPU launch


def test_views_are_free_and_bytes_are_inputs_plus_outputs():
    x = torch.randn(100, 8)

    def step():
        y = x.t().unsqueeze(0).detach()  # views and metadata only: nothing launched
        return y + 1.0

    counts = count_step(step, roots=[x])
    assert dict(counts.per_op) == {"aten::add": 1}
    assert counts.bytes == 2 * x.numel() * 4  # read x once, write the result once


def test_registry_op_counts_once_whatever_backend():
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 2):
        pytest.skip("torch < 2.2: the reference's tensor-int bitwise ops fail under a TorchDispatchMode")
    x = torch.randn(64, 16)
    with kernels.use_backend("torch"):  # the reference takes several aten calls inside
        counts = count_step(lambda: kernels.get("relu_dropout", x.device)(x, 0.5, 123), roots=[x])
    assert counts.per_op["dgl_exact::relu_dropout"] == 1
    assert counts.ops == 1 and counts.syncs == 0


def test_host_helpers_are_not_device_work():
    """Seeds come from torch's CPU generator: reading them is no synchronisation on a GPU."""
    from dgl_exact.compression.core import draw_seed

    counts = count_step(lambda: draw_seed())
    assert counts.syncs == 0 and counts.ops == 0


def test_reference_graph_kernels_do_not_synchronise():
    """``csr_rows`` passes ``output_size`` and ``spmm_minmax`` masks with ``masked_fill_``: no device read."""
    g = dgl.rand_graph(30, 120)
    indptr, indices, eids = g.adj_tensors("csc")
    x = torch.randn(30, 2, 4)
    roots = [indptr, indices, eids, x]
    counts = count_step(lambda: reference.spmm_minmax(indptr, indices, eids, x, "max", 30), roots=roots)
    assert counts.syncs == 0, counts.sync_sites
    counts = count_step(lambda: reference.sddmm_dot(indptr, indices, eids, x, x), roots=roots)
    assert counts.syncs == 0, counts.sync_sites


@pytest.mark.parametrize("model_name", ["gcn", "sage", "gat", "gcn2"])
def test_training_step_on_gpu_path_has_no_sync(model_name, tmp_path):
    """Every setting, every model: one training step dispatches no host synchronisation on the CUDA path."""
    from dgl_exact.bench.opcount import count_grid
    from dgl_exact.bench.runner import Workload
    from dgl_exact.planning.settings import select
    from dgl_exact.data import load_dataset

    ds = load_dataset("synthetic:num_nodes=300,avg_degree=6,num_features=16,num_classes=3", str(tmp_path))
    work = Workload(ds, "cpu", hidden=16, layers=2 if model_name != "gcn2" else 3)
    settings = select("dgl_exact fp32,INT2,INT2 + RP(0.125) + blocks(64) + optimal")
    rows = count_grid(work, [model_name], settings, progress=False)
    assert [r["setting"] for r in rows] == [s.name for s in settings]
    for r in rows:
        assert r["ops"] > 0 and r["bytes"] > 0
        assert r["syncs"] == 0, (r["setting"], r)
        assert r["host_reads"] == 0, (r["setting"], r)
    assert rows[0]["ops_ratio"] == 1.0


def test_cli_emulate_gpu_json(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from dgl_exact.cli import cli

    out = tmp_path / "records.json"
    result = CliRunner().invoke(cli, ["bench", "profile", "--emulate-gpu", "--device", "cpu", "--quiet",
                                      "--dataset", "synthetic:num_nodes=200,avg_degree=5,num_features=8,num_classes=3",
                                      "--models", "sage", "--hidden", "8", "--layers", "2",
                                      "--settings", "DGL fp32,dgl_exact fp32,INT2",
                                      "--data-root", str(tmp_path), "--out", str(tmp_path / "b"),
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())
    assert [r["setting"] for r in records] == ["DGL fp32", "dgl_exact fp32", "INT2"]
    assert "note" in records[0] and "ops" not in records[0]
    for r in records[1:]:
        assert {"setting", "ops", "syncs", "bytes"} <= set(r)
        assert isinstance(r["ops"], int) and r["syncs"] == 0
    assert "counts, not times" in result.output
    bad = CliRunner().invoke(cli, ["bench", "profile", "--json", str(out)])
    assert bad.exit_code != 0 and "--emulate-gpu" in bad.output


def test_count_does_not_leak_patches():
    before = (kernels.get, torch.Tensor.tolist, torch.Tensor.numpy)
    count_step(lambda: torch.randn(3).tolist())
    assert (kernels.get, torch.Tensor.tolist, torch.Tensor.numpy) == before
    assert dgl_exact  # imported for the shim


def test_gpu_chunk_policy_keeps_batch_norm_fused():
    """On the GPU path an activation is chunked only when its decompressed copy is huge: a 2048 x 1024
    batch-norm input (2 Mi elements) is chunked on the CPU (4 MiB chunks, the step-peak policy) but takes
    ATen's fused backward on the GPU path, where each chunk would cost launches and a second read."""
    from dgl_exact.compression import compress
    from dgl_exact.ops import chunks as chunking

    x = torch.randn(2048, 1024, requires_grad=True)
    c = compress(x.detach(), dgl_exact.CompressionConfig(bits=2), seed=1)
    assert chunking.needs_chunks(c) and len(list(chunking.row_chunks(c))) == 2
    with chunking.gpu_chunk_policy():
        assert not chunking.needs_chunks(c) and len(list(chunking.row_chunks(c))) == 1
    bn = dgl_exact.nn.BatchNorm1d(1024)

    def step():
        with dgl_exact.config(bits=2):
            bn(x * 1.0).sum().backward()  # an activation (has grad_fn): kept compressed

    cpu = count_step(step, roots=[x, *bn.parameters(), *bn.buffers()], emulate_gpu=False)
    gpu = count_step(step, roots=[x, *bn.parameters(), *bn.buffers()], emulate_gpu=True)
    assert "aten::native_batch_norm_backward" not in cpu.per_op
    assert gpu.per_op["aten::native_batch_norm_backward"] == 1 and gpu.ops < cpu.ops
