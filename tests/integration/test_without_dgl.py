"""dgl_exact's core and its PyG drop-ins work where DGL is not installed: a fresh interpreter in which ``import
dgl`` (and ``dgl.*``) raises ``ModuleNotFoundError`` imports the core (compression, kernels, ops, memory,
planning, saved_tensors) and ``dgl_exact.pyg``, runs the graph ops on a structure built from index tensors
and a PyG drop-in's compressed forward and backward, and never loads DGL; naming a part of the DGL front end
raises the install hint; ``dgl_exact.compress_model`` converts a PyG model. (The CI's no-DGL job also runs the
core and PyG test folders in a venv without DGL.)
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# DGL absent as an uninstalled package is: ``sys.modules["dgl"] = None`` makes ``import dgl`` and ``import
# dgl.<sub>`` raise ModuleNotFoundError (name 'dgl') and ``importlib.util.find_spec("dgl")`` return None, as
# without DGL (a finder raising from find_spec alone would break code that asks find_spec, which an absent
# package answers with None); the finder is the backstop should anything remove that entry: the real DGL is
# never found.
BLOCK_DGL = textwrap.dedent("""
    import importlib.abc
    import sys

    class _NoDGL(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "dgl" or name.startswith("dgl."):
                raise ModuleNotFoundError(f"No module named {name!r}", name="dgl")
            return None

    sys.meta_path.insert(0, _NoDGL())
    sys.modules["dgl"] = None
""")

CORE = textwrap.dedent("""
    import importlib
    import sys

    import torch

    for name in ("dgl_exact", "dgl_exact.compression", "dgl_exact.compression_config", "dgl_exact.kernels",
                 "dgl_exact.ops", "dgl_exact.ops.structure", "dgl_exact.memory", "dgl_exact.saved_tensors",
                 "dgl_exact.planning"):
        importlib.import_module(name)
    import dgl_exact
    from dgl_exact import ops
    from dgl_exact.ops.index_structure import IndexStructure

    # a graph op on a structure built from edge_index, compressed, forward and backward
    src, dst = torch.tensor([0, 1, 2, 3, 0, 2]), torch.tensor([1, 2, 3, 0, 2, 1])
    st = IndexStructure.from_edge_index(torch.stack([src, dst]), 4)
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.rand(6, 1, requires_grad=True)
    with dgl_exact.config(dgl_exact.CompressionConfig(bits=2)):
        out = ops.u_mul_e_sum(st, x, w)
    out.sum().backward()
    expected = torch.zeros(4).index_add_(0, src, w.detach()[:, 0])[:, None].expand(4, 8)
    assert torch.allclose(x.grad, expected), (x.grad, expected)
    c = dgl_exact.compress(torch.randn(64, 16), dgl_exact.CompressionConfig(bits=2))
    assert dgl_exact.decompress(c).shape == (64, 16)

    # the DGL front end says what it needs
    try:
        dgl_exact.GraphConv
    except ModuleNotFoundError as exc:
        assert exc.name == "dgl" and "pip install dgl" in str(exc), exc
    else:
        raise AssertionError("dgl_exact.GraphConv without DGL should raise ModuleNotFoundError")
""")

PYG = textwrap.dedent("""
    import torch
    import torch_geometric.nn as pyg_nn

    import dgl_exact
    import dgl_exact.pyg

    torch.manual_seed(0)
    edge_index = torch.tensor([[0, 1, 1, 2, 3, 4, 4, 0], [1, 0, 2, 1, 4, 3, 0, 4]])
    x = torch.randn(5, 6)
    theirs = pyg_nn.GCNConv(6, 4)
    ours = dgl_exact.pyg.GCNConv(6, 4)
    ours.load_state_dict(theirs.state_dict())
    ours.train()
    with dgl_exact.config(dgl_exact.CompressionConfig(enabled=False)):
        assert torch.allclose(ours(x, edge_index), theirs(x, edge_index), atol=1e-6)
    xr = x.clone().requires_grad_(True)
    with dgl_exact.config(dgl_exact.CompressionConfig(bits=2)):
        out = ours(xr, edge_index)
    assert torch.allclose(out, theirs(x, edge_index), atol=1e-6)  # the forward is exact
    out.square().sum().backward()
    assert xr.grad is not None and bool(torch.isfinite(xr.grad).all())
    assert all(p.grad is not None for p in ours.parameters())
""")

# a PyG model converted by dgl_exact.compress_model where DGL is absent (torch's and PyG's conversions; DGL's are
# registered only where DGL is loaded): the same eval output, a training step at INT2; DGL's convs say what they need
CONVERT_PYG = textwrap.dedent("""
    import torch
    import torch_geometric.nn as pyg_nn

    import dgl_exact


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = pyg_nn.GCNConv(6, 8)
            self.post = torch.nn.Sequential(pyg_nn.BatchNorm(8), torch.nn.ReLU(), torch.nn.Dropout(0.5))
            self.conv2 = pyg_nn.GATv2Conv(8, 3, heads=2)

        def forward(self, x, edge_index):
            return self.conv2(self.post(self.conv1(x, edge_index)), edge_index)


    torch.manual_seed(0)
    edge_index = torch.tensor([[0, 1, 1, 2, 3, 4, 4, 0], [1, 0, 2, 1, 4, 3, 0, 4]])
    x = torch.randn(5, 6)
    model = Net()
    model.eval()
    expected = model(x, edge_index)
    model, report = dgl_exact.compress_model(model, dgl_exact.CompressionConfig(bits=2), report=True)
    assert {"conv1", "conv1.lin", "post.0.module", "post.1", "post.2", "conv2", "conv2.lin_l",
            "conv2.lin_r"} <= set(report.converted), report
    assert type(model.conv2).__module__ == "dgl_exact.pyg.gatv2_conv", type(model.conv2)
    assert torch.allclose(model(x, edge_index), expected, atol=1e-6)
    model.train()
    model(x, edge_index).square().sum().backward()
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    try:
        dgl_exact.nn.GraphConv
    except ModuleNotFoundError as exc:
        assert exc.name == "dgl" and "pip install dgl" in str(exc), exc
    else:
        raise AssertionError("dgl_exact.nn.GraphConv without DGL should raise ModuleNotFoundError")
""")


CHECK_NO_DGL = textwrap.dedent("""
    loaded = sorted(m for m, v in sys.modules.items() if (m == "dgl" or m.startswith("dgl.")) and v is not None)
    assert not loaded, loaded
    print("ok")
""")


def _run_without_dgl(body: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1", DGL_EXACT_NO_IMPORT_HOOK="1")
    code = BLOCK_DGL + body + "import sys\n" + CHECK_NO_DGL
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-4000:]


def test_core_and_pyg_drop_in_import_and_run_without_dgl():
    """One interpreter with DGL blocked (each start imports torch again): the core first, then, where
    torch_geometric is installed (pip install 'dgl-exact[pyg]'), a PyG drop-in trains and compress_model converts
    a PyG model; DGL is never imported."""
    pyg = importlib.util.find_spec("torch_geometric") is not None
    _run_without_dgl(CORE + (PYG + CONVERT_PYG if pyg else ""))
