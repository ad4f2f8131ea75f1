"""Ownership rule 12 (dgl_exact.ops.keep): batch norm, then activations and dropout, written as separate
statements (``h = bn(h); h = F.relu(h); h = dropout(h)``), then a linear: the linear keeps ``h`` through the batch
norm's compressed copy of its input, its per-channel scale and shift, the activation's one-bit mask and the
dropout's seed (:class:`ElementwiseOf`), not a copy of its own. Unbiased (every step is affine in its input given
the exact masks), and only where rule 6's condition holds for the batch norm's input."""
from __future__ import annotations

import contextlib

import pytest
import torch

import dgl_exact
from dgl_exact.compression import CompressedTensor
from dgl_exact.ops import batch_norm, dropout, leaky_relu, linear, relu, relu_dropout
from dgl_exact.ops.chunks import row_chunks
from dgl_exact.ops.derived import ElementwiseOf, LinearOf, is_exact
from dgl_exact.ops.keep import restore
from dgl_exact.ops.saved import load_kept
from tests.ops._helpers import INT2, INT8, assert_mean_converges, kept_item, saved_tensors

pytestmark = pytest.mark.usefixtures("one_thread")

N, C, OUT = 160, 12, 5


def _net(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.randn(N, C, generator=gen)
    w0 = torch.nn.Parameter(torch.randn(C, C, generator=gen) / C ** 0.5)
    gamma = torch.nn.Parameter(1.0 + 0.2 * torch.randn(C, generator=gen))
    beta = torch.nn.Parameter(0.1 * torch.randn(C, generator=gen))
    w = torch.nn.Parameter(torch.randn(OUT, C, generator=gen) / C ** 0.5)
    return x0, w0, gamma, beta, w


def _bn_copy(h):
    """What the batch norm under ``h`` keeps of its input."""
    node = h.grad_fn
    while type(node).__name__ != "BatchNormBackward":
        node = node.next_functions[0][0]
    return load_kept(node)[0]


def _bn(x, gamma, beta):
    return batch_norm(x, torch.zeros(C), torch.ones(C), gamma, beta, training=True)


def _chain(x, gamma, beta, act="relu", p=0.3):
    b = _bn(x, gamma, beta)
    if act == "relu":
        return dropout(relu(b), p)
    if act == "leaky":
        return dropout(leaky_relu(b, 0.1), p)
    return relu_dropout(b, p)  # fused: one mask for both


@pytest.mark.parametrize("act", ["relu", "leaky", "relu_dropout"])
def test_linear_keeps_the_batch_norms_copy(act):
    x0, w0, gamma, beta, w = _net()
    with dgl_exact.config(INT8), saved_tensors() as saved:
        x = linear(x0, w0)  # the batch norm's input has autograd history
        h = _chain(x, gamma, beta, act)
        y = linear(h, w)
    item, bn_copy = kept_item(y), _bn_copy(h)
    assert isinstance(bn_copy, CompressedTensor)
    assert isinstance(item, ElementwiseOf) and not is_exact(item)
    assert item.root.packed.data_ptr() == bn_copy.packed.data_ptr()  # the batch norm's copy: no bytes of its own
    assert not any(t.is_floating_point() and t.numel() >= h.numel() and t.data_ptr() != x0.data_ptr()
                   for t in saved)  # nothing of h's size but the data
    # the decode is the chain applied to the decoded batch-norm input: close to h at 8 bits, exact in its zeros
    decoded = restore(item)
    torch.testing.assert_close(decoded, h, atol=0.05, rtol=0.05)
    assert torch.equal(decoded == 0, h == 0)
    rows = [r for _, _, r in row_chunks(item, chunk_elements=8 * C)]
    assert len(rows) > 1 and torch.equal(torch.cat(rows), decoded)  # row chunks: the same values


def test_weight_gradient_unbiased_at_int2():
    """Over 300 seeded draws the linear's weight gradient, formed from the decode of the batch norm's INT2 copy
    through affine, ReLU and dropout, converges to the one from ``h`` itself (each draw's own exact gradient:
    the dropout mask is drawn anew every time): Student t bound per element, Bonferroni over the elements."""
    x0, w0, gamma, beta, w = _net(1)
    r = torch.randn(N, OUT, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(3)
    diffs, zero = [], torch.zeros(OUT, C)
    for _ in range(300):
        with dgl_exact.config(INT2):
            h = _chain(linear(x0, w0), gamma, beta)
            out = linear(h, w)
        assert isinstance(kept_item(out), ElementwiseOf)
        (gw,) = torch.autograd.grad((out * r).sum(), [w])
        diffs.append(gw - r.t() @ h.detach())
    assert_mean_converges(diffs, zero, floor=0.0, mean_square=None)
    assert float(torch.stack(diffs).abs().max()) > 1e-3  # compressed: the draws differ from the exact gradient


def _takes_chain(product) -> bool:
    """Whether a routed product keeps one of its operands as an :class:`ElementwiseOf`."""
    assert type(product.grad_fn).__name__ == "ProductBackward"
    return any(isinstance(item, ElementwiseOf) for item in load_kept(product.grad_fn))


def test_refused_where_rule_6_fails_or_the_chain_breaks():
    from dgl_exact.ops import message_passing

    x0, w0, gamma, beta, w = _net(4)
    q = torch.nn.Parameter(torch.randn(N, C))
    with message_passing(), dgl_exact.config(INT2):
        x = linear(x0, w0)
        h = _chain(x, gamma, beta)
        assert _takes_chain(h * q)
        assert not _takes_chain(h * (x * q))  # an operand computed from the batch norm's input (rule 6)
        assert not _takes_chain(h * h)  # read twice
        b = _bn(linear(x0, w0), gamma, beta)
        b.mul_(1.5)  # changed in place between the batch norm and the activation: not recorded
        assert not _takes_chain(relu(b) * q)
        h2 = _chain(linear(x0, w0), gamma, beta)
        h2.add_(1.0)  # changed in place since
        assert not _takes_chain(h2 * q)
        h3 = _chain(linear(x0, w0), gamma, beta)
    assert not isinstance(kept_item(linear(h3, w, config=INT8)), ElementwiseOf)  # another configuration


def test_gat_style_layer_keeps_ft_through_the_chain():
    """``ft = fc(dropout(relu(bn(x))))``, then products with attention vectors: the products keep ``ft`` as a
    :class:`LinearOf` of the chain (rule 10 over rule 12), so ``ft``'s and ``h``'s copies are both gone."""
    from dgl_exact.ops import message_passing

    x0, w0, gamma, beta, w = _net(5)
    attn = torch.nn.Parameter(torch.randn(1, OUT))
    with message_passing(), dgl_exact.config(INT2), saved_tensors() as saved:
        h = _chain(linear(x0, w0), gamma, beta)
        ft = linear(h, w)
        el = (ft * attn).sum(-1)
    item = kept_item(el, 0) if isinstance(kept_item(el, 0), LinearOf) else kept_item(el, 1)
    assert isinstance(item, LinearOf) and isinstance(item.x, ElementwiseOf)
    packed = [t for t in saved if t.dtype == torch.uint8 and t.numel() >= N * C // 4]
    assert len({t.data_ptr() for t in packed}) == 1  # the batch norm's codes only (the masks are N*C/8 bytes)
    el.sum().backward()
    assert attn.grad is not None and w.grad is not None and gamma.grad is not None


def test_what_is_kept_through_the_chain_does_not_depend_on_a_keep_hook():
    """A planner's keep hook must see the same keep calls whatever it chooses (it numbers its slots): batch norm's
    input kept by reference (a planner's fp32 choice) is recorded as well as a compressed copy, and a ReLU asked
    for a copy of its output for the next op (``compress_for``) records nothing, whether the copy is made (no
    hook) or not (a hook that chooses)."""
    from dgl_exact.ops.keep import default_keep, keep_hook

    x0, w0, gamma, beta, w = _net(6)
    with dgl_exact.config(INT2):
        with keep_hook(lambda x, cfg, force: x):  # everything by reference
            item = kept_item(linear(_chain(linear(x0, w0), gamma, beta), w))
        assert isinstance(item, ElementwiseOf) and isinstance(item.root, torch.Tensor)
        for hook, records_only in ((None, True), (default_keep, True), (default_keep, False)):
            scope = keep_hook(hook, records_only=records_only) if hook else contextlib.nullcontext()
            with scope:
                y = relu_dropout(_bn(linear(x0, w0), gamma, beta), 0.3, compress_for=INT2)
                assert not isinstance(kept_item(linear(y, w)), ElementwiseOf)


def test_by_reference_root_decodes_by_unaligned_rows():
    """Batch norm's input kept by reference (a keep hook's fp32 choice): the chain is exact up to the affine step's
    rounding, and row chunks starting inside a byte of the ReLU's mask decode as the whole does."""
    from dgl_exact.ops.keep import keep_hook

    x0, w0, gamma, beta, w = _net(7)
    with dgl_exact.config(INT2), keep_hook(lambda x, cfg, force: x):
        h = _chain(linear(x0, w0), gamma, beta)
        item = kept_item(linear(h, w))
    assert isinstance(item, ElementwiseOf) and is_exact(item)
    whole = restore(item)
    torch.testing.assert_close(whole, h, rtol=1e-5, atol=1e-5)
    rows = [r for _, _, r in row_chunks(item, chunk_elements=5 * C)]  # 60 elements: starts not on whole bytes
    assert len(rows) == N // 5 and torch.equal(torch.cat(rows), whole)


def test_against_torch_in_eval_mode_and_refusals():
    """Batch norm in evaluation mode (running statistics) with grad: the linear keeps the chain, and its weight
    gradient is plain torch's on the same ``h`` within what the decode's own error allows; ReLU zeroes what
    torch's does.
    Double backward through it is refused with the compression message; a tensor subclass of ``h`` is not kept
    through the chain; under a saved-tensor hook that copies what it packs (as offloading hooks do) the tensors
    the recipe points to are not the ones kept, so the linear keeps a copy of its own, with the same guarantee."""
    x0, w0, gamma, beta, w = _net(8)
    rm, rv = 0.1 * torch.randn(C), 1.0 + torch.rand(C)
    r = torch.randn(N, OUT, generator=torch.Generator().manual_seed(9))
    for hooked in (False, True):
        scope = (torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t) if hooked
                 else contextlib.nullcontext())
        with dgl_exact.config(INT8), scope:
            x = linear(x0, w0)
            h = dropout(relu(batch_norm(x, rm, rv, gamma, beta, training=False)), 0.2)
            out = linear(h, w)
        assert isinstance(kept_item(out), ElementwiseOf) != hooked
        ref = torch.nn.functional.relu(torch.nn.functional.batch_norm(x.detach(), rm, rv, gamma.detach(),
                                                                      beta.detach()))
        assert not bool(((ref == 0) & (h.detach() != 0)).any())  # torch's ReLU zeros are zeros here too
        (gw,) = torch.autograd.grad((out * r).sum(), [w], retain_graph=True)
        # |r^T (h_hat - h)| <= |r|^T max|h_hat - h|: the decode's own error bounds the gradient's (plus rounding)
        bound = r.abs().sum(0, keepdim=True).t() * float((restore(kept_item(out)) - h.detach()).abs().max())
        assert bool(((gw - r.t() @ h.detach()).abs() <= bound + 1e-4).all())
        assert float((restore(kept_item(out)) - h.detach()).abs().max()) < 0.05  # 8 bits: a small error
        with pytest.raises(RuntimeError, match="compression"):
            torch.autograd.grad((out * r).sum(), [w], create_graph=True)

    class Sub(torch.Tensor):
        pass

    with dgl_exact.config(INT8):
        h2 = dropout(relu(_bn(linear(x0, w0), gamma, beta)), 0.2)
        assert not isinstance(kept_item(linear(h2.as_subclass(Sub), w)), ElementwiseOf)
