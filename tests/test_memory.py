"""Activation memory, measured with ``dgl_exact.memory.measure`` (CPU: saved-tensor hooks, exact bytes).

A 3-layer GraphSAGE / GCN (``dgl_exact.training.models.build_model``) on a 2000-node graph: DGL's layers
in fp32 against dgl_exact's with compression disabled, INT8, INT2, INT2 with random projection and
block-wise optimal levels, and INT1. Plus the accounting itself: outputs excluded, parameters and inputs
excluded, and for a single ``Linear`` on a hidden activation the measured bytes are exactly the
compressed tensor's.
"""
from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("dgl", reason="needs DGL (the DGL front end); the no-DGL CI job runs without it")

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
    from dgl_exact.ops import keep as keeping

    made = []
    real = keeping.compress
    monkeypatch.setattr(keeping, "compress", lambda x, c: made.append(real(x, c)) or made[-1])
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


def test_an_input_read_by_two_linears_is_measured_once(monkeypatch):
    """A residual linear beside another linear (SAGE's two, a conv and a linear residual) keep one copy of their
    input (ownership rule 6): measured, and in the census, once."""
    from dgl_exact.memory import census
    from dgl_exact.ops import keep as keeping

    cfg = CompressionConfig(bits=2)
    made = []
    real = keeping.compress
    monkeypatch.setattr(keeping, "compress", lambda x, c: made.append(real(x, c)) or made[-1])
    a, b = dgl_exact.nn.Linear(64, 16, compression=cfg), dgl_exact.nn.Linear(64, 16, compression=cfg)
    base = torch.randn(4096, 64, requires_grad=True)
    h = base * 2.0
    report = measure(lambda: a(h) + b(h), modules=[a, b])
    assert len(made) == 1 and report.activation_bytes == made[0].nbytes == compressed_nbytes(h.shape, cfg)
    report.result.sum().backward()

    made.clear()
    seen = census(lambda: (lambda x: (a(x) + b(x)).sum().backward())(base * 2.0), warmup=0, min_bytes=1024)
    kept = [t for p in seen.peaks for t in p.tensors if t.compressed and p.phase == "forward"]
    assert len(made) == 1 and sum(t.bytes for t in kept) == made[0].nbytes


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


# --- step peak (measure_step) ----------------------------------------------------------------------------
from dgl_exact.memory import measure_step, vmhwm_available  # noqa: E402

needs_vmhwm = pytest.mark.skipif(vmhwm_available() is not None, reason=f"no CPU step peak: {vmhwm_available()}")
MIB = 2**20


def _in_fresh_process(body: str, prepare: bool = True) -> dict:
    """Run ``body`` (which sets ``out``, a dict) in a fresh process and return ``out``. The resident
    high-water mark is only sound in a process whose heap did not grow before ``prepare_cpu_peak()`` (a
    long pytest process has reused pages lying around), which is how the bench and the trainer use it. The
    process is forked from one that only imported torch, DGL and dgl_exact (tests/_fresh.py)."""
    from tests._fresh import run_forked

    return run_forked(("prepare_cpu_peak()\n" if prepare else "") + textwrap.dedent(body))


@needs_vmhwm
def test_step_peak_hand_computed():
    """Forward: a 16 MiB temporary, freed before it returns; backward: two 32 MiB tensors alive together.
    The step peak is 64 MiB above the memory before the step (page counting: within 1.5 MiB)."""
    out = _in_fresh_process("""
        def forward():
            a = torch.ones(4096, 1024)
            return (a * 2).sum()

        def backward(result):
            c = torch.ones(8192, 1024)
            d = c + 1
            del c, d

        measure_step(forward, backward=backward)  # warm-up: code pages of the kernels
        report = measure_step(forward, backward=backward)
        out.update(peak=report.peak_bytes, method=report.peak_method, act=report.activation_bytes,
                   text=str(report), step=report.step)
    """)
    assert out["step"] and "VmHWM" in out["method"] and "step peak" in out["text"]
    assert "free heap" not in out["method"]  # prepared first: nothing to flag
    assert abs(out["peak"] - 64 * MIB) <= 1.5 * MIB, out["peak"] / MIB
    assert out["act"] == 0


@needs_vmhwm
def test_step_peak_counts_dgl_kernel_allocations():
    """DGL 2.1.0's C++ kernels allocate outside torch's allocator on modern torch: the peak still sees them
    (a copy_u_sum output and its double, 2 x 100000 x 64 fp32)."""
    out = _in_fresh_process("""
        g = dgl.rand_graph(100000, 400000)
        x = torch.randn(100000, 64)

        def forward():
            return dgl.ops.copy_u_sum(g, x) * 2

        def backward(result):
            pass

        measure_step(forward, backward=backward)
        report = measure_step(forward, backward=backward)
        out.update(peak=report.peak_bytes, expected=2 * x.nbytes)
    """)
    assert abs(out["peak"] - out["expected"]) <= 1.5 * MIB, (out["peak"] / MIB, out["expected"] / MIB)


@needs_vmhwm
def test_step_peak_sees_heap_pages_freed_before_it():
    """A process that grew its heap before ``prepare_cpu_peak()`` (glibc's dynamic mmap threshold puts large
    tensors on the heap once one was freed) has free heap chunks that are still resident; glibc serves
    later tensors of any size from them. The meter releases their pages first (``malloc_trim``), so a step
    that reuses them is still counted (two 4 MiB tensors: 8 MiB, not ~0), and the report says the heap
    was there."""
    out = _in_fresh_process("""
        big = torch.ones(4 << 20)   # 16 MiB, mmapped, then freed: the dynamic threshold rises to 16 MiB
        del big
        chunks = [torch.ones(1 << 20) for _ in range(8)]  # 8 x 4 MiB on the heap now
        kept = chunks[1::2]         # every other one stays alive: four 4 MiB holes no trim can release
        del chunks                  # 16 MiB of free, resident heap chunks
        prepare_cpu_peak()

        def forward():
            a = torch.ones(1 << 20)
            b = a + 1
            return (a + b).sum()

        def backward(result):
            pass

        measure_step(forward, backward=backward)
        report = measure_step(forward, backward=backward)
        out.update(peak=report.peak_bytes, method=report.peak_method)
    """, prepare=False)
    assert abs(out["peak"] - 12 * MIB) <= 1.5 * MIB, out["peak"] / MIB  # a, b and a + b: 3 x 4 MiB
    assert "free heap chunks before the step" in out["method"], out["method"]


def test_step_peak_that_misses_allocations_is_not_reported(monkeypatch):
    """A resident high-water mark below the step's own activations (pages reused unseen in a long-lived
    process) is reported as not measured, with the reason, never as a number."""
    from dgl_exact import memory as memory_mod

    if vmhwm_available() is not None:
        pytest.skip(vmhwm_available())
    monkeypatch.setattr(memory_mod, "_status_bytes", lambda key: 100 * MIB)  # RSS and HWM never move
    w = torch.randn(64, 64, requires_grad=True)

    def forward():
        return (torch.randn(512, 64) @ w).relu().sum()

    report = measure_step(forward)
    assert report.activation_bytes > 0
    assert report.peak_bytes is None
    assert report.peak_method.startswith("not measured") and "fresh process" in report.peak_method


def test_measure_step_runs_backward_and_optimizer_and_matches_measure(data):
    """Same activation bytes as measure() on the same step; the backward and the optimizer step ran
    (parameters changed); the step peak holds at least the activations."""
    g, x, y = data
    torch.manual_seed(0)
    model = build_model("sage", IN_FEATS, CLASSES, hidden=HIDDEN, layers=3, impl="exact")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def forward():
        out = model(g, x)
        return ops.cross_entropy(out, y), out

    with dgl_exact.config(CONFIGS["int2"]):
        torch.manual_seed(1)
        expected = measure(forward, modules=[model], exclude=[x]).activation_bytes
        before = [p.detach().clone() for p in model.parameters()]
        torch.manual_seed(1)
        report = measure_step(forward, opt, modules=[model], exclude=[x])
    assert report.activation_bytes == expected > 0
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    if report.peak_bytes is not None:
        assert report.peak_bytes >= report.activation_bytes
    with pytest.raises(TypeError, match="must return the loss"):
        measure_step(lambda: None, cpu_method="none")
    with pytest.raises(ValueError, match="cpu_method"):
        measure_step(forward, cpu_method="bogus")


@needs_vmhwm
def test_step_peak_of_a_compressed_model_below_fp32():
    """A 3-layer SAGE on 20k nodes x 128: the INT2 step peak is below the uncompressed one (the fp32
    activations alive at the end of the forward, several 10 MiB tensors, are gone; the resident mark resolves
    about 1.5 MiB)."""
    torch.manual_seed(0)
    g = dgl.rand_graph(20000, 80000)
    x = torch.randn(20000, 128)
    y = torch.randint(0, 8, (20000,))
    peaks = {}
    for name in ("fp32", "int2"):
        torch.manual_seed(0)
        model = build_model("sage", 128, 8, hidden=128, layers=3, impl="exact")
        opt = torch.optim.Adam(model.parameters(), lr=0.01)

        def forward():
            out = model(g, x)
            return ops.cross_entropy(out, y), out

        with dgl_exact.config(CONFIGS[name]):
            forward()[0].backward()  # warm-up step (Adam's state exists from here on), then the measured one
            opt.step()
            opt.zero_grad(set_to_none=True)
            peaks[name] = measure_step(forward, opt, modules=[model], exclude=[x])
    assert peaks["int2"].activation_bytes * 4 < peaks["fp32"].activation_bytes
    assert peaks["int2"].peak_bytes < peaks["fp32"].peak_bytes, {k: v.peak_bytes / MIB for k, v in peaks.items()}


def test_trainer_debug_mem_breakdown(tmp_path):
    """--debug-mem: model (parameters + Adam state), data, activations, step peak and their total, in the
    RunResult (so in --json) and in the run line."""
    from dgl_exact.data import load_dataset
    from dgl_exact.training.config import TrainConfig
    from dgl_exact.training.trainer import Trainer

    spec = "synthetic-small:num_nodes=300,num_features=16,num_classes=4"
    lines = []
    trainer = Trainer(TrainConfig(dataset=spec, hidden=16, epochs=2, data_root=str(tmp_path)),
                      dataset=load_dataset(spec, "unused"), progress=False, log=lines.append)
    run = trainer.fit(debug_mem=True).runs[0]
    params = sum(p.numel() * 4 for p in trainer.model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in trainer.model.buffers())
    assert run.model_bytes == 3 * params + buffers + 4 * len(list(trainer.model.parameters()))  # + Adam's steps
    assert run.data_bytes >= trainer.feat.nbytes + trainer.label.nbytes
    assert run.activation_bytes > 0
    if run.peak_bytes is not None:
        assert run.total_bytes == run.model_bytes + run.data_bytes + run.peak_bytes
    assert "step peak incl. backward" in lines[0] and "model " in lines[0] and "data " in lines[0]


@pytest.mark.parametrize("model_name", ["sage", "gcn"])
def test_amp_keeps_no_uncompressed_half_copy(model_name, data):
    """Under bf16 autocast, linear() used to keep its cast copy of the input by reference (a new,
    uncompressed half-precision tensor): INT2 activations rose to about 2x. Now backward reads the
    original (alive anyway) and casts it again: about the non-AMP figure (SAGE's fused ``ops.sage_mean``
    too: it casts its input inside and keeps the original)."""
    g, x, y = data
    torch.manual_seed(0)
    model = build_model(model_name, IN_FEATS, CLASSES, hidden=HIDDEN, layers=3, impl="exact")
    model.train()
    got = {}
    for amp in (False, True):
        with dgl_exact.config(CONFIGS["int2"]), torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            report = measure(lambda: ops.cross_entropy(model(g, x), y), modules=[model], exclude=[x])
        report.result.backward()
        got[amp] = report.activation_bytes
    assert got[True] <= 1.05 * got[False], got


def test_amp_linear_gradients_unchanged():
    """Compression off under bf16 autocast: dgl_exact's linear gives F.linear's gradients (it re-casts the
    kept fp32 input in backward, the same bf16 values the cast copy held)."""
    torch.manual_seed(0)
    x = torch.randn(37, 24)
    w = torch.randn(16, 24, requires_grad=True)
    b = torch.randn(16, requires_grad=True)
    g = torch.randn(37, 16)
    grads = []
    for fn in (F.linear, lambda *a: ops.linear(*a, config=CompressionConfig(enabled=False))):
        w.grad = b.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fn(x, w, b)
        assert out.dtype == torch.bfloat16
        out.float().backward(g)
        grads.append((w.grad.clone(), b.grad.clone()))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-2, atol=1e-2)


def test_run_line_names_a_grown_heap():
    """The trainer's run line repeats the meter's warning when a step started with a grown heap."""
    from dgl_exact.training.results import RunResult, run_line

    base = dict(run=0, seed=0, best_epoch=1, train=0.5, val=0.5, test=0.5, final_loss=1.0, epoch_time=0.1,
                total_time=1.0, activation_bytes=MIB, model_bytes=MIB, data_bytes=MIB, peak_bytes=2 * MIB,
                total_bytes=4 * MIB)
    plain = run_line(RunResult(**base, peak_method="resident high-water mark (VmHWM)"), "acc")
    grown = run_line(RunResult(**base, peak_method="resident high-water mark (VmHWM); 99.20 MiB of free heap "
                                "chunks before the step (...)"), "acc")
    assert "heap" not in plain and "99.20 MiB of free heap chunks" in grown


def test_trainer_debug_mem_counts_a_pyg_models_graph(tmp_path):
    """--debug-mem with a PyG model: the data counts the edge_index (and edge ids) it made of the graph and the
    structures dgl_exact.pyg's convs cache for it, beside DGL's own arrays."""
    pytest.importorskip("torch_geometric", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")
    from dgl_exact.data import load_dataset
    from dgl_exact.data.compact import structure_bytes
    from dgl_exact.training.config import TrainConfig
    from dgl_exact.training.pyg_models import PyGModel
    from dgl_exact.training.trainer import Trainer

    spec = "synthetic-small:num_nodes=300,num_features=16,num_classes=4"
    trainer = Trainer(TrainConfig(dataset=spec, framework="pyg", hidden=16, epochs=1, data_root=str(tmp_path)),
                      dataset=load_dataset(spec, "unused"), progress=False, log=None)
    run = trainer.fit(debug_mem=True).runs[0]
    g = trainer.graph
    pyg = tensor_bytes(PyGModel.graph_tensors(g) + PyGModel.structure_tensors(g))
    assert pyg > 24 * g.num_edges()  # edge_index and ids, and the cached CSC/CSR
    data = [trainer.feat, trainer.label, trainer.train_label, *trainer.split.values()]
    assert run.data_bytes >= structure_bytes(g) + tensor_bytes(data) + pyg
