"""Random projection without quantisation (EXACT's ``--act_fp --kept_frac``): ``CompressionConfig(enabled=False,
kept_frac<1)`` keeps the projected activation unquantised in its own dtype; it used to be dropped silently
(the full tensor was kept)."""
from __future__ import annotations

import pytest
import torch

import dgl_exact
from dgl_exact import CompressionConfig, ops
from dgl_exact.compression import compress, decompress
from dgl_exact.compression.projection import rademacher
from dgl_exact.memory import measure
from dgl_exact.ops.keep import as_kept

FP_PROJ = CompressionConfig(enabled=False, kept_frac=0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 7), (33, 16), (5, 3, 4)])
def test_projected_unquantised_round_trip(dtype, shape):
    """Stored: ``X R`` ([N, ceil(k D)], x's dtype); decoded: ``X R R^T`` in x's dtype and shape."""
    torch.manual_seed(0)
    x = torch.randn(*shape).to(dtype)
    c = compress(x, FP_PROJ, seed=3)
    rows = x.reshape(shape[0], -1).float()
    d = rows.shape[1]
    k = FP_PROJ.projected_width(d)
    assert c.proj_seed is not None and c.packed is None and c.raw.dtype == dtype
    assert tuple(c.raw.shape) == (shape[0], k) and c.nbytes == shape[0] * k * x.element_size()
    r = rademacher(d, k, c.proj_seed, x.device)
    torch.testing.assert_close(c.raw.float(), (rows @ r).to(dtype).float())
    out = decompress(c)
    assert out.shape == x.shape and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float().reshape(shape[0], -1), c.raw.float() @ r.t(), rtol=tol, atol=tol)


@pytest.mark.slow
def test_projected_unquantised_is_unbiased():
    """E[X R R^T] = X over fresh projections."""
    torch.manual_seed(0)
    x = torch.randn(4, 32)
    mean = sum(decompress(compress(x, FP_PROJ, seed=s)) for s in range(800)) / 800
    assert (mean - x).abs().max() < 0.25  # one draw's error has std ~1 per entry: ~0.035 for the mean


def test_no_projection_keeps_the_tensor_itself():
    x = torch.randn(10, 8)
    c = compress(x, CompressionConfig(enabled=False))
    assert c.raw.data_ptr() == x.data_ptr() and c.proj_seed is None and decompress(c).data_ptr() == x.data_ptr()
    assert compress(x, CompressionConfig(enabled=False, kept_frac=0.9)).raw.shape == (10, 8)  # ceil(7.2) = 8: none


def test_keep_projects_activations_not_leaves():
    leaf = torch.randn(20, 16)
    act = torch.randn(20, 16, requires_grad=True) * 2
    assert as_kept(leaf, FP_PROJ) is leaf  # alive anyway: a projected copy would add memory
    kept = as_kept(act, FP_PROJ)
    assert kept.raw.shape == (20, 8) and kept.proj_seed is not None


def test_model_keeps_less_with_fp_projection():
    """A 3-layer SAGE: projection without quantisation keeps less than plain fp (it used to keep the same),
    and trains (finite gradients)."""
    dgl = pytest.importorskip("dgl", reason="a DGL model (the no-DGL CI job runs without DGL)")
    from dgl_exact.training.models import build_model

    torch.manual_seed(0)
    g = dgl.rand_graph(500, 4000)
    x, y = torch.randn(500, 32), torch.randint(0, 4, (500,))
    model = build_model("sage", 32, 4, hidden=64, layers=3, impl="exact")
    got = {}
    for name, cfg in (("fp", CompressionConfig(enabled=False)), ("fp+rp", FP_PROJ)):
        with dgl_exact.config(cfg):
            report = measure(lambda: ops.cross_entropy(model(g, x), y), modules=[model], exclude=[x])
        report.result.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())
        model.zero_grad()
        got[name] = report.activation_bytes
    assert got["fp+rp"] < 0.85 * got["fp"], got


def test_train_config_act_fp_keeps_the_projection():
    """``--act-fp --kept-frac 0.5`` (TrainConfig) gives a disabled-quantisation config that still projects."""
    pytest.importorskip("dgl", reason="TrainConfig (the DGL front end; the no-DGL CI job runs without DGL)")
    from dgl_exact.training.config import TrainConfig

    cfg = TrainConfig(act_fp=True, kept_frac=0.5).compression
    assert not cfg.enabled and cfg.kept_frac == 0.5
    assert "kf=0.5" in cfg.describe() and "unquantised" in cfg.describe()
    assert CompressionConfig(enabled=False).describe() == "fp (uncompressed)"
