"""How much gradient variance each slot adds under each option, probed on the model's own first steps.

With dropout masks fixed by a seed, one exact forward
and backward gives the reference gradient ``g0``; then, per slot, ``replicas`` steps compress only that
slot with the probe option (INT2) and ``V_i = mean sum_p ||g_p - g0_p||^2 / ||g0_p||^2`` is the gradient
variance it adds, relative to each parameter tensor ``p``'s own gradient (:func:`relative_weights`: an
optimizer that scales each parameter's step, as Adam does, feels noise relative to its gradient, so
noise on batch norm's small scale gradient counts as much as on a large weight's). The
compression noise of every option on the slot's own tensor, ``e_i(c) = ||decompress(compress(x)) - x||^2``,
scales it: ``V_i(c) = V_i(INT2) e_i(c) / e_i(INT2)`` (the weight gradients are linear in the kept
activation, and quantisation noise is independent per element). Random projection is not: one
projection matrix for all rows makes its error add up coherently across rows in a weight gradient
(10-1000x the variance the INT2 scaling predicts, measured on a 20k-node GCN), so the projected options
are probed with their own option (INT2 + RP(0.125)) and scaled from it. Compression draws its random
numbers inside ``torch.random.fork_rng``, so every probe step sees the same dropout masks.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

import torch

from .. import ops
from ..compression import compress, decompress
from ..ops import keep as keeping
from .settings import OPTIONS
from .slots import FP, PROBE, Slot, probe_family, keep


#: a parameter tensor whose exact gradient has less than this fraction of the mean tensor's squared norm has no
#: gradient signal to drown (a bias followed by batch norm, whose exact gradient is zero): its noise counts
#: relative to this floor, not to its own near-zero norm
REL_FLOOR = 1e-3


def per_parameter_steps(optimizer: str) -> bool:
    """Whether ``optimizer`` (a training config's name) scales each parameter's step by its own gradient's
    magnitude, so that a plan should minimise the relative gradient variance (:func:`relative_weights`)."""
    return optimizer.lower() != "sgd"


def relative_weights(exact: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per element of the flattened gradient, ``1 / (||g_p||^2 + floor)`` for the parameter tensor ``p`` it
    belongs to (``exact``: the exact gradient per tensor; ``floor``: :data:`REL_FLOOR` times the tensors' mean
    squared norm). ``sum(weight * (g - g_exact)^2)`` is then the gradient variance **relative to each
    tensor's own gradient**, summed over tensors: what an optimizer that scales each parameter's step by its
    gradient's magnitude (Adam, RMSprop) feels. The plain sum ``||g - g_exact||^2`` weighs tensors by their
    gradient's size instead; on a 20k-node GCN 4x128 with batch norm it ranked INT1 on batch norm's inputs
    cheap (their noise lands on the small gradients of BN's scale, 2.6-4x their own squared norm at INT1)
    and the plan that followed trained 1.6 points below uniform INT2 (20 seeds)."""
    norms = torch.stack([(g.double() ** 2).sum() for g in exact]) if exact else torch.zeros(0, dtype=torch.float64)
    floor = REL_FLOOR * float(norms.mean()) if norms.numel() else 0.0
    floor = floor if floor > 0 else 1.0  # all gradients zero: plain squared error
    return torch.cat([torch.full((g.numel(),), 1.0 / (float(n) + floor), dtype=g.dtype, device=g.device)
                      for g, n in zip(exact, norms)]) if exact else torch.zeros(0)


def estimate_sensitivity(model: torch.nn.Module, graph, feat, label, idx, slots: Sequence[Slot], replicas: int = 2,
                         seed: int = 0, loss: Optional[Callable] = None, relative: bool = True) -> None:
    """Fill ``slot.variance[option]`` (the gradient variance it adds, relative to each parameter tensor's exact
    gradient and summed over tensors: :func:`relative_weights`; with ``relative=False`` the plain
    ``||g - g0||^2``, what plain SGD's step feels) for every slot, from ``1 + probes * replicas`` training
    forwards and backwards of ``model`` on the given data."""
    loss = loss or (lambda logits: ops.cross_entropy(logits, label, idx))
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    wanted = {s.index: s for s in slots}
    errors: Dict[int, Dict[str, float]] = {}

    def gradient(hook) -> torch.Tensor:
        for p in params:
            p.grad = None
        torch.manual_seed(seed)  # the same dropout masks every time
        with keeping.keep_hook(hook):
            out = loss(model(graph, feat))
        out.backward()
        return [(p.grad if p.grad is not None else torch.zeros_like(p)) for p in params]

    def probe_hook(target: Optional[int], replica: int, probe: str = PROBE):
        count = [0]

        def hook(x, cfg, force):
            i = count[0]
            count[0] += 1
            if i != target or keeping.alive_anyway(x) and not force:
                shared = keeping.shared_copy(x, OPTIONS[probe]) if target is not None and i > target else None
                # a later keeper of the probed tensor shares its copy (ownership rule 6), as in training
                return shared if shared is not None else keep(x, cfg, FP, force)
            slot = wanted[i]
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(10_000 + 97 * i + replica)
                if i not in errors:
                    xd = x.detach()
                    errors[i] = {}
                    for name in slot.allowed():
                        c = OPTIONS[name]
                        if c.enabled:
                            errors[i][name] = float(((decompress(compress(xd, c)).to(xd.dtype) - xd) ** 2).sum())
                        else:
                            errors[i][name] = 0.0
                return keeping.default_keep(x, OPTIONS[probe], force)

        return hook

    exact = gradient(probe_hook(None, 0))
    weight = relative_weights(exact)
    g0 = torch.cat([g.flatten() for g in exact])
    del exact
    for slot in slots:
        probes = sorted({probe_family(n) for n in slot.allowed() if OPTIONS[n].enabled})
        v, w = {}, {}  # relative, plain
        for probe in probes:
            v[probe] = w[probe] = 0.0
            for r in range(replicas):
                err = (torch.cat([g.flatten() for g in gradient(probe_hook(slot.index, r, probe))]) - g0) ** 2
                v[probe] += float((weight * err).sum()) / replicas
                w[probe] += float(err.sum()) / replicas
        e = errors.get(slot.index, {})

        def scaled(n, v):
            if not OPTIONS[n].enabled:
                return 0.0
            ref = e.get(probe_family(n), 0.0)
            return v[probe_family(n)] * e.get(n, 0.0) / ref if ref > 0 else 0.0

        rel = {n: scaled(n, v) for n in slot.allowed()}
        plain = {n: scaled(n, w) for n in slot.allowed()}
        slot.variance, slot.other_variance = (rel, plain) if relative else (plain, rel)
    for p in params:
        p.grad = None
