"""Donation (``ops.donation``, ownership rule 5): a donated tensor computes as a plain one until the op it was
handed to releases it; one that was not released is taken back as it was."""
import pytest
import torch

from dgl_exact.ops.donation import Donated, Released, donate, reclaim, release


def test_reclaim_takes_back_a_donated_tensor_that_was_not_released():
    t = torch.randn(3, 2) * 1.0
    values = t.clone()
    assert type(donate(t)) is Donated
    assert reclaim(t) is t and type(t) is torch.Tensor and torch.equal(t, values)
    plain = torch.ones(2)
    assert reclaim(plain) is plain and type(plain) is torch.Tensor
    gone = donate(torch.randn(4) * 1.0)
    assert release(gone) and type(gone) is Released
    with pytest.raises(RuntimeError, match="released"):
        reclaim(gone)
