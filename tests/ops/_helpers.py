"""Helpers shared by the op tests: configurations, graph kinds, float64 features and edge values, and scopes
that record what the ops keep (``saved_tensors``) and compress (``compress_calls``)."""
from __future__ import annotations

import contextlib
import math

import torch

import dgl_exact
from dgl_exact import CompressionConfig

OFF = CompressionConfig(enabled=False)
INT8 = CompressionConfig(bits=8)
INT2 = CompressionConfig(bits=2)


KINDS = ["graph", "zero_in", "block", "graph-int32", "zero_in-int32", "block-int32"]


def _dgl_graph(graphs, kind):
    """The graph DGL's reference ops run on: the int64 original of an ``-int32`` kind (the same edge ids;
    DGL's own SDDMM backward cannot read a graph restricted to CSC and CSR)."""
    return graphs[kind.removesuffix("-int32")]


@contextlib.contextmanager
def saved_tensors():
    """The tensors autograd saves for backward inside the scope."""
    items = []

    def pack(t):
        items.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield items


@contextlib.contextmanager
def compress_calls(monkeypatch):
    """Every compression the ops perform inside the scope (the CompressedTensors they keep)."""
    from dgl_exact.ops import keep as keeping

    made = []
    real = keeping.compress

    def recording(x, cfg):
        c = real(x, cfg)
        made.append(c)
        return c

    monkeypatch.setattr(keeping, "compress", recording)
    yield made
    monkeypatch.setattr(keeping, "compress", real)


def largest_tensor_made(fn):
    """``(fn(), n)``: ``n`` the most elements of any tensor an aten op returns while ``fn`` runs (autograd's
    backward included, which runs on this thread for CPU tensors)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    sizes = [0]

    class Sizes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            sizes.extend(t.numel() for t in (out if isinstance(out, (tuple, list)) else [out])
                         if isinstance(t, torch.Tensor))
            return out

    with Sizes():
        result = fn()
    return result, max(sizes)


def close(a, b, what="", rtol=1e-10, atol=1e-10):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def hidden(x):
    """``x`` as the output of an earlier op (has a grad_fn): not alive anyway, so an op compresses it."""
    return x * 1.0


# ---------------------------------------------------------------------------------------------------
# graph ops vs DGL (float64)
# ---------------------------------------------------------------------------------------------------
def _feat(n, shape, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((n,) + shape, generator=gen, dtype=dtype).requires_grad_()


def _edge_values(g, wshape, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand((g.num_edges(),) + wshape, generator=gen, dtype=torch.float64) + 0.5).requires_grad_()


def _cfg(**kw):
    return dgl_exact.CompressionConfig(**{"bits": 2, **kw})


CONFIGS = {
    "int2": _cfg(),
    "int2-blocks64-optimal": _cfg(block_rows=64, levels="optimal"),
    "int4-blocks3": _cfg(bits=4, block_rows=3),
    "int1-odd-width": _cfg(bits=1),
    "int2-rp-blocks64": _cfg(kept_frac=0.125, block_rows=64, levels="optimal"),
    "int8": _cfg(bits=8),
    "off-rp": dgl_exact.CompressionConfig(enabled=False, kept_frac=0.5),
}


def small_chunks_of(monkeypatch, module) -> None:
    """Row chunks of 5 rows of 7 columns and ``module``'s column chunks of 3 (CPU policy): tiny layers cross
    chunk boundaries."""
    from dgl_exact.ops import chunks

    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 5 * 7)
    monkeypatch.setattr(module, "COLUMN_CHUNK", 3)


def spy_apply(monkeypatch, function) -> list:
    """The argument tuples of every call of ``function.apply`` (an autograd Function) for the rest of the test."""
    calls = []
    real = function.apply
    monkeypatch.setattr(function, "apply", lambda *a: calls.append(a) or real(*a))
    return calls


def assert_mean_converges(draws, exact, floor: float = 0.0, mean_square=2.0):
    """The mean of the ``draws`` (independent compressions) is the ``exact`` gradient: each element's t statistic
    within the Student t bound (two-sided, 1e-3 over all elements: Bonferroni, valid for dependent elements too),
    and, unless ``mean_square`` is None, a mean squared t of at most ``mean_square`` (about 1 for an unbiased
    estimate of independent elements). ``floor``: deviations up to ``floor`` times the largest exact value count
    as rounding, not bias."""
    from scipy import stats

    runs, k = torch.stack(draws), len(draws)
    dev = ((runs.mean(0) - exact).abs() - floor * float(exact.abs().max())).clamp(min=0)
    t = dev / (runs.std(0) / math.sqrt(k))
    bound = stats.t.ppf(1 - 1e-3 / (2 * t.numel()), k - 1)
    assert float(t.max()) <= bound, t
    if mean_square is not None:
        assert float((t ** 2).mean()) <= mean_square, t


def kept_item(t, index=0):
    """What the autograd node that made ``t`` (a custom Function's, through a view) keeps, item ``index``."""
    from dgl_exact.ops.saved import load_kept

    node = t.grad_fn
    while not hasattr(node, "kept_layout"):
        node = node.next_functions[0][0]
    return load_kept(node)[index]
