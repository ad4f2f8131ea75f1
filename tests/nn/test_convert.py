"""compress_model's per-model configuration (dgl_exact/nn/convert.py): the config given to ``compress_model`` or
``set_model_config`` governs every compressed op inside the model's forward (converted modules, ``dgl_exact.ops``
calls in a custom forward, the saved-tensor hooks; message passing in tests/ops/test_message_passing.py),
nested models keep their own, and the scope never leaks."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import dgl_exact
from dgl_exact import CompressionConfig, ops
from dgl_exact.compression_config import get_config
from dgl_exact.nn import convert
from dgl_exact.nn._base import hooks_present

import dgl  # noqa: E402  (after dgl_exact)
import dgl.ops  # noqa: E402

OFF = CompressionConfig(enabled=False)
INT2 = CompressionConfig(bits=2)
INT4 = CompressionConfig(bits=4)


class Attention(nn.Module):
    """A layer written with graph ops in its own forward (``lib``: ``dgl.ops`` or ``dgl_exact.ops``), in
    the style of a research GAT: scores by a dot product, softmax over in-edges, weighted sum."""

    def __init__(self, lib, dim=16):
        super().__init__()
        self.use_ours = lib is ops
        self.lin = nn.Linear(dim, dim)

    @property
    def lib(self):
        return ops if self.use_ours else dgl.ops

    def forward(self, g, x):
        h = self.lin(x)
        score = self.lib.u_dot_v(g, h, h)  # keeps both operands (compressed in dgl_exact's)
        a = self.lib.edge_softmax(g, score)  # keeps its output
        return self.lib.u_mul_e_sum(g, h, a) + h


class Outer(nn.Module):
    def __init__(self, lib):
        super().__init__()
        self.inner = Attention(lib)
        self.lin = nn.Linear(16, 16)

    def forward(self, g, x):
        h = self.lin(x)
        h = self.inner.lib.copy_e_mean(g, self.inner.lib.u_mul_v(g, h, h)) + h
        return self.inner(g, h)


@pytest.fixture(scope="module")
def graph():
    torch.manual_seed(0)
    return dgl.add_self_loop(dgl.rand_graph(40, 160))


def _attention_weights(c) -> bool:
    """Whether a kept copy is an aggregation's attention weights (``u_mul_e_sum``'s edge values, ``[E, 1]``
    here), which it keeps at 8 bits or more whatever the configuration (``ops.graph._edge_weight_config``)."""
    return tuple(c.shape) == (200, 1) and c.bits == 8


def _bits(kept):
    """The bits of the kept copies that follow the configuration (all but the attention weights)."""
    return sorted({c.bits for c in kept if not _attention_weights(c)})


def _grads(model, g, x):
    model.zero_grad()
    x = x.clone().requires_grad_()
    out = model(g, x * 1.0)  # a non-leaf input: what the first layer keeps of it is compressed
    out.pow(2).sum().backward()
    return [out.detach(), x.grad] + [p.grad.clone() for p in model.parameters()]


def test_converted_modules_and_ops_calls_run_at_the_models_config(graph, kept_compressed):
    model = dgl_exact.compress_model(Attention(ops), config=INT2)
    assert model.lin.compression is INT2 and dgl_exact.get_model_config(model) is INT2
    x = torch.randn(40, 16)
    assert get_config().bits == 8  # the ambient default
    _grads(model, graph, x)
    # the Linear's input, u_dot_v's operands (one copy for both, shared: ownership rule 6), edge_softmax's
    # output, u_mul_e_sum's features (a copy of its own: its edge weights came from them): all 2-bit; the
    # attention weights u_mul_e_sum keeps: 8-bit
    assert len(kept_compressed) >= 4 and _bits(kept_compressed) == [2]
    assert sum(map(_attention_weights, kept_compressed)) == 1
    kept_compressed.clear()
    with dgl_exact.config(bits=8):  # an ambient scope around the call does not override the model's own
        _grads(model, graph, x)
    assert _bits(kept_compressed) == [2]
    assert get_config().bits == 8  # the scope ended with the forward


def test_set_model_config_changes_modules_and_ops(graph, kept_compressed):
    model = dgl_exact.compress_model(Attention(ops), config=INT2)
    dgl_exact.set_model_config(model, bits=4)  # a change to the model's configuration
    assert model.lin.compression == INT4
    _grads(model, graph, torch.randn(40, 16))
    assert _bits(kept_compressed) == [4]
    dgl_exact.compress_model(model, report=True)  # converting again without a config keeps the model's
    assert dgl_exact.get_model_config(model) == INT4
    dgl_exact.set_model_config(model, None)  # follow the configuration in force again
    assert model.lin.compression is None and dgl_exact.get_model_config(model) is None
    kept_compressed.clear()
    with dgl_exact.config(bits=1):
        _grads(model, graph, torch.randn(40, 16))
    assert _bits(kept_compressed) == [1]


def test_model_config_off_gives_dgls_gradients(graph):
    torch.manual_seed(1)
    theirs = Outer(dgl.ops).double()
    ours = dgl_exact.compress_model(copy.deepcopy(theirs), config=OFF)
    ours.inner.use_ours = True
    x = torch.randn(40, 16, dtype=torch.float64)
    for a, b in zip(_grads(ours, graph, x), _grads(theirs, graph, x)):
        torch.testing.assert_close(a, b)


class MessagePassing(nn.Module):
    """A layer written with DGL's message-passing API (a research GAT's style)."""

    def __init__(self, dim=16):
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.att = nn.Parameter(torch.randn(dim) / 4)

    def forward(self, g, x):
        import dgl.function as fn

        with g.local_scope():
            g.ndata["h"] = self.lin(x)
            g.ndata["s"] = g.ndata["h"] * self.att
            g.apply_edges(fn.u_dot_v("s", "h", "score"))  # keeps both operands
            g.edata["a"] = dgl.nn.functional.edge_softmax(g, g.edata["score"])  # keeps its output
            g.update_all(fn.u_mul_e("h", "a", "m"), fn.sum("m", "out"))  # keeps the features
            return g.ndata["out"]


def test_message_passing_runs_at_the_models_config(graph, kept_compressed):
    torch.manual_seed(2)
    theirs = MessagePassing().double()
    ours = dgl_exact.compress_model(copy.deepcopy(theirs), config=OFF)
    x = torch.randn(40, 16, dtype=torch.float64)
    for a, b in zip(_grads(ours, graph, x), _grads(theirs, graph, x)):
        torch.testing.assert_close(a, b)
    assert kept_compressed == []
    dgl_exact.set_model_config(ours, INT2)
    _grads(ours.float(), graph, x.float())
    # the Linear's input, u_dot_v's operands, edge_softmax's output, u_mul_e_sum's features, all at 2 bits
    assert len(kept_compressed) >= 4 and _bits(kept_compressed) == [2]
    kept_compressed.clear()
    _grads(theirs.float(), graph, x.float())  # the unconverted model: DGL's own ops, nothing compressed
    assert kept_compressed == []


def test_user_set_module_compression_is_kept(graph, kept_compressed):
    model = Attention(ops)
    model.lin = dgl_exact.nn.Linear(16, 16)
    model.lin.compression = INT4
    dgl_exact.compress_model(model, config=INT2)
    assert model.lin.compression is INT4
    dgl_exact.set_model_config(model, bits=1)
    assert model.lin.compression is INT4


@pytest.mark.parametrize("order", ["inner first", "outer first"])
def test_nested_models_keep_their_own_config(order, graph, kept_compressed):
    model = Outer(ops)
    if order == "inner first":
        dgl_exact.compress_model(model.inner, config=INT2)
        dgl_exact.compress_model(model, config=INT4)
    else:
        dgl_exact.compress_model(model, config=INT4)
        dgl_exact.compress_model(model.inner, config=INT2)
    assert model.lin.compression is INT4 and model.inner.lin.compression is INT2
    x = torch.randn(40, 16)
    model(graph, x * 1.0).sum().backward()
    by_bits = {b: sum(c.bits == b for c in kept_compressed) for b in _bits(kept_compressed)}
    # the outer forward keeps u_mul_v's operands (one copy for both, shared: ownership rule 6) at 4 bits; the
    # inner forward inside it (its Linear's input, u_dot_v's, edge_softmax's output, ...) at 2
    assert by_bits[4] == 1 and by_bits[2] >= 4 and set(by_bits) == {2, 4}
    kept_compressed.clear()
    dgl_exact.set_model_config(model, bits=1)  # the outer's change leaves the inner's alone
    assert model.lin.compression.bits == 1 and model.inner.lin.compression is INT2
    model(graph, x * 1.0)
    assert _bits(kept_compressed) == [1, 2]


@pytest.mark.skipif(not hasattr(torch._C._autograd, "_top_saved_tensors_default_hooks"),
                    reason="torch < 2.2 cannot tell a scope the saved-tensor hooks around it")
def test_saved_tensor_hooks_run_at_the_models_config(graph):
    class Functional(nn.Module):  # what it saves is visible only to the saved-tensor hooks
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(64, 64) / 8)

        def forward(self, x):
            return torch.tanh(torch.sigmoid(x @ self.w) @ self.w)

    x = torch.randn(1024, 64)

    def kept_by_model(bits):
        model = dgl_exact.compress_model(Functional(), config=CompressionConfig(bits=bits), saved_tensors=True)
        with dgl_exact.config(bits=8):  # the ambient config is not the one used
            return dgl_exact.memory.measure(lambda: model(x * 1.0).sum(), modules=[model]).activation_bytes

    def kept_in_scope(bits):  # the same forward inside an explicit compress_saved scope at ``bits``
        model = Functional()

        def step():
            with dgl_exact.compress_saved(CompressionConfig(bits=bits), model=model):
                return model(x * 1.0).sum()

        return dgl_exact.memory.measure(step, modules=[model]).activation_bytes

    assert kept_by_model(2) == kept_in_scope(2) < kept_in_scope(8) == kept_by_model(8)


def test_scope_closed_when_forward_raises_and_copies_keep_it(graph):
    model = dgl_exact.compress_model(Attention(ops), config=INT2, saved_tensors=True)
    with pytest.raises(Exception):
        model(graph, torch.randn(39, 16))  # one row short
    assert get_config().bits == 8 and convert._running.get() == ()
    from dgl_exact.saved_tensors import _outer_hooks

    assert _outer_hooks() is None
    twin = copy.deepcopy(model)
    assert dgl_exact.get_model_config(twin) == INT2
    assert sum(h is convert._enter_model_scope for h in twin._forward_pre_hooks.values()) == 1
    dgl_exact.compress_model(twin, config=INT4)  # not installed twice
    assert sum(h is convert._enter_model_scope for h in twin._forward_pre_hooks.values()) == 1


def test_scope_hooks_leave_fused_paths_allowed():
    conv = dgl_exact.compress_model(dgl.nn.GATConv(8, 4, num_heads=2), config=INT2)
    assert not hooks_present(conv)
    conv.register_forward_hook(lambda *a: None)
    assert hooks_present(conv)


def test_set_model_config_errors():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        dgl_exact.set_model_config("model", INT2)
    with pytest.raises(TypeError, match="CompressionConfig or None"):
        dgl_exact.set_model_config(nn.Linear(2, 2), {"bits": 2})


@pytest.mark.slow
def test_converted_model_compiles_with_fullgraph(graph):
    """The scope hooks stand aside while dynamo traces (it cannot trace a ContextVar): no graph break."""
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = dgl.nn.GraphConv(16, 8), dgl.nn.GraphConv(8, 4)

        def forward(self, g, x):
            return self.c2(g, self.c1(g, x).relu())

    model = dgl_exact.compress_model(Two(), config=INT2)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=False)
    compiled(graph, torch.randn(40, 16)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert convert._running.get() == ()


def test_compression_set_by_the_user_after_conversion_is_kept():
    model = dgl_exact.compress_model(Attention(ops), config=INT2)
    model.lin.compression = INT4  # the user's, after the conversion
    dgl_exact.set_model_config(model, bits=1)
    assert model.lin.compression is INT4
