"""The one torch-function mode of dgl_exact/ops/torch_routes.py: both routing scopes (functional activations,
compressed products) share it and its table; each keeps its own switch and rules."""
from __future__ import annotations

import contextvars

import pytest
import torch
import torch.nn.functional as F

import dgl_exact
from dgl_exact.ops import products
from dgl_exact.ops.functional import functional_ops
from dgl_exact.ops.products import compressed_products
from dgl_exact.ops.torch_routes import ROUTES, route
from tests.ops._helpers import INT2


def _modes() -> int:
    return torch._C._len_torch_function_stack()


def test_one_mode_for_both_scopes_pushed_by_the_outermost():
    before = _modes()
    with compressed_products():
        assert _modes() == before + 1
        with functional_ops(), compressed_products():
            assert _modes() == before + 1
    assert _modes() == before
    with functional_ops(False), compressed_products(False):
        assert _modes() == before  # nothing enabled: nothing pushed


def test_each_scope_switches_only_its_own_calls():
    x = torch.randn(16, 8, requires_grad=True)
    p = torch.nn.Parameter(torch.randn(1, 8))
    with dgl_exact.config(INT2), functional_ops(), compressed_products(False):
        h = x * 1.0
        assert type(F.relu(h).grad_fn).__name__ == "_ReLUDropoutBackward"
        assert type((h * p).grad_fn).__name__ == "MulBackward0"
    with dgl_exact.config(INT2), compressed_products(), functional_ops(False):
        h = x * 1.0
        assert type(F.relu(h).grad_fn).__name__ == "ReluBackward0"
        assert type((h * p).grad_fn).__name__ == "ProductBackward"


def test_products_are_not_taken_while_dynamo_traces_functional_calls_are(monkeypatch):
    x = torch.randn(16, 8, requires_grad=True)
    p = torch.nn.Parameter(torch.randn(1, 8))
    with dgl_exact.config(INT2), functional_ops(), compressed_products():
        monkeypatch.setattr(products, "compiling", lambda: True)
        h = x * 1.0
        assert type((h * p).grad_fn).__name__ == "MulBackward0"
        assert type(F.relu(h).grad_fn).__name__ == "_ReLUDropoutBackward"
        monkeypatch.undo()
        assert type((h * p).grad_fn).__name__ == "ProductBackward"


def test_a_callable_has_one_owner():
    other = contextvars.ContextVar("other_scope", default=False)
    before = dict(ROUTES)
    with pytest.raises(ValueError, match="routed by the scope of dgl_exact_functional_ops"):
        route(other, {torch.tanh: lambda args, kwargs: None, F.relu: lambda args, kwargs: None})
    assert ROUTES == before  # nothing of a refused declaration is kept
