"""The losses (dgl_exact.ops.loss): ``ops.cross_entropy`` and ``ops.binary_cross_entropy_with_logits`` against
torch's, their gradients exact with compression disabled."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dgl_exact import ops
from tests.ops._helpers import close, saved_tensors

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------
# losses
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["plain", "index", "weight", "index+weight"])
def test_cross_entropy(variant):
    torch.manual_seed(0)
    logits = torch.randn(30, 4, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([0, 3, 5, 8, 9, 20, 29]) if "index" in variant else None
    n = 30 if index is None else len(index)
    target = torch.randint(0, 4, (n,))
    weight = torch.rand(n, dtype=torch.float64) if "weight" in variant else None
    z = logits if index is None else logits[index]
    per_row = F.cross_entropy(z, target, reduction="none")
    ref = (per_row * weight).sum() if weight is not None else per_row.mean()
    out = ops.cross_entropy(logits, target, index, weight)
    close(out, ref, "cross_entropy")
    close(torch.autograd.grad(out, logits)[0], torch.autograd.grad(ref, logits)[0], "cross_entropy grad")
    assert torch.autograd.gradcheck(lambda z: ops.cross_entropy(z, target, index, weight), (logits,))
    with torch.no_grad():
        close(ops.cross_entropy(logits, target, index, weight), ref.detach(), "no_grad")
    # keeps no activation: only the logits (alive anyway) and the integer/weight inputs
    with saved_tensors() as kept:
        ops.cross_entropy(logits, target, index, weight)
    assert {t.data_ptr() for t in kept} <= {t.data_ptr() for t in (logits, target, index, weight) if t is not None}
    with pytest.raises(TypeError, match="integer"):
        ops.cross_entropy(logits, target.double(), index, weight)


@pytest.mark.parametrize("variant", ["plain", "index", "weight", "index+weight"])
def test_binary_cross_entropy_with_logits(variant):
    torch.manual_seed(1)
    logits = torch.randn(30, 5, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([1, 2, 7, 11, 29]) if "index" in variant else None
    n = 30 if index is None else len(index)
    target = (torch.rand(n, 5) > 0.5).to(torch.float64)
    weight = torch.rand(n, dtype=torch.float64) if "weight" in variant else None
    z = logits if index is None else logits[index]
    per_row = F.binary_cross_entropy_with_logits(z, target, reduction="none").mean(-1)
    ref = (per_row * weight).sum() if weight is not None else per_row.mean()
    out = ops.binary_cross_entropy_with_logits(logits, target, index, weight)
    close(out, ref, "bce")
    close(torch.autograd.grad(out, logits)[0], torch.autograd.grad(ref, logits)[0], "bce grad")
    assert torch.autograd.gradcheck(lambda z: ops.binary_cross_entropy_with_logits(z, target, index, weight),
                                    (logits,))
    with saved_tensors() as kept:
        ops.binary_cross_entropy_with_logits(logits, target, index, weight)
    assert {t.data_ptr() for t in kept} <= {t.data_ptr() for t in (logits, target, index, weight) if t is not None}
