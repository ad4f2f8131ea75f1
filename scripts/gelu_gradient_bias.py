"""Bias of the compressed GELU gradient at INT2: the mean of R backward passes against the exact gradient, for
the estimator that keeps the input and evaluates gelu' at its decoded copy (dgl_exact before 7350500) and for
the one that keeps the derivative gelu'(x) compressed (dgl_exact since).

    python scripts/gelu_gradient_bias.py
"""
import torch
import torch.nn.functional as F

import dgl_exact
from dgl_exact.compression import compress, decompress
torch.manual_seed(0)
N, D, R = 512, 512, 200
x = torch.randn(N, D) * 1.5
g = torch.randn(N, D)
cfg = dgl_exact.CompressionConfig(bits=2)
xr = x.clone().requires_grad_()
exact = torch.autograd.grad(F.gelu(xr), xr, g)[0]
d = torch.autograd.grad(F.gelu(xr), xr, torch.ones_like(g))[0]   # GELU'(x)
acc_in = torch.zeros_like(x)
acc_d = torch.zeros_like(x)
for r in range(R):
    xq = decompress(compress(x, cfg))
    xq = xq.clone().requires_grad_()
    acc_in += torch.autograd.grad(F.gelu(xq), xq, g)[0]
    acc_d += g * decompress(compress(d, cfg))
for name, acc in (("input kept at INT2, gelu' at its decoded copy", acc_in),
                  ("derivative gelu'(x) kept at INT2", acc_d)):
    mean = acc / R
    rel = ((mean - exact).norm() / exact.norm()).item()
    print(f"{name}: relative error of the {R}-sample mean, |mean - exact| / |exact| = {rel:.4f}")
