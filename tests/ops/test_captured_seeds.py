"""dgl_exact.ops.captured, seeds: a compiled step keeps and compresses what the eager step does, drawing the same
seeds in the same order (so the same compression noise), and every step draws new ones.

The conv here is a first layer on input features (no autograd history) whose input width is at most its
output width: GraphConv aggregates first and its linear keeps the aggregation, a temporary without autograd
history. Eager execution compresses it (rule 1: an op's fresh output); while compiling, provenance is not
tracked and the caller's statement (``ops.linear_reusing``) is what makes it compressed. ``aot_eager``: the
captured ops and AOT autograd without code generation (seconds)."""
from __future__ import annotations

import pytest
import torch

import dgl_exact
from dgl_exact.ops import captured

dgl = dgl_exact._compat.import_dgl()

pytestmark = pytest.mark.skipif(not captured.SUPPORTED or not hasattr(torch, "compile"),
                                reason=f"torch.compile of dgl_exact needs torch >= 2.4; this is {torch.__version__}")

N, IN, OUT = 40, 4, 16


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _graph():
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, N, (160,), generator=gen), torch.randint(0, N, (160,), generator=gen)
    return dgl.add_self_loop(dgl.graph((src, dst), num_nodes=N))


def _steps(model, g, x, n=2):
    """``n`` forward/backward steps from ``torch.manual_seed(5)``: per step the weight gradient and the
    default generator's state after it (which says how many seeds the step drew)."""
    torch.manual_seed(5)
    weight = (model._orig_mod if hasattr(model, "_orig_mod") else model).weight
    out = []
    for _ in range(n):
        weight.grad = None
        y = model(g, x)
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        out.append((weight.grad.clone(), torch.get_rng_state()))
    return out


@pytest.mark.slow  # one aot_eager compile, about 35 s on 2 cores
def test_compiled_first_layer_compresses_like_eager():
    g, x = _graph(), torch.randn(N, IN)  # input features: no autograd history
    torch.manual_seed(1)
    model = dgl_exact.GraphConv(IN, OUT)  # IN <= OUT: aggregate, then the linear keeps the aggregation
    model.compression = dgl_exact.CompressionConfig(bits=2)
    model.train()
    eager = _steps(model, g, x)
    compiled = _steps(torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=False), g, x)
    model.compression = dgl_exact.CompressionConfig(enabled=False)
    (exact, _), = _steps(model, g, x, n=1)
    for (ge, se), (gc, sc) in zip(eager, compiled):
        assert torch.equal(sc, se), "the compiled step drew a different number of seeds than the eager step"
        torch.testing.assert_close(gc, ge, rtol=1e-5, atol=1e-6)  # the same compression noise
        assert not torch.allclose(gc, exact, rtol=1e-4, atol=1e-5), "the aggregation was kept exactly"
    # each step draws its own seeds: the noise of step 2 is not step 1's again
    assert not torch.allclose(compiled[0][0], compiled[1][0], rtol=1e-4, atol=1e-5)
