import pytest
import torch

pyg_nn = pytest.importorskip("torch_geometric.nn", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")

import dgl_exact.pyg as ours_nn  # noqa: E402
from tests.pyg._helpers import INT2, OFF, copy_of, linear_weight_sd, assert_unbiased  # noqa: E402


@pytest.mark.parametrize("kwargs", [{}, dict(bias=False), dict(weight_initializer="glorot", bias_initializer="zeros")],
                         ids=["default", "nobias", "glorot"])
def test_same_output_state_dict_and_gradients_off(kwargs):
    theirs = pyg_nn.Linear(12, 5, **kwargs)
    ours = copy_of(ours_nn.Linear, theirs, 12, 5, compression=OFF, **kwargs)
    x = torch.randn(20, 12).relu().requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    y1, y2 = theirs(x * 1.0), ours(x2 * 1.0)
    torch.testing.assert_close(y2, y1, rtol=0, atol=0)
    g = torch.randn_like(y1)
    y1.backward(g)
    y2.backward(g)
    for p, q in zip(theirs.parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad)
    torch.testing.assert_close(x2.grad, x.grad)


def test_lazy_initialisation_as_pyg():
    torch.manual_seed(0)
    theirs = pyg_nn.Linear(-1, 4)
    torch.manual_seed(0)
    ours = ours_nn.Linear(-1, 4, compression=INT2)
    x = torch.randn(6, 7)
    torch.manual_seed(1)
    y1 = theirs(x)
    torch.manual_seed(1)
    y2 = ours(x)
    assert ours.in_channels == 7 and ours.weight.shape == (4, 7)
    torch.testing.assert_close(y2, y1)


def test_weight_gradient_unbiased_int2():
    theirs = pyg_nn.Linear(16, 8)
    ours = copy_of(ours_nn.Linear, theirs, 16, 8, compression=INT2)
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(3)).requires_grad_()
    g = torch.randn(64, 8, generator=torch.Generator().manual_seed(4))
    theirs(x * 1.0).backward(g)
    exact = theirs.weight.grad.clone()

    def draw():
        ours.weight.grad = None
        ours(x * 1.0).backward(g)  # x * 1.0: an activation (it has a grad_fn), so it is kept compressed
        return ours.weight.grad.clone()

    assert_unbiased(draw, exact, linear_weight_sd(g, x.detach(), 2), n=200)


def test_convert_in_place():
    module = pyg_nn.Linear(4, 3)
    assert ours_nn.refusal(module) is None
    assert ours_nn.convert(module) is module and type(module) is ours_nn.Linear
