"""``dgl_exact.explain``: besides the path each module took, every op of the forward that keeps a floating-point
tensor for backward uncompressed, with its module, the user's line and why (``Explanation.fp32``)."""
import inspect

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dgl_exact
from dgl_exact import CompressionConfig

import dgl  # noqa: E402  (after dgl_exact)

pytestmark = pytest.mark.usefixtures("one_thread")

N, FEATS, HIDDEN = 300, 8, 16
bound_edge_softmax = dgl.ops.edge_softmax      # bound at import, before any converted model ran


class Custom(nn.Module):
    """A custom layer: a functional relu (routed to dgl_exact's), a functional tanh, a tensor product, DGL
    message passing with a built-in and with a Python message function, an edge softmax through a name bound
    at import."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(FEATS, HIDDEN)
        self.attn = nn.Parameter(torch.randn(HIDDEN))

    def forward(self, g, x):
        h = F.relu(self.lin(x))                                      # marker: functional relu
        h = F.tanh(h)                                                # marker: functional tanh
        score = (h * self.attn).sum(-1, keepdim=True)               # marker: tensor product
        with g.local_scope():
            g.ndata["h"], g.ndata["s"] = h, score
            g.apply_edges(dgl.function.u_add_v("s", "s", "e"))
            a = bound_edge_softmax(g, g.edata["e"])                 # marker: bound softmax
            g.edata["a"] = a
            g.update_all(dgl.function.u_mul_e("h", "a", "m"), dgl.function.sum("m", "o"))
            g.update_all(lambda edges: {"m2": torch.tanh(edges.src["o"])},  # marker: python message
                         dgl.function.sum("m2", "o2"))
            return g.ndata["o2"]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = Custom()
        self.out = nn.Linear(HIDDEN, 3)

    def forward(self, g, x):
        return self.out(self.layer(g, x))


def _line(marker):
    lines, start = inspect.getsourcelines(Custom)
    return start + next(i for i, text in enumerate(lines) if f"# marker: {marker}" in text)


@pytest.fixture(scope="module")
def data():
    gen = torch.Generator().manual_seed(0)
    g = dgl.add_self_loop(dgl.graph((torch.randint(0, N, (4 * N,), generator=gen),
                                     torch.randint(0, N, (4 * N,), generator=gen)), num_nodes=N))
    return g, torch.randn(N, FEATS, generator=gen)


def _by_line(explanation):
    return {int(op.line.split(":")[1].split()[0]): op for op in explanation.fp32}


def test_each_op_that_stays_fp32_is_named_with_its_line_and_why(data):
    g, x = data
    model = dgl_exact.compress_model(Net(), config=CompressionConfig(bits=2))
    found = _by_line(dgl_exact.explain(model, g, x))
    # F.relu runs dgl_exact's relu in the converted model's forward (1 bit): not listed
    assert _line("functional relu") not in found
    tanh = found[_line("functional tanh")]
    assert tanh.module == "layer" and tanh.op == "torch.nn.functional.tanh" and "functional torch call" in tanh.why
    assert tanh.bytes == N * HIDDEN * 4                     # its fp32 output, kept for the backward
    # the product reads tanh's output (already counted) and a parameter: nothing more of its own
    assert _line("tensor product") not in found
    # DGL's edge_softmax, even through a name bound at import, runs dgl_exact's op in the scope: not listed
    assert _line("bound softmax") not in found
    python_msg = found[_line("python message")]
    assert "user-defined (Python) message" in python_msg.why and python_msg.op == "Python function <lambda>"
    # DGL's built-ins inside the converted scope run dgl_exact's compressed ops: not listed
    assert not any("apply_edges" in op.line or "u_mul_e" in op.line for op in found.values())
    # the converted Linear keeps its input compressed: the out layer's line is not listed
    assert not any(op.module == "out" for op in found.values())
    text = str(dgl_exact.explain(model, g, x))
    assert "kept in fp32 for backward (not compressed)" in text and "why: " in text


def test_outside_a_converted_scope_dgl_ops_are_named_so(data):
    g, x = data
    found = _by_line(dgl_exact.explain(Net(), g, x))        # not converted: DGL's own ops everywhere
    apply_edges = [op for op in found.values() if op.op.startswith("dgl.") and "outside a converted" in op.why]
    assert apply_edges
    out = [op for op in dgl_exact.explain(Net(), g, x).fp32 if op.module == "out"]
    assert out and "has no dgl_exact version" in out[0].why or "not converted" in out[0].why


def test_saved_tensor_hooks_leave_nothing_fp32_to_name(data):
    g, x = data
    model = dgl_exact.compress_model(Net(), config=CompressionConfig(bits=2), saved_tensors=True)
    assert dgl_exact.explain(model, g, x).fp32 == []
