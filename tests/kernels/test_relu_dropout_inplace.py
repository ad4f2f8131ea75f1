"""``relu_dropout_inplace`` on every backend that implements it, against the out-of-place torch reference
``relu_dropout``: the tensor written in place holds the same values bit for bit, the mask the same bits."""
from __future__ import annotations

import os

import pytest
import torch

from dgl_exact import kernels
from dgl_exact.kernels import reference as R
from dgl_exact.kernels.spec import OPS

from tests.kernels._helpers import SEED, assert_same

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
CASES = [((1,), torch.float32, 0.5), ((13,), torch.float32, 0.0), ((6, 9), torch.float32, 0.3),
         ((37, 5), torch.bfloat16, 0.5), ((4, 2, 8), torch.float16, 0.25), ((7, 3), torch.float64, 0.5),
         ((1100, 500), torch.float32, 0.5)]  # the last: the numba CPU kernel splits it across threads


def _ops(kind):
    if kind == "torch":
        return R
    pytest.importorskip("numba")
    from dgl_exact.kernels import numba_kernels as NC

    if kind == "sim" and not SIMULATOR:
        pytest.skip("NUMBA_ENABLE_CUDASIM is not set (a GPU is present): the simulator tests do not apply")
    if kind == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    return NC.get_ops({"sim": "simulator"}.get(kind, kind))


def _input(shape, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float32)
    x.view(-1)[:3] = torch.tensor([0.0, -0.0, 1e-30])[: x.numel()]  # zeros of both signs: masked off
    return x.to(dtype).to(device)


@pytest.mark.parametrize("kind", ["torch", "cpu", "sim", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_in_place_equals_out_of_place_reference(kind):
    ops = _ops(kind)
    device = "cuda" if kind == "cuda" else "cpu"
    for shape, dtype, p in CASES:
        if kind == "sim" and max(shape) > 40:
            continue
        x = _input(shape, dtype, device)
        want_y, want_mask = R.relu_dropout(x.clone(), p, SEED)
        storage = x.untyped_storage().data_ptr()
        mask = ops.relu_dropout_inplace(x, p, SEED)
        assert x.untyped_storage().data_ptr() == storage  # written where it was
        assert torch.equal(mask, want_mask), (kind, shape, dtype, p)
        assert_same(x, want_y, exact=kind != "cuda")


def test_registry_serves_it_on_the_cpu_and_the_extension_says_why_not():
    x = _input((33, 4), torch.float32, "cpu", seed=1)
    want_y, want_mask = R.relu_dropout(x.clone(), 0.5, SEED)
    assert torch.equal(kernels.get("relu_dropout_inplace", "cpu")(x, 0.5, SEED), want_mask)
    assert torch.equal(x, want_y)
    assert isinstance(OPS["relu_dropout_inplace"].backends["ext"], str)


@pytest.mark.parametrize("kind", ["torch", "cpu"])
def test_refuses_a_non_contiguous_tensor(kind):
    ops = _ops(kind)
    with pytest.raises(ValueError, match="contiguous"):
        ops.relu_dropout_inplace(torch.randn(4, 6).t(), 0.5, SEED)
