"""Rule 9 (``dgl_exact.ops.function``): gradients a backward returns own their storage, so autograd sums a
tensor's gradients in place into the first one that arrives (one buffer, not two, at the backward's peak)."""
import pytest
import torch

import dgl_exact
import dgl_exact.ops.function as function
from dgl_exact import ops
from dgl_exact._compat import storage_ptr

N, H, D = 300, 3, 8


def _accumulated_in_place(returns_first, consumer, base=function.Function):
    """Whether the gradient autograd hands to ``x``'s node is the first one that arrived (``returns_first``:
    a Function of class ``base`` whose backward returns it, created last so that it runs first), summed in
    place with the gradient from ``consumer(x)``."""
    x = torch.randn(N, H * D, requires_grad=True)
    ptrs = {}

    class First(base):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, g):
            out = returns_first(g)
            ptrs["first"] = out.data_ptr()
            return out

    h = (x * 1).view(N, H, D)
    loss = consumer(h).sum()
    loss = loss + First.apply(h).sum()
    h.grad_fn.register_prehook(lambda go: ptrs.__setitem__("summed", go[0].data_ptr()))
    loss.backward()
    return ptrs["first"] == ptrs["summed"]


def test_a_returned_view_is_summed_into_in_place():
    # torch refuses in-place accumulation into a view (it holds its base); the base class detaches it
    assert _accumulated_in_place(lambda g: (g.reshape(N, H * D) * 2).view(N, H, D), lambda h: h * 3)


def test_plain_torch_function_returning_a_view_is_not_summed_in_place():
    """What rule 9 works around, checked against torch itself (if torch changes, the rule can go)."""
    assert not _accumulated_in_place(lambda g: (g.reshape(N, H * D) * 2).view(N, H, D), lambda h: h * 3,
                                     base=torch.autograd.Function)


def test_storage_ptr_keeps_a_gradient_summable_in_place():
    def looked_at(g):
        out = g * 2
        assert storage_ptr(out) == out.data_ptr()
        return out

    assert _accumulated_in_place(looked_at, lambda h: h * 3)


def test_untyped_storage_makes_torch_refuse_in_place_sums():
    """Why :func:`storage_ptr` exists: on recent torch (2.13 here; not 2.1) a storage's Python object, once
    created, counts as a holder of the storage for as long as the storage lives."""
    def looked_at(g):
        out = g * 2
        out.untyped_storage()
        return out

    if _accumulated_in_place(looked_at, lambda h: h * 3):
        pytest.skip(f"torch {torch.__version__} sums in place after untyped_storage(): storage_ptr changes nothing")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
@pytest.mark.parametrize("offset", [0, 5])
def test_storage_ptr_equals_the_storage_data_ptr(offset, dtype):
    t = torch.zeros(40 + offset, dtype=dtype)[offset:].view(5, 8)
    assert storage_ptr(t) == t.untyped_storage().data_ptr()
    assert storage_ptr(t[2:, 3:]) == t.untyped_storage().data_ptr()


def test_a_graph_op_gradient_is_summed_into_in_place(monkeypatch):
    """``ft`` read by an aggregation (whose backward runs first) and by a score product: the aggregation's
    gradient (DGL's or the numba kernel's buffer) takes the product's in place."""
    import dgl

    g = dgl.add_self_loop(dgl.rand_graph(N, 3 * N))
    seen = []
    owned = function.owned
    monkeypatch.setattr(function, "owned", lambda t: (seen.append(t.data_ptr()) if isinstance(t, torch.Tensor)
                                                      and t.shape[:1] == (N,) and t.dim() == 3 else None) or owned(t))
    w = torch.randn(H * D, H * D, requires_grad=True)
    attn = torch.randn(1, H, D, requires_grad=True)
    a = torch.rand(g.num_edges(), H, 1)
    with dgl_exact.config(bits=2), ops.message_passing():
        ft = (torch.randn(N, H * D) @ w).view(N, H, D)
        el = (ft * attn).sum(-1)
        out = ops.u_mul_e_sum(g, ft, a)
    summed = []
    ft.grad_fn.register_prehook(lambda go: summed.append(go[0].data_ptr()))
    (out.sum() + el.sum()).backward()
    assert seen and summed == [seen[0]]


def test_a_double_backward_gradient_keeps_its_graph():
    """With ``create_graph=True`` the returned view stays as it is (detaching it would cut its graph)."""
    class Square(function.Function):
        @staticmethod
        def forward(ctx, t):
            ctx.save_for_backward(t)
            return t * t

        @staticmethod
        def backward(ctx, g):
            (t,) = ctx.saved_tensors
            return (2 * t * g).reshape(-1).view(t.shape)

    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(Square.apply(x).sum(), x, create_graph=True)
    assert gx.requires_grad
    (ggx,) = torch.autograd.grad(gx.sum(), x)
    torch.testing.assert_close(ggx, torch.full_like(x, 2.0))
