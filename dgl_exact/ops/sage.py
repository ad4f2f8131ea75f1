"""One fused GraphSAGE-mean layer: ``x W_self^T + b + (D^-1 A x) W_neigh^T`` with two layer-sized buffers.

Composed from the separate ops (aggregation, division, two linears, a sum) a layer's forward holds three
``[N, D]`` fp32 buffers at once (the input, the neighbour mean, a linear's output) and so does its backward
(the output gradient, the input gradient of ``fc_self`` and that of ``fc_neigh`` before autograd adds them).
This op holds two, plus chunks. With ``D_out >= D_in`` (aggregate, then project):

* forward: ``s = A x`` (fresh), ``s /= deg`` in place, ``s`` kept compressed, ``s <- s W_neigh^T`` in
  place row chunk by row chunk (square ``W_neigh``), ``s += x W_self^T`` as one in-place ``addmm_``, ``s +=
  b``. ``x`` is kept as :func:`~dgl_exact.ops.linear` keeps it (by reference when alive anyway).
* backward: ``gx = g W_self``, then per column chunk ``c`` of the input features
  ``gx[:, c] += A^T ((g W_neigh[:, c]) / deg)``: two ``[N, |c|]`` temporaries instead of a third full buffer.
  The weight gradients read the kept tensors in row chunks (no full-size decompressed copy).

With ``D_out < D_in`` (project, then aggregate, as DGL orders it): nothing but ``x`` is kept, once, for both
weight gradients (``dW_neigh = (A_mean^T g)^T x``; the composed ops keep two independent compressed copies of
``x``); backward's ``[N, D_in]`` buffer is ``gx`` alone, the other temporaries are ``D_out`` wide.

On a block (a neighbour sampler's) the destination nodes are the first ``N_dst`` source nodes: ``x_dst =
x[:N_dst]`` feeds ``fc_self``; the backward's one ``[N_src, D_in]`` buffer is ``gx``, into whose destination rows
``fc_self``'s term is added (the composed ops hold three: the aggregation's gradient, ``fc_self``'s gradient padded
to ``N_src`` rows by the slice's backward, and their sum), and the first layer (input features without gradient)
allocates none. Only ``x_dst`` is kept where the layer aggregates first.

The same op computes GraphConv plus a residual linear, ``x W_lin^T + b_lin + n_dst A (n_src x) W + b``
(:func:`graph_conv_plus_linear`: GCN's degree factors ``n_src``, ``n_dst`` in place of the mean's ``1 / deg``,
and the conv's bias): the composed modules hold three layer-sized buffers in both passes (the input, the
conv's output and the linear's; in backward the three gradients), this op two.

Same values as the composed layer up to float summation order (the sum ``s W_neigh^T + x W_self^T + b``
runs in that order); ``gx`` needs no activation and equals the composed layer's; the weight gradients are
unbiased estimates from the kept tensors. Under autocast the products run in the autocast dtype and the
aggregation of ``x`` in ``x``'s own, as the composed ops run them. Taken by :class:`dgl_exact.SAGEConv`
('mean', homogeneous graph or block, plain linears, compression on, training, no capture); everything else runs the
composed ops.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..compression import CompressedTensor
from ..compression_config import CompressionConfig, resolve_config
from . import captured
from .keep import alive_anyway, fresh_outputs, mark_fresh, as_kept
from .._compat import autocast_dtype
from .chunks import chunk_elements_for, chunk_rows, needs_chunks, row_chunks, weight_grad
from .double_backward import refuse_double_backward
from .saved import load_kept, needs_saving, save_kept
from .graph import check_nodes
from .structure import structure_of
from .function import Function

__all__ = ["DivideByInDegrees", "SAGEMean", "MEAN", "divide_by_in_degrees", "graph_conv_plus_linear", "gcn_norm",
           "sage_mean"]

#: columns per chunk of the backward's transposed aggregation (input features; output features where the
#: layer projects first), when the layer is chunked at all: two ``[N, 16]`` temporaries at the backward's peak
#: (10.3 MiB each at 169,343 nodes; 32 columns cost GraphConv + residual 21 MiB more at that peak)
COLUMN_CHUNK = 16


#: the normalisation of the aggregation, ``(source factor, destination factor)``, each None, ``"sqrt"``
#: (``deg^-1/2``) or ``"inv"`` (``1 / deg``), the source's out-degree and the destination's in-degree, clamped
#: at 1: the mean (SAGE) divides by the in-degree
MEAN = (None, "inv")


def gcn_norm(norm: str) -> tuple:
    """GraphConv's ``norm`` (``'both'``, ``'left'``, ``'right'``, ``'none'``) as a normalisation of :data:`MEAN`'s
    form."""
    return {"both": ("sqrt", "sqrt"), "left": ("inv", None), "right": (None, "inv"), "none": (None, None)}[norm]


def _degrees(st, dtype) -> torch.Tensor:
    return st.in_degrees().clamp(min=1).to(dtype).view(-1, 1)


def _scale_dst(t: torch.Tensor, st, norm: tuple) -> torch.Tensor:
    """``t`` (destination rows) times the destination factor of ``norm``, in place (the mean divides, as
    the composed ``DivideByInDegrees`` does)."""
    if norm[1] == "inv":
        return t.div_(_degrees(st, t.dtype))
    if norm[1] == "sqrt":
        return t.mul_(st.node_norm("in", "sqrt", t.dtype).view(-1, 1))
    return t


def _scale_src(t: torch.Tensor, st, norm: tuple) -> torch.Tensor:
    """``t`` (source rows) times the source factor of ``norm``, in place."""
    return t if norm[0] is None else t.mul_(st.node_norm("out", norm[0], t.dtype).view(-1, 1))


def _aggregate(st, t: torch.Tensor, norm: tuple) -> torch.Tensor:
    """``sum_{u -> v} n_src(u) t[u]`` (``[N_dst, D]``): the source factor as an edge value for the call (no
    layer-sized ``t * n_src``), then the destination factor in place."""
    w = None if norm[0] is None else st.src_edge_norm("out", norm[0], t.dtype).unsqueeze(1)
    out = st.aggregate(t.unsqueeze(1), w).view(st.num_dst, t.shape[1])
    del w
    return _scale_dst(out, st, norm)


def _aggregate_back(st, g: torch.Tensor, norm: tuple, owned: bool = False) -> torch.Tensor:
    """The transpose of :func:`_aggregate` applied to ``g`` (``[N_dst, D]``; ``owned``: the caller's own
    buffer, scaled in place; else a scaled copy is made where the normalisation has a destination factor)."""
    if norm[1] is not None:
        g = _scale_dst(g if owned else g.clone(memory_format=torch.contiguous_format), st, norm)
    else:
        g = g.contiguous()
    out = st.aggregate(g.unsqueeze(1), transpose=True).view(st.num_src, g.shape[1])
    return _scale_src(out, st, norm)


def column_chunks(n_rows: int, width: int, device) -> int:
    """Columns per chunk of the backward's transposed aggregations: the whole width where a layer-sized
    buffer is not chunked on ``device`` (a GPU at arxiv size: one sparse product, fewer launches), else
    :data:`COLUMN_CHUNK`. Depends on the graph's size only through that test, so a planner's sample graphs
    run the same operators as the full graph."""
    return width if n_rows * width <= chunk_elements_for(device) else min(width, COLUMN_CHUNK)


def aggregate_then_project(x: torch.Tensor, w_neigh: torch.Tensor, st, cfg: CompressionConfig, keep_s: bool,
                           norm: tuple = MEAN):
    """``(s W_neigh^T, kept s)`` with ``s = mean_{u -> v} x[u]`` (``[N_dst, D_in]``; ``norm``: another
    normalisation of the sum, :data:`MEAN`'s form), kept compressed where
    ``keep_s`` (``W_neigh``'s gradient reads it), the product written into ``s``'s own rows where ``W_neigh``
    is square and ``s`` is not kept by reference (rule 2): one ``[N_dst, D]`` buffer at a time."""
    n, d_in = st.num_dst, x.shape[1]
    cd = w_neigh.dtype
    s = _aggregate(st, x, norm)
    kept_s = as_kept(s, cfg, force=True) if keep_s else None
    # overwrite s only where backward does not read it (kept compressed, or not kept at all)
    owned = kept_s is None or isinstance(kept_s, CompressedTensor)
    rows = chunk_rows(n, d_in, s.device)
    if owned and s.dtype == cd and w_neigh.shape[0] == d_in and needs_chunks(s):
        for r0 in range(0, n, rows):
            part = s[r0:r0 + rows]
            part.copy_(part.matmul(w_neigh.t()))
        return s, kept_s
    if s.dtype != cd:  # cast row chunk by row chunk: no full-size cast copy of s
        out = s.new_empty((n, w_neigh.shape[0]), dtype=cd)
        for r0 in range(0, n, rows):
            torch.matmul(s[r0:r0 + rows].to(cd), w_neigh.t(), out=out[r0:r0 + rows])
        return out, kept_s
    return s.matmul(w_neigh.t()), kept_s


class SAGEMean(Function):
    """``apply(x, w_self, b_self, w_neigh, st, cfg, norm, b_neigh)``: :func:`sage_mean`'s op on a structure
    ``st``, ``x_dst W_self^T + b_self + mean_{u -> v}(x[u]) W_neigh^T (+ b_neigh)``, the mean or another
    normalisation of the sum (``norm``, :data:`MEAN`'s form: :func:`graph_conv_plus_linear`); keeps ``x``
    compressed under ``cfg``."""

    @staticmethod
    def forward(ctx, x, w_self, b_self, w_neigh, st, cfg: CompressionConfig, norm: tuple = MEAN, b_neigh=None):
        # Under autocast the weights arrive cast (``cd``, e.g. bf16) and ``x`` as it was: the products run in
        # ``cd`` and the aggregation of ``x`` in ``x``'s dtype, as the composed ops under autocast run them.
        # a block: the destination nodes are the first ``n`` source nodes (DGL's layout), ``x_dst = x[:n]``
        n_src, d_in = x.shape
        n = st.num_dst
        x_dst = x[:n] if st.is_block else x
        cd = w_neigh.dtype
        ctx.lin_first = w_neigh.shape[0] < d_in  # DGL's order: project before aggregating when that narrows
        ctx.x_dtype = x.dtype
        kept_s = None
        xc = None
        if ctx.lin_first:
            # a cast copy of x (autocast) is made for each product and dropped before the aggregation
            t = x.matmul(w_neigh.t()) if x.dtype == cd else x.to(cd).matmul(w_neigh.t())
            out = _aggregate(st, t, norm)
            del t
            xc = x_dst if x.dtype == cd else x_dst.to(cd)
        else:
            out, kept_s = aggregate_then_project(x, w_neigh, st, cfg, keep_s=ctx.needs_input_grad[3], norm=norm)
            xc = x_dst if x.dtype == cd else x_dst.to(cd)
        out.addmm_(xc, w_self.t())
        del xc
        if b_neigh is not None:  # (GraphConv's bias: after its normalisation, before the residual's)
            out.add_(b_neigh)
        if b_self is not None:
            out.add_(b_self)
        # x serves both weight gradients when the projection came first (dW_neigh = (A_mean^T g)^T x)
        # (on a block only W_self's gradient reads x, then only its destination rows are kept: a view made in
        # this forward has no autograd history, so it is compressed (force) unless x itself is alive anyway
        # (rule 1); kept by reference, the view would hold all of x's rows)
        needs_x = ctx.needs_input_grad[1] or (ctx.lin_first and ctx.needs_input_grad[3])
        if not needs_x:
            kept_x = None
        elif ctx.lin_first or x_dst is x:
            kept_x = as_kept(x, cfg)
        else:
            kept_x = as_kept(x_dst, cfg, force=not alive_anyway(x))
        ctx.st, ctx.has_bias, ctx.n_src, ctx.norm = st, b_self is not None, n_src, norm
        ctx.has_bias_neigh = b_neigh is not None
        save_kept(ctx, kept_x, kept_s, w_self if ctx.needs_input_grad[0] else None,
             w_neigh if ctx.needs_input_grad[0] else None)
        return out

    @staticmethod
    def backward(ctx, grad):
        x_s, s_s, w_self, w_neigh = load_kept(ctx)
        # the aggregations below are not differentiable torch ops (a second-order gradient would miss their
        # terms silently): refused even where every kept tensor is exact
        refuse_double_backward("sage_mean")
        st = ctx.st
        grad = grad.contiguous()
        n, n_src, xd = grad.shape[0], ctx.n_src, ctx.x_dtype
        gx = gws = gb = gwn = gbn = None
        norm = ctx.norm
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = grad.sum(0)
        if ctx.has_bias_neigh and ctx.needs_input_grad[7]:
            gbn = grad.sum(0)
        if ctx.lin_first:
            # m = A_mean^T g: [N, D_out], narrower than the input; both weight gradients from one pass over x
            m = None
            if ctx.needs_input_grad[0] or ctx.needs_input_grad[3]:
                d_out = grad.shape[1]
                width = column_chunks(n_src, d_out, grad.device)
                if width >= d_out:
                    m = _aggregate_back(st, grad, norm)
                else:  # column chunks: the scaled gradient and the kernel's buffers exist a chunk at a time
                    m = grad.new_empty((n_src, d_out))
                    for c0 in range(0, d_out, width):
                        c1 = min(d_out, c0 + width)
                        m[:, c0:c1] = _aggregate_back(st, grad[:, c0:c1], norm)
            if ctx.needs_input_grad[1] or ctx.needs_input_grad[3]:
                for r0, r1, x in row_chunks(x_s):
                    x = x.to(grad.dtype)
                    if ctx.needs_input_grad[1] and r0 < n:  # W_self: the destination rows only
                        part = grad[r0:min(r1, n)].t().matmul(x[:min(r1, n) - r0])
                        gws = part if gws is None else gws.add_(part)
                    if ctx.needs_input_grad[3]:
                        part = m[r0:r1].t().matmul(x)
                        gwn = part if gwn is None else gwn.add_(part)
                    del x  # before the next chunk is decoded (see row_chunks)
            if ctx.needs_input_grad[0] and n_src != n:  # a block: W_self's term on the destination rows only
                gx = m.matmul(w_neigh.to(grad.dtype)).to(xd)
                gx[:n].add_(grad.matmul(w_self.to(grad.dtype)).to(xd))
            elif ctx.needs_input_grad[0]:
                gx = grad.matmul(w_self.to(grad.dtype))
                if gx.dtype == xd:
                    gx.addmm_(m, w_neigh.to(grad.dtype))
                else:  # autocast: each product cast back to x's dtype, as the composed ops' casts do
                    gx = gx.to(xd).add_(m.matmul(w_neigh.to(grad.dtype)))
            return gx, gws, gb, gwn, None, None, None, gbn
        if ctx.needs_input_grad[1]:
            gws = weight_grad(grad, x_s)
        if ctx.needs_input_grad[3]:
            gwn = weight_grad(grad, s_s)
        if ctx.needs_input_grad[0]:
            w_self, w_neigh = w_self.to(grad.dtype), w_neigh.to(grad.dtype)
            block = n_src != n
            d_in = w_self.shape[1]
            # a block: one [N_src, D_in] buffer, the aggregation's gradient, W_self's term added to its
            # destination rows afterwards
            width = column_chunks(n_src, d_in, grad.device)
            if not block:
                gx = grad.matmul(w_self).to(xd)
            elif width < d_in:
                gx = grad.new_empty((n_src, d_in), dtype=xd)
            for c0 in range(0, d_in, width):
                c1 = min(d_in, c0 + width)
                part = _aggregate_back(st, grad.matmul(w_neigh[:, c0:c1]).to(xd), norm, owned=True)
                if block and width >= d_in:
                    gx = part  # the kernel's fresh buffer is the input gradient
                elif block:
                    gx[:, c0:c1] = part
                else:
                    gx[:, c0:c1].add_(part)
                del part
            if block:
                gx[:n].add_(grad.matmul(w_self).to(xd))
        return gx, gws, gb, gwn, None, None, None, gbn


@fresh_outputs
def sage_mean(g, x: torch.Tensor, w_self: torch.Tensor, b_self: Optional[torch.Tensor], w_neigh: torch.Tensor,
              config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """GraphSAGE-mean on a homogeneous graph or a block: ``x_dst W_self^T + b_self + mean_{u -> v}(x[u])
    W_neigh^T``, with ``x [N_src, D_in]`` (``x_dst``: its first ``N_dst`` rows, all of them on a homogeneous graph),
    ``w_self, w_neigh [D_out, D_in]``; the activations kept compressed under ``config``."""
    st = structure_of(g, x.device)
    if x.dim() >= 1:
        check_nodes(st, x)
    if (not st.is_block and st.num_src != st.num_dst) or x.dim() != 2 or x.shape[0] != st.num_src:
        raise ValueError(f"sage_mean needs a homogeneous graph or a block and [N, D] features with one row per "
                         f"(source) node; got features {tuple(x.shape)} on a graph of {st.num_src} source / "
                         f"{st.num_dst} destination nodes")
    cfg = resolve_config(config)
    dtype = autocast_dtype(x.device.type)
    if dtype is None:
        return SAGEMean.apply(x, w_self, b_self, w_neigh, st, cfg, MEAN, None)
    # autocast: the weights cast as the composed linears cast them (their gradients flow back through the
    # casts); x stays as it is, kept as it is, and is cast inside (no cast copy kept)
    with torch.autocast(x.device.type, enabled=False):
        return SAGEMean.apply(x, w_self.to(dtype), None if b_self is None else b_self.to(dtype),
                               w_neigh.to(dtype), st, cfg, MEAN, None)


@fresh_outputs
def graph_conv_plus_linear(g, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                           lin_weight: torch.Tensor, lin_bias: Optional[torch.Tensor], norm: str = "both",
                           config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """GraphConv with a linear residual as one op: ``n_dst A (n_src x) W + b + x W_lin^T + b_lin`` on a
    homogeneous graph, ``x [N, D_in]``, ``weight [D_in, D_out]`` and ``bias`` as :class:`dgl.nn.GraphConv` holds
    them, ``lin_weight [D_out, D_in]`` and ``lin_bias`` as :class:`torch.nn.Linear` holds them, ``norm`` as
    GraphConv's (``n_src``, ``n_dst``: its degree factors). What ``conv(g, x) + linear(x)`` computes, up to
    float summation order, with one layer-sized buffer fewer in each pass and ``x`` kept once, compressed
    under ``config`` (:mod:`dgl_exact.ops.sage`). In a model, :func:`dgl_exact.nn.conv_plus_linear` calls it
    where the modules allow it."""
    st = structure_of(g, x.device)
    check_nodes(st, x)
    if st.is_block or st.num_src != st.num_dst or x.dim() != 2:
        raise ValueError(f"graph_conv_plus_linear needs a homogeneous graph and [N, D] features; got features "
                         f"{tuple(x.shape)} on a graph of {st.num_src} source / {st.num_dst} destination nodes")
    if norm not in ("both", "left", "right", "none"):
        raise ValueError(f"graph_conv_plus_linear: norm is 'both', 'left', 'right' or 'none', got {norm!r}")
    if weight.shape != (x.shape[1], lin_weight.shape[0]) or lin_weight.shape[1] != x.shape[1]:
        raise ValueError(f"graph_conv_plus_linear: weight {tuple(weight.shape)} ([D_in, D_out]) and lin_weight "
                         f"{tuple(lin_weight.shape)} ([D_out, D_in]) do not fit features of width {x.shape[1]}")
    cfg = resolve_config(config)
    dtype = autocast_dtype(x.device.type)
    if dtype is None:
        return SAGEMean.apply(x, lin_weight, lin_bias, weight.t(), st, cfg, gcn_norm(norm), bias)
    with torch.autocast(x.device.type, enabled=False):
        return SAGEMean.apply(x, lin_weight.to(dtype), None if lin_bias is None else lin_bias.to(dtype),
                               weight.t().to(dtype), st, cfg, gcn_norm(norm), None if bias is None else bias.to(dtype))


@captured.capturable
class DivideByInDegrees(Function):
    """``x / max(in_degree, 1)`` per destination row, keeping nothing (the degrees come from the structure
    again in backward; a plain division would keep the degree vector)."""

    @staticmethod
    def forward(ctx, x, st):
        ctx.st = st
        return x / _in_degrees(st, x)

    @staticmethod
    def backward(ctx, grad):
        return grad / _in_degrees(ctx.st, grad), None  # differentiable in grad: double backward exact


def _in_degrees(st, like):
    return st.in_degrees().clamp(min=1).to(like.dtype).view(-1, *([1] * (like.dim() - 1)))


def divide_by_in_degrees(x: torch.Tensor, st) -> torch.Tensor:
    """copy_u_mean's values as sum then division (SAGEConv's composed 'mean' aggregation): in backward the
    division's output gradient dies before the aggregation backward allocates (one layer-sized buffer fewer
    at the peak than copy_u_mean). Keeps nothing; where nothing needs saving the result is marked fresh
    (the next linear may compress it in place)."""
    if needs_saving(x):
        return captured.apply("DivideByInDegrees", x, st)
    return mark_fresh(x / _in_degrees(st, x))
