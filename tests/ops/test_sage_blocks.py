"""``ops.sage_mean`` on a neighbour sampler's blocks (destination nodes: the first source rows): output, input and
weight gradients equal DGL's SAGEConv on the same sampled block (kept tensors exact), the first layer (input
features without gradient) and a hidden one, both layer orders (aggregate first / project first), chunked; and the
backward's peak holds one ``[N_src, D]`` buffer, not the composed ops' three."""
import pytest
import torch

import dgl_exact
from dgl_exact.ops import keep as keeping, sage
from dgl_exact.ops import chunks as chunking
from tests.ops._helpers import spy_apply

dgl = pytest.importorskip("dgl")


def _block(n=60, seeds=9, fanout=4, seed=0):
    torch.manual_seed(seed)
    g = dgl.rand_graph(n, 6 * n)
    sampler = dgl.dataloading.NeighborSampler([fanout])
    dgl.seed(seed)
    _, _, blocks = sampler.sample_blocks(g, torch.arange(seeds))
    return blocks[0]


def _pair(d_in, d_out, bias=True):
    torch.manual_seed(1)
    ref = dgl.nn.SAGEConv(d_in, d_out, "mean", bias=bias)
    ex = dgl_exact.SAGEConv(d_in, d_out, "mean", bias=bias, compression=dgl_exact.CompressionConfig(bits=2))
    ex.load_state_dict(ref.state_dict())
    return ref, ex


def _spy(monkeypatch):
    return spy_apply(monkeypatch, sage.SAGEMean)


def _run(conv, block, x, gout, hidden):
    conv.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(hidden)
    out = conv(block, x * 1.0 if hidden else x)
    out.backward(gout)
    return out.detach(), x.grad, {n: p.grad for n, p in conv.named_parameters()}


@pytest.fixture(params=[False, True], ids=["whole", "chunked"])
def chunks(request, monkeypatch):
    if request.param:  # row chunks of 5 rows of 7 columns, column chunks of 3: tiny layers cross boundaries
        monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", 5 * 7)
        monkeypatch.setattr(sage, "COLUMN_CHUNK", 3)


@pytest.mark.parametrize("d_in,d_out", [(7, 7), (5, 9), (9, 4)])
@pytest.mark.parametrize("hidden", [False, True], ids=["first", "hidden"])
@pytest.mark.parametrize("bias", [True, False])
def test_block_equals_dgl_with_exact_kept_tensors(d_in, d_out, hidden, bias, chunks, monkeypatch):
    calls = _spy(monkeypatch)
    block = _block()
    assert block.num_src_nodes() > block.num_dst_nodes()
    ref, ex = _pair(d_in, d_out, bias)
    gen = torch.Generator().manual_seed(d_in)
    x = torch.randn(block.num_src_nodes(), d_in, generator=gen)
    gout = torch.randn(block.num_dst_nodes(), d_out, generator=gen)
    want = _run(ref, block, x, gout, hidden)
    with keeping.keep_hook(lambda x, cfg, force: x.clone() if force else x):  # every kept tensor exact
        got = _run(ex, block, x, gout, hidden)
    assert len(calls) == 1  # the fused op ran on the block
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    if hidden:
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    else:
        assert got[1] is None
    for name, grad in want[2].items():
        torch.testing.assert_close(got[2][name], grad, rtol=1e-5, atol=1e-5, msg=name)


def test_block_int2_output_exact_and_weight_gradient_unbiased():
    block = _block(n=200, seeds=30)
    ref, ex = _pair(8, 8)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(block.num_src_nodes(), 8, generator=gen)
    gout = torch.randn(block.num_dst_nodes(), 8, generator=gen)
    want = _run(ref, block, x, gout, True)
    runs = [_run(ex, block, x, gout, True) for _ in range(200)]
    for out, gx, _ in runs:
        torch.testing.assert_close(out, want[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gx, want[1], rtol=1e-5, atol=1e-5)  # the input gradient reads no activation
    for name in ("fc_self.weight", "fc_neigh.weight"):
        mean = torch.stack([r[2][name] for r in runs]).mean(0)
        err = (mean - want[2][name]).abs().max() / want[2][name].abs().max()
        assert err < 0.1, (name, err)


def test_hooks_and_eval_take_the_composed_path(monkeypatch):
    calls = _spy(monkeypatch)
    block = _block()
    _, ex = _pair(6, 6)
    x = torch.randn(block.num_src_nodes(), 6)
    handle = ex.fc_neigh.register_forward_hook(lambda *a: None)
    ex(block, x * 1.0).sum().backward()
    handle.remove()
    ex.eval()
    ex(block, x)
    ex.train()
    ex(block, (x, x[:block.num_dst_nodes()])).sum().backward()  # a pair of tensors: composed
    assert calls == []


def test_block_backward_holds_one_input_sized_buffer():
    """The hidden layer's backward on a block whose source side is much larger than its destination side: at its
    peak one [N_src, D] fp32 buffer (the input gradient) besides small ones; the composed ops hold three."""
    from tests._op_census import Census

    block = _block(n=3000, seeds=40, fanout=15)
    n_src, d = block.num_src_nodes(), 64
    big = n_src * d * 4
    assert n_src > 5 * block.num_dst_nodes()
    _, ex = _pair(d, d)

    def backward_peak(conv):
        h = torch.randn(n_src, d, requires_grad=True) * 1.0  # a hidden layer's input (autograd history)
        out = conv(block, h)
        census = Census(min_bytes=big // 2)
        with census:
            census.phase = "backward"
            torch.autograd.grad(out, [h, *conv.parameters()], torch.randn_like(out))  # the conv's backward only
        return census.best.get("backward", 0)

    fused = backward_peak(ex)
    assert fused <= 1.2 * big, fused / big
    ex.fc_neigh.register_forward_hook(lambda *a: None)  # a hook: the composed ops run
    composed = backward_peak(ex)
    assert composed >= 2 * big, composed / big


def test_refuses_a_bipartite_graph_that_is_not_a_block():
    """Only a block says that its destination nodes are its first source nodes."""
    g = dgl.heterograph({("u", "e", "v"): (torch.tensor([0, 1, 5]), torch.tensor([0, 1, 2]))},
                        num_nodes_dict={"u": 6, "v": 3})
    with pytest.raises(ValueError, match="homogeneous graph or a block"):
        dgl_exact.ops.sage_mean(g, torch.randn(6, 3), torch.randn(3, 3), None, torch.randn(3, 3))


def test_hidden_input_on_a_block_is_not_held():
    """A hidden layer's input (autograd history) is kept compressed (its destination rows): the op holds no
    reference to it, so its memory goes when the caller drops it; input features (alive anyway) are kept by
    reference."""
    import weakref

    block = _block(n=200, seeds=30)
    _, ex = _pair(8, 8)
    h = torch.randn(block.num_src_nodes(), 8, requires_grad=True) * 1.0
    out = ex(block, h)
    ref = weakref.ref(h)
    del h
    assert ref() is None
    out.sum().backward()
    x = torch.randn(block.num_src_nodes(), 8)
    out = ex(block, x)
    assert any(t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
               for t in out.grad_fn.saved_tensors)
