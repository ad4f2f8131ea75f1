"""Activation memory, measured with ``dgl_exact.memory.measure`` (CPU: saved-tensor hooks, exact bytes).

A 3-layer GraphSAGE / GCN (``dgl_exact.training.models.build_model``) on a 2000-node graph: DGL's layers
in fp32 against dgl_exact's with compression disabled, INT8, INT2, INT2 with random projection and
block-wise optimal levels, and INT1. Plus the accounting itself: outputs excluded, parameters and inputs
excluded, and for a single ``Linear`` on a hidden activation the measured bytes are exactly the
compressed tensor's.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dgl_exact
from dgl_exact import CompressionConfig, ops
from dgl_exact.compression import compressed_nbytes
from dgl_exact.memory import format_bytes, measure, tensor_bytes
from dgl_exact.training.models import build_model

import dgl  # noqa: E402  (after dgl_exact)

pytestmark = pytest.mark.usefixtures("one_thread")

N_NODES, N_EDGES, IN_FEATS, HIDDEN, CLASSES = 2000, 16000, 64, 64, 8

CONFIGS = {
    "fp32": CompressionConfig(enabled=False),
    "int8": CompressionConfig(bits=8),
    "int2": CompressionConfig(bits=2),
    "int2-proj-blocks": CompressionConfig(bits=2, kept_frac=0.125, block_rows=64, levels="optimal"),
    "int1": CompressionConfig(bits=1),
}




@pytest.fixture(scope="module")
def data():
    torch.manual_seed(0)
    g = dgl.add_self_loop(dgl.rand_graph(N_NODES, N_EDGES))
    x = torch.randn(N_NODES, IN_FEATS)
    y = torch.randint(0, CLASSES, (N_NODES,))
    return g, x, y


def _measure_model(model, impl, g, x, y, cfg=None):
    """Activation bytes of one training forward (logits and loss returned: excluded, as in EXACT)."""
    model.train()
    loss_fn = F.cross_entropy if impl == "dgl" else ops.cross_entropy

    def step():
        out = model(g, x)
        return out, loss_fn(out, y)

    torch.manual_seed(1)
    if cfg is None:
        report = measure(step, modules=[model], exclude=[x])
    else:
        with dgl_exact.config(cfg):
            report = measure(step, modules=[model], exclude=[x])
    out, loss = report.result
    assert report.output_bytes == out.nbytes + loss.nbytes
    loss.backward()  # what was kept is enough to train on
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    return report.activation_bytes


@pytest.fixture(scope="module", params=["sage", "gcn"])
def measured(request, data):
    g, x, y = data
    torch.manual_seed(0)
    ref = build_model(request.param, IN_FEATS, CLASSES, hidden=HIDDEN, layers=3, impl="dgl")
    ours = build_model(request.param, IN_FEATS, CLASSES, hidden=HIDDEN, layers=3, impl="exact")
    ours.load_state_dict(ref.state_dict())
    out = {"dgl": _measure_model(ref, "dgl", g, x, y)}
    for name, cfg in CONFIGS.items():
        out[name] = _measure_model(ours, "exact", g, x, y, cfg)
    return request.param, out


def test_uncompressed_dgl_exact_keeps_less_than_dgl(measured):
    model, b = measured
    # aggregations keep nothing, ReLU+dropout one bit, the loss nothing: less even without compression
    assert b["fp32"] < 0.8 * b["dgl"], (model, b)


def test_int8_and_int2_ratios(measured):
    model, b = measured
    assert b["int8"] < b["fp32"] / 2.5, (model, b)
    assert b["int2"] * 8 <= b["dgl"], (model, {k: round(b["dgl"] / v, 1) for k, v in b.items()})
    assert b["int2"] < b["int8"] / 2


def test_projection_and_blocks_below_int2(measured):
    model, b = measured
    assert b["int2-proj-blocks"] < 0.8 * b["int2"], (model, b)
    assert b["int2-proj-blocks"] * 16 <= b["dgl"], (model, {k: round(b["dgl"] / v, 1) for k, v in b.items()})


def test_int1_below_int2(measured):
    model, b = measured
    assert b["int1"] < b["int2"], (model, b)


# ---------------------------------------------------------------------------------------------------
# the accounting
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [
    CompressionConfig(bits=8), CompressionConfig(bits=2), CompressionConfig(bits=1), CompressionConfig(bits=4),
    CompressionConfig(bits=2, kept_frac=0.125), CompressionConfig(bits=2, kept_frac=0.3, block_rows=64),
    CompressionConfig(bits=2, kept_frac=0.125, block_rows=64, levels="optimal"),
    CompressionConfig(bits=4, block_rows=7),
], ids=lambda c: c.describe().replace(" ", "-"))
@pytest.mark.parametrize("shape", [(300, 48), (257, 33)], ids=["300x48", "257x33"])
def test_linear_measures_exactly_its_compressed_input(cfg, shape, monkeypatch):
    from dgl_exact.ops import _saving

    made = []
    real = _saving.compress
    monkeypatch.setattr(_saving, "compress", lambda x, c: made.append(real(x, c)) or made[-1])
    lin = dgl_exact.nn.Linear(shape[1], 16, compression=cfg)
    base = torch.randn(*shape, requires_grad=True)
    h = base * 2.0  # a hidden activation: has a grad_fn, nobody else keeps it
    report = measure(lambda: lin(h), modules=[lin])
    assert len(made) == 1
    assert report.activation_bytes == made[0].nbytes == compressed_nbytes(shape, cfg)
    assert report.output_bytes == shape[0] * 16 * 4
    assert report.peak_bytes is None and report.method == "saved-tensor hooks" and report.device == "cpu"
    report.result.sum().backward()
    assert base.grad is not None and lin.weight.grad is not None


def test_linear_uncompressed_and_leaf_inputs():
    lin = dgl_exact.nn.Linear(32, 8, compression=CompressionConfig(enabled=False))
    base = torch.randn(100, 32, requires_grad=True)
    h = base * 2.0
    assert measure(lambda: lin(h), modules=[lin]).activation_bytes == h.nbytes
    # a leaf input is kept by reference: counted unless excluded as data
    x = torch.randn(100, 32)
    lin.compression = CompressionConfig(bits=2)
    assert measure(lambda: lin(x), modules=[lin]).activation_bytes == x.nbytes
    assert measure(lambda: lin(x), modules=[lin], exclude=[x]).activation_bytes == 0
    # without modules, the parameters count as kept tensors
    assert measure(lambda: lin(h)).activation_bytes == compressed_nbytes((100, 32), CompressionConfig(bits=2)) + \
        lin.weight.nbytes


def test_outputs_are_excluded(data):
    g, x, y = data
    sub = dgl.node_subgraph(g, torch.arange(300))
    xs, ys = x[:300], y[:300]
    model = build_model("sage", IN_FEATS, CLASSES, hidden=32, layers=2, impl="exact")
    with dgl_exact.config(bits=2):
        torch.manual_seed(0)
        with_logits = measure(lambda: (lambda out: (out, ops.cross_entropy(out, ys)))(model(sub, xs)),
                              modules=[model], exclude=[xs])
        torch.manual_seed(0)
        loss_only = measure(lambda: ops.cross_entropy(model(sub, xs), ys), modules=[model], exclude=[xs])
    logits = with_logits.result[0]
    # the loss keeps the logits (alive anyway as an output); returned, they are not activation memory
    assert loss_only.activation_bytes - with_logits.activation_bytes == logits.nbytes
    assert with_logits.output_bytes == logits.nbytes + with_logits.result[1].nbytes
    # an op that keeps its own output (torch.exp): all of it excluded once returned
    t = torch.randn(50, 10, requires_grad=True)
    assert measure(lambda: torch.exp(t), exclude=[t]).activation_bytes == 0
    assert measure(lambda: torch.exp(t).sum(), exclude=[t]).activation_bytes == 50 * 10 * 4


def test_graph_structure_cache_is_not_activation(data):
    """The CSC/CSR exported for the torch kernels is static (cached per graph), not activation memory."""
    from dgl_exact.ops.structure import device_kernels_only

    g, x, _ = data
    conv = dgl_exact.SAGEConv(IN_FEATS, 16, "mean", compression=CompressionConfig(bits=2))
    with device_kernels_only():
        report = measure(lambda: conv(g, x), modules=[conv], exclude=[x])
    # x is a leaf (kept by reference, excluded), mean aggregation keeps nothing: only the compressed
    # neighbour mean for fc_neigh's weight gradient remains (in > out: fc_neigh runs before aggregating)
    assert report.activation_bytes == 0


def test_report_formatting():
    assert format_bytes(None) == "n/a"
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 2**20) == "3.00 MiB"
    a = torch.zeros(10)
    assert tensor_bytes([a, a[2:], torch.zeros(5)]) == 40 + 20  # unique storages
    lin = dgl_exact.nn.Linear(4, 4)
    report = measure(lambda: lin(torch.randn(3, 4) * 1.0), modules=[lin])
    assert "activation memory" in str(report) and "(cpu, saved-tensor hooks)" in str(report)
    assert report.activation_mib == report.activation_bytes / 2**20


@pytest.mark.cuda
@pytest.mark.parametrize("model_name", ["sage", "gcn"])
def test_cuda_measure_agrees_with_cpu_hooks(model_name, data):
    """On CUDA, measure() takes the EXACT protocol (allocated-memory delta minus outputs); a CPU graph with
    CUDA features must keep about what the saved-tensor hooks count on the CPU (allocator rounding aside),
    and INT2 stays far below fp32 there too."""
    g, x, y = data
    torch.manual_seed(0)
    cpu_model = build_model(model_name, IN_FEATS, CLASSES, hidden=HIDDEN, layers=3, impl="exact")
    gpu_model = build_model(model_name, IN_FEATS, CLASSES, hidden=HIDDEN, layers=3, impl="exact")
    gpu_model.load_state_dict(cpu_model.state_dict())
    gpu_model.cuda()
    xc, yc = x.cuda(), y.cuda()
    out = {}
    for name in ("fp32", "int2"):
        cpu = _measure_model(cpu_model, "exact", g, x, y, CONFIGS[name])
        _measure_model(gpu_model, "exact", g, xc, yc, CONFIGS[name])  # warm-up: kernels, structure cache
        gpu = _measure_model(gpu_model, "exact", g, xc, yc, CONFIGS[name])
        out[name] = (cpu, gpu)
        assert abs(gpu - cpu) <= 0.1 * cpu + 64 * 1024, (name, cpu, gpu)
    assert out["int2"][1] * 6 <= out["fp32"][1], out
