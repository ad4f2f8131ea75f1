"""Helpers of the PyG drop-in tests: graphs with the awkward cases, copies of a PyG conv, the saved-bytes meter
and the unbiasedness check. Imports no torch_geometric (the test files skip without it)."""
from __future__ import annotations

import math

import torch

import dgl_exact

OFF = dgl_exact.CompressionConfig(enabled=False)
INT2 = dgl_exact.CompressionConfig(bits=2)


def case_id(kwargs: dict) -> str:
    """A parametrize id for a dict of constructor arguments."""
    return ",".join(f"{a}={b}" for a, b in kwargs.items()) or "default"


def random_graph(n: int = 30, e: int = 120, isolated: int = 3, duplicates: int = 10, self_loops: int = 3,
                 seed: int = 0) -> torch.Tensor:
    """``edge_index [2, E]`` over ``n`` nodes whose last ``isolated`` nodes have no edge, with ``duplicates``
    repeated edges and ``self_loops`` self loops (PyG's normalisation treats existing loops apart)."""
    g = torch.Generator().manual_seed(seed)
    m = n - isolated
    ei = torch.randint(0, m, (2, e), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    dup = ei[:, torch.randint(0, ei.shape[1], (duplicates,), generator=g)]
    loops = torch.randint(0, m, (self_loops,), generator=g).repeat(2, 1)
    ei = torch.cat([ei, dup, loops], 1)
    return ei[:, torch.randperm(ei.shape[1], generator=g)]


def copy_of(ours_cls, theirs: torch.nn.Module, *args, **kwargs) -> torch.nn.Module:
    """``ours_cls(*args, **kwargs)`` holding ``theirs``'s parameters (strict ``state_dict`` load), after checking
    that ``theirs`` loads ours back (strict)."""
    ours = ours_cls(*args, **kwargs)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    assert list(dict(ours.named_parameters())) == list(dict(theirs.named_parameters()))
    return ours


def saved_bytes(fn, exclude=()) -> int:
    """Bytes of the distinct storages saved for backward while ``fn()`` runs (its result is kept alive
    meanwhile), without those of the tensors in ``exclude`` (parameters, leaf inputs: alive anyway)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


def linear_weight_sd(grad_out: torch.Tensor, x: torch.Tensor, bits: int) -> torch.Tensor:
    """Upper bound of the standard deviation of ``grad_out^T x_hat`` (a linear's weight gradient, ``[out, in]``)
    when ``x`` (``[N, in]``) is kept with per-row stochastic rounding to ``bits`` bits: each element's rounding
    is independent with variance at most ``step_i^2 / 4``, ``step_i = (max_j x_ij - min_j x_ij) / (2^bits - 1)``
    (times 1.02 for the bf16 rounding of the stored range), so ``Var[o, j] <= sum_i grad_out[i, o]^2 step_i^2 / 4``."""
    step = (x.max(1).values - x.min(1).values) / (2 ** bits - 1) * 1.02
    var = grad_out.pow(2).t().matmul(step.pow(2) / 4)  # [out]
    return var.sqrt().unsqueeze(1).expand(-1, x.shape[1])


def assert_unbiased(draw, exact: torch.Tensor, sd: torch.Tensor, n: int, z: float = 6.0) -> None:
    """The mean of ``n`` draws of ``draw()`` is within ``z`` standard errors (``sd / sqrt(n)``, ``sd`` an upper
    bound of one draw's standard deviation, element by element) of ``exact``."""
    total = torch.zeros_like(exact)
    for _ in range(n):
        total += draw()
    err = (total / n - exact).abs()
    bound = z * sd / math.sqrt(n) + 1e-6 * exact.abs().max()
    worst = (err / bound).max()
    assert bool((err <= bound).all()), f"mean of {n} draws off by {float(worst):.2f} x the {z}-sigma bound"
    # and the draws are not exact (the test would pass vacuously with compression off)
    assert float((draw() - exact).abs().max()) > 0


def assert_unbiased_sampled(draw, exact: torch.Tensor, n: int, z: float = 6.0) -> None:
    """The mean of ``n`` draws of ``draw()`` is within ``z`` standard errors of ``exact``, element by element, the
    standard error estimated from the draws (for estimators whose variance has no simple closed bound: a
    gradient through the attention of GAT, which is a product of independently compressed copies)."""
    draws = torch.stack([draw() for _ in range(n)])
    se = draws.std(0) / math.sqrt(n)
    assert float(se.max()) > 0, "the draws do not vary: nothing was compressed"
    err = (draws.mean(0) - exact).abs()
    bound = z * se + 1e-6 * exact.abs().max()
    worst = (err / bound).max()
    assert bool((err <= bound).all()), f"mean of {n} draws off by {float(worst):.2f} x the {z}-sigma bound"
