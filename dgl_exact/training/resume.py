"""What a ``--resume`` checks: everything that decides a run's result is recorded in its checkpoint, and a
resumed run whose own values differ is refused before it trains, in one line naming each field and both values.

The record, one table (:func:`recorded_fields`):

* every :class:`~dgl_exact.training.config.TrainConfig` option (the checkpoint's ``config``): model and its
  widths, layers, heads, dropout, ...; the dataset name and its preprocessing (``standardize``); the
  compression (``bits``, ``kept_frac``, ``block_rows``, ``levels``, ``stochastic``, ``nonfinite``, ``act_fp``)
  and ``amp``; the sampler and its settings (``batch_size``, ``fanouts``, ``saint_*``, ``num_parts``, ...);
  the recipe flags (``edge_drop``, ``use_labels``, ``mask_rate``, ``inductive``, ...); the optimizer
  (``optimizer``, ``lr``, ``lr_warmup``, ``weight_decay``, ``grad_norm``, ``loss``); evaluation
  (``eval_every``, ``eval_batch_size``); ``seed``;
* the run's own values, :data:`RUN_FIELDS` (the checkpoint's ``recorded``): the world size of a data-parallel
  run, the memory budget and the per-tensor compression plan it resolved to, and a fingerprint of the data
  (node, edge, feature and class counts, split sizes, and hashes of the edge list and of the node values, so
  that a dataset of the same sizes with other content is told apart).

:data:`MAY_CHANGE` lists the recorded fields a resumed run may change, and why. Options that are not
recorded at all do not change what is computed: output paths (``--checkpoint``, ``--json``),
``--checkpoint-batches``, ``--quiet``, ``--debug-mem``, ``--compile``, ``--dist-timeout``, ``--download``.

A difference is a ``ValueError`` (the CLI: ``error: ...``, exit 2) unless the caller allows it
(``--resume-mismatch-ok``); then each difference is one warning line, training continues with the resumed
run's values, and the checkpoint records those from then on. A checkpoint written before the run fields were
recorded (no ``recorded``) is refused the same way, naming the fields it cannot be checked against: an
unchecked resume is what mixed a budgeted run with uniform INT2, or two processes' steps with one's. The data
hashes (:data:`UNKNOWN_IF_ABSENT`) came later: a checkpoint without them is resumed with no error, its data
checked by the counts only. Config options newer than a checkpoint are taken to have had their default value
(what the code did before them).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .checkpoint import RunState
from .config import TrainConfig
from .results import RunResult
from ..units import format_bytes

__all__ = ["RunField", "RUN_FIELDS", "MAY_CHANGE", "UNKNOWN_IF_ABSENT", "MISMATCH_FLAG", "recorded_fields",
           "checked_fields", "data_record", "structure_fingerprint", "values_fingerprint", "compare", "check_resume",
           "ResumeMismatchWarning", "refuse_existing_checkpoint", "resume_plan", "resume_line"]

#: the ``dgl-exact train`` flag (and :meth:`Trainer.fit` argument, ``resume_mismatch_ok``) that continues anyway
MISMATCH_FLAG = "--resume-mismatch-ok"


class ResumeMismatchWarning(UserWarning):
    """A resumed run differs from its checkpoint, and the caller allowed it (``resume_mismatch_ok``)."""


def _show(value: Any) -> str:
    """A recorded value as messages write it (``none``, ``true``, ``cora``, ``0.01``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _show_bytes(value: Any) -> str:
    return "none" if value is None else format_bytes(value).replace(" ", "")


def _show_split(value: Any) -> str:
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        return _show(value)
    return "train {:,}, val {:,}, test {:,}".format(*value)


def _show_plan(value: Any) -> str:
    """A per-tensor plan (``[[slot, option], ...]``) as its option counts: ``12 tensors: fp32 1, INT2 11``."""
    if value is None:
        return "none (uniform compression)"
    try:
        counts: Dict[str, int] = {}
        for _, option in value:
            counts[option] = counts.get(option, 0) + 1
    except (TypeError, ValueError):
        return _show(value)
    return (f"{len(value)} tensor{'s' if len(value) != 1 else ''}: "
            + ", ".join(f"{name} {n}" for name, n in sorted(counts.items())))


def _plan_difference(saved: Any, now: Any) -> Optional[Tuple[str, str]]:
    """Two plans with the same option counts, told apart by their first differing slot."""
    try:
        pairs = [(tuple(a), tuple(b)) for a, b in zip(saved, now)]
    except TypeError:
        return None
    if len(saved) != len(now):
        return None
    for a, b in pairs:
        if a != b:
            return f"slot {a[0]} kept as {a[1]}", f"slot {b[0]} kept as {b[1]}"
    return None


@dataclasses.dataclass(frozen=True)
class RunField:
    """A value a checkpoint records about its run besides the :class:`TrainConfig` options."""

    name: str
    doc: str
    show: Callable[[Any], str] = _show


#: The run's own recorded values (the checkpoint's ``recorded`` dict), in the order messages name them.
RUN_FIELDS: Tuple[RunField, ...] = (
    RunField("world_size", "processes of a data-parallel run (--nproc, torchrun's WORLD_SIZE; the one-process "
             "emulator's global batch); 1 otherwise"),
    RunField("memory_budget", "--memory-budget in bytes (None: none)", _show_bytes),
    RunField("memory_plan", "the per-tensor compression the budget resolved to, [[slot, option], ...] "
             "(dgl_exact.planning.budgeted.BudgetPlan.choices; None: uniform)", _show_plan),
    RunField("data_nodes", "nodes of the dataset as loaded"),
    RunField("data_edges", "edges of the dataset as loaded (before self loops are added)"),
    RunField("data_features", "input features per node"),
    RunField("data_classes", "classes (labels per node for multi-label data)"),
    RunField("data_split", "training, validation and test nodes", _show_split),
    RunField("data_graph_hash", "a hash of the edge list in edge-id order (dgl_exact.training.sampler_cache."
             "structure_fingerprint): the same counts with other edges differ here"),
    RunField("data_values_hash", "a hash of the node features, labels and split masks (values_fingerprint): the "
             "same shapes with other values differ here"),
)

#: Run fields recorded later than the others (the data hashes): a checkpoint without one is taken as unknown
#: for it and resumed with no error and no warning (its data is still checked by the counts, ``data_*``);
#: one that records it must match.
UNKNOWN_IF_ABSENT = frozenset({"data_graph_hash", "data_values_hash"})

#: The recorded fields a resumed run may change (everything else recorded must match), and why.
MAY_CHANGE: Dict[str, str] = {
    "epochs": "a larger value extends the last run, the same continues it",
    "runs": "a larger value adds runs",
    "device": "the same computation on another device (CPU <-> GPU: the same recipe, rounded differently)",
    "data_root": "where the dataset is read from; the data itself is checked by its fingerprint (data_*)",
}

_RUN_BY_NAME = {f.name: f for f in RUN_FIELDS}


def recorded_fields() -> List[str]:
    """Every recorded field's name: the :class:`TrainConfig` options, then :data:`RUN_FIELDS`."""
    return list(TrainConfig.fields()) + [f.name for f in RUN_FIELDS]


def checked_fields() -> List[str]:
    """The recorded fields a resumed run must match (:func:`recorded_fields` less :data:`MAY_CHANGE`)."""
    return [name for name in recorded_fields() if name not in MAY_CHANGE]


_MASK64 = (1 << 64) - 1
_EDGE_CHUNK = 1 << 22


def _wrap(x: int) -> int:
    """``x`` as a signed 64-bit int (two's complement): torch's int64 arithmetic wraps the same way."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def _mix(x):
    """splitmix64's finalizer on an int64 tensor (wrapping; logical shifts by masking the arithmetic ones)."""
    for mult in (0xBF58476D1CE4E5B9, 0x94D049BB133111EB):
        x = x ^ ((x >> 30) & ((1 << 34) - 1))
        x = x * _wrap(mult)
    return x ^ ((x >> 31) & ((1 << 33) - 1))


def structure_fingerprint(g) -> str:
    """A short hash of a graph's structure: node and edge counts and the set of ``(source, destination, edge
    id)`` triples, read from a sparse format the graph already holds (COO, CSC or CSR: none is created) in
    chunks of :data:`_EDGE_CHUNK` edges (no copy of the edge list). Each triple is mixed to 64 bits
    (splitmix64) and the mixes are summed: the same edges with the same ids give the same hash whichever format
    holds them and whatever their order; another edge or id changes it but for a 2**-64 chance."""
    import hashlib

    import numpy as np
    import torch

    created = g.formats()["created"]
    n = g.num_nodes()
    total = torch.zeros((), dtype=torch.int64)
    k1, k2 = _wrap(0x9E3779B97F4A7C15), _wrap(0xC2B2AE3D27D4EB4F)

    def add(src, dst, eid):
        nonlocal total
        x = _mix(src.to(torch.int64) * k1 + dst.to(torch.int64)) * k2 + eid.to(torch.int64)
        total = total + _mix(x).sum()

    if "coo" in created or not ({"csc", "csr"} & set(created)):
        src, dst = g.edges(order="eid")
        for a in range(0, src.numel(), _EDGE_CHUNK):
            ids = torch.arange(a, min(a + _EDGE_CHUNK, src.numel()), dtype=torch.int64)
            add(src[a:a + _EDGE_CHUNK], dst[a:a + _EDGE_CHUNK], ids)
    else:
        fmt = "csc" if "csc" in created else "csr"
        indptr, indices, eids = g.adj_tensors(fmt)
        indptr = indptr.to(torch.int64)
        for a in range(0, indices.numel(), _EDGE_CHUNK):
            b = min(a + _EDGE_CHUNK, indices.numel())
            pos = torch.arange(a, b, dtype=torch.int64)
            rows = torch.searchsorted(indptr, pos, right=True) - 1   # the node each stored edge belongs to
            ids = pos if eids is None or eids.numel() == 0 else eids[a:b]
            src, dst = (indices[a:b], rows) if fmt == "csc" else (rows, indices[a:b])
            add(src, dst, ids)
    h = hashlib.blake2b(digest_size=8)
    h.update(np.array([n, g.num_edges(), int(total)], dtype=np.int64).tobytes())
    return h.hexdigest()


def values_fingerprint(dataset) -> str:
    """A short hash of a :class:`~dgl_exact.data.GraphDataset`'s node values: features, labels and the train,
    validation and test masks (dtype, shape and bytes of each, hashed in place: one pass, no copy of a
    contiguous CPU tensor)."""
    import hashlib

    import numpy as np
    import torch

    h = hashlib.blake2b(digest_size=8)
    for t in (dataset.features, dataset.labels, *(dataset.mask(s) for s in ("train", "val", "test"))):
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(memoryview(np.ascontiguousarray(t.numpy())).cast("B"))
    return h.hexdigest()


def data_record(dataset) -> Dict[str, Any]:
    """The data fingerprint of :data:`RUN_FIELDS` for a :class:`~dgl_exact.data.GraphDataset` (as loaded):
    counts, and hashes of its edge list and node values (one linear pass over each: a fraction of an epoch)."""
    return {"data_nodes": dataset.num_nodes, "data_edges": dataset.num_edges, "data_features": dataset.num_features,
            "data_classes": int(dataset.num_classes),
            "data_split": [int(dataset.mask(s).sum()) for s in ("train", "val", "test")],
            "data_graph_hash": structure_fingerprint(dataset.graph), "data_values_hash": values_fingerprint(dataset)}


def _shown(name: str, saved: Any, now: Any) -> Tuple[str, str]:
    """(saved, now) as a message writes them, told apart where they would read the same."""
    field = _RUN_BY_NAME.get(name)
    show = field.show if field is not None else _show
    a, b = show(saved), show(now)
    if a == b and name == "memory_plan":
        a, b = _plan_difference(saved, now) or (a, b)
    if a == b:
        a, b = repr(saved), repr(now)
    return a, b


def compare(saved_config: Dict[str, Any], saved_run: Optional[Dict[str, Any]], current: Dict[str, Any],
            skip: Iterable[str] = ()) -> Tuple[List[Tuple[str, str, str]], List[str]]:
    """The recorded fields on which a checkpoint and a resumed run differ, and those it does not record.

    ``saved_config``: the checkpoint's ``config``; ``saved_run``: its ``recorded`` (None: written before run
    fields were recorded); ``current``: the resumed run's values of :func:`recorded_fields` (a field it
    lacks, or one in ``skip``, is not compared). Returns ``(differences, unrecorded)``: ``(name, saved, now)``
    as messages write the values, in the order of :func:`recorded_fields`; the run fields the checkpoint
    does not record (those of :data:`UNKNOWN_IF_ABSENT` aside: not recorded, they are not compared).
    """
    skip = set(skip) | set(MAY_CHANGE)
    defaults = TrainConfig().to_dict()  # an option newer than the checkpoint had its default value then
    run_names = {f.name for f in RUN_FIELDS}
    differences, unrecorded = [], []
    for name in recorded_fields():
        if name in skip or name not in current:
            continue
        if name in run_names:
            if saved_run is None or name not in saved_run:
                if name not in UNKNOWN_IF_ABSENT:
                    unrecorded.append(name)
                continue
            saved = saved_run[name]
        else:
            saved = saved_config.get(name, defaults[name])
        if saved != current[name]:
            differences.append((name, *_shown(name, saved, current[name])))
    return differences, unrecorded


def check_resume(saved_config: Dict[str, Any], saved_run: Optional[Dict[str, Any]], current: Dict[str, Any],
                 path: str, *, mismatch_ok: bool = False, warn: Optional[Callable[[str], None]] = None,
                 skip: Iterable[str] = ()) -> None:
    """Refuse to resume the checkpoint at ``path`` with values that differ from those it records
    (:func:`compare`): one ``ValueError`` line naming every differing field with both values, or the fields
    an older checkpoint does not record. With ``mismatch_ok``, ``warn`` gets one line per difference (and
    one for the unrecorded fields) instead, and nothing is raised."""
    if saved_run is not None and not isinstance(saved_run, dict):
        raise ValueError(f"checkpoint {path} is incomplete or damaged (bad: recorded); delete it or pass another "
                         "--checkpoint path to start over (without --resume)")
    differences, unrecorded = compare(saved_config, saved_run, current, skip)
    if not differences and not unrecorded:
        return
    where = f"--resume: checkpoint {path}"
    if mismatch_ok:
        if warn is not None:
            for name, saved, now in differences:
                warn(f"{where} was written with {name}={saved}, this run has {name}={now}; continuing with this "
                     f"run's ({MISMATCH_FLAG})")
            if unrecorded:
                warn(f"{where} does not record {', '.join(unrecorded)} (written by an older dgl_exact): they are "
                     f"not checked ({MISMATCH_FLAG})")
        return
    parts = []
    if differences:
        if len(differences) == 1:
            name, saved, now = differences[0]
            parts.append(f"was written with {name}={saved}, this run has {name}={now}")
        else:
            parts.append("was written with " + ", ".join(f"{name}={saved} (this run: {now})"
                                                         for name, saved, now in differences))
    if unrecorded:
        parts.append(f"{'; it ' if differences else ''}does not record {', '.join(unrecorded)} (written by an older "
                     "dgl_exact, they cannot be checked)")
    if differences:
        fix = (f"resume with the settings it was written with, start a new checkpoint (another --checkpoint path), "
               f"or add {MISMATCH_FLAG} to continue with this run's")
    else:
        fix = (f"if this run has the settings it was written with, add {MISMATCH_FLAG} to continue it; otherwise "
               "start a new checkpoint (another --checkpoint path)")
    raise ValueError(f"{where} {''.join(parts)}; {fix}")


# --- where a resumed training continues ------------------------------------------------------------------
def refuse_existing_checkpoint(checkpoint: str) -> None:
    """``ValueError`` in one line if a new checkpoint would be written over ``checkpoint`` (a file or a folder)."""
    if os.path.isdir(checkpoint):
        raise ValueError(f"--checkpoint {checkpoint} is a folder; pass a file path")
    if os.path.lexists(checkpoint):
        raise ValueError(f"{checkpoint} already exists (the checkpoint of an earlier run?): continue that run with "
                         "--resume, or pass another --checkpoint path (or delete the file) to start a new one")


def _epochs_trained(r: RunResult) -> int:
    return int(r.history[-1]["epoch"]) + 1 if r.history else 0


def resume_plan(state: RunState, path: str, epochs: int, runs: int):
    """(finished results to report, first run to train, state to resume it from or None) of a checkpoint's
    ``state`` read from ``path``, for ``epochs`` and ``runs``; see :meth:`~.trainer.Trainer.fit`."""
    try:
        by_run = {r.run: r for r in (RunResult(**r) for r in state.completed)}  # the last entry of a run counts
        completed = [by_run[k] for k in sorted(by_run)]
    except (TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"checkpoint {path} is damaged (its finished runs cannot be read: {e}); delete it or pass "
                         "another --checkpoint path to start over (without --resume)") from None
    run, done = state.run, state.epoch + 1
    if state.batch and done >= epochs:
        raise ValueError(f"checkpoint {path} is inside epoch {done + 1} of run {run + 1} but --epochs is {epochs}; "
                         f"resume with --epochs {done + 1} or more, or start a new checkpoint (another path)")
    if done > epochs:
        raise ValueError(f"checkpoint {path} is at epoch {done} of run {run + 1} but --epochs is {epochs}; resume "
                         f"with --epochs {done} or more, or start a new checkpoint (another path)")
    held = max([run] + [r.run for r in completed]) + 1
    if held > runs:
        raise ValueError(f"checkpoint {path} holds {held} run(s) but --runs is {runs}; resume with --runs {held} or "
                         "more, or start a new checkpoint (another path)")
    others = [r for r in completed if r.run != run]
    lengths = sorted({_epochs_trained(r) for r in others} - {epochs})
    if lengths:
        raise ValueError(f"checkpoint {path} holds finished runs of {', '.join(map(str, lengths))} epoch(s) but "
                         f"--epochs is {epochs}: only the last run can be extended, and runs of different lengths "
                         f"would be averaged together; resume with --epochs {lengths[0]}, or start a new checkpoint")
    if done == epochs and len(others) < len(completed):  # the checkpoint's run is finished: the next one starts
        return completed, run + 1, None
    return others, run, state


def resume_line(path: str, saved: RunState, finished: List[RunResult], first_run: int, epochs: int,
                 runs: int) -> str:
    """``resuming from PATH: epoch 12 of 50 done`` (with the run, the batches inside the next epoch, the
    finished runs where they apply)."""
    done = saved.epoch + 1
    where = f"resuming from {path}: "
    if first_run != saved.run:  # the checkpoint's run is finished
        if first_run >= runs:
            return where + f"all {runs} run(s) finished ({done} epochs each): nothing to train"
        return where + f"run {saved.run + 1} of {runs} finished ({done} epochs); starting run {first_run + 1}"
    text = f"epoch {done} of {epochs} done"
    if saved.batch:
        text += f", and {saved.batch} batch(es) of epoch {done + 1}"
    if runs > 1:
        text = f"run {saved.run + 1} of {runs}, {text}" + (f" ({len(finished)} run(s) finished)" if finished else "")
    return where + text
