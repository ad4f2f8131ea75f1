"""The compression presets, defined once: the per-tensor options the budget planner chooses from
(:data:`OPTIONS`) and the settings every benchmark and prediction compares side by side (:data:`STANDARD`,
:func:`select`)."""
from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Union

from ..compression_config import CompressionConfig


@dataclasses.dataclass(frozen=True)
class Setting:
    """A named configuration a benchmark runs: the implementation and the compression in force."""

    name: str
    impl: str                              # "dgl" (dgl.nn + torch layers), "exact" (dgl_exact) or "pyg"
    compression: Optional[CompressionConfig]  # None for the baselines' plain autograd
    # a per-tensor plan (dgl_exact.planning.budget) within this uniform setting's predicted total memory;
    # ``compression`` is then the configuration in force for what the plan does not cover
    budget_of: Optional[str] = None
    # GCNII's recompute segment length (dgl_exact.training.models.GCNII ``recompute``: an int or "auto"):
    # only every segment's compressed input is kept, the segment re-runs in the backward; None: off
    recompute: Optional[Union[int, str]] = None

    @property
    def is_baseline(self) -> bool:
        return self.impl != "exact"


# i-EXACT's block-wise setting: with projection to 16 of 128 columns a row's INT2 codes take 4 bytes and
# its (min, step) 4 more; blocks of 64 rows cut that metadata 64x.
BLOCK_ROWS = 64

#: every compression preset by name, in the order the budget planner tries them per kept activation.
#: Projection only where the op allows it (not batch norm, not ReLU outputs).
OPTIONS: Dict[str, CompressionConfig] = {
    "fp32": CompressionConfig(enabled=False),
    "INT8": CompressionConfig(bits=8),
    "INT4": CompressionConfig(bits=4),
    "INT2": CompressionConfig(bits=2),
    "INT1": CompressionConfig(bits=1),
    "INT2 + blocks(64) + optimal": CompressionConfig(bits=2, block_rows=BLOCK_ROWS, levels="optimal"),
    "INT2 + RP(0.125)": CompressionConfig(bits=2, kept_frac=0.125),
    "INT2 + RP(0.125) + blocks(64) + optimal": CompressionConfig(bits=2, kept_frac=0.125, block_rows=BLOCK_ROWS,
                                                                levels="optimal"),
}

#: the uniform settings compared side by side (one preset for every kept activation), baseline first
STANDARD: List[Setting] = [
    Setting("DGL fp32", "dgl", None),
    Setting("dgl_exact fp32", "exact", OPTIONS["fp32"]),
    Setting("INT8", "exact", OPTIONS["INT8"]),
    Setting("INT4", "exact", OPTIONS["INT4"]),
    Setting("INT2", "exact", OPTIONS["INT2"]),
    Setting("INT2 + RP(0.125)", "exact", OPTIONS["INT2 + RP(0.125)"]),
    Setting("INT2 + RP(0.125) + blocks(64) + optimal", "exact", OPTIONS["INT2 + RP(0.125) + blocks(64) + optimal"]),
    Setting("INT1", "exact", OPTIONS["INT1"]),
]
PYG = Setting("PyG fp32", "pyg", None)
#: settings named explicitly only (not in the default comparison): GCNII's depth-flat recompute mode, its
#: segment length chosen (round(sqrt(layers))) unless named: ``INT2 + recompute(4)``; any dgl_exact setting
#: takes ``+ recompute`` (:func:`select`)
EXTRA: List[Setting] = [
    Setting("INT2 + recompute", "exact", OPTIONS["INT2"], recompute="auto"),
]
_RECOMPUTE = re.compile(r"^(?P<base>.+?)\s*\+\s*recompute\s*(?:\(\s*(?P<length>[^)]*?)\s*\))?$")


def _with_recompute(part: str) -> Optional[Setting]:
    """``<dgl_exact setting> + recompute`` or ``... + recompute(L)`` (L a positive int or ``auto``)."""
    m = _RECOMPUTE.match(part)
    if m is None:
        return None
    base = select(m.group("base"))
    length = (m.group("length") or "auto").lower()
    if len(base) != 1 or base[0].impl != "exact" or base[0].budget_of or base[0].recompute:
        raise ValueError(f"{part!r}: recompute applies to one dgl_exact setting (e.g. 'INT2 + recompute(4)')")
    if length != "auto" and not (length.isdigit() and int(length) > 0):
        raise ValueError(f"{part!r}: the segment length must be a positive integer or 'auto'")
    suffix = " + recompute" if length == "auto" else f" + recompute({int(length)})"
    return Setting(base[0].name + suffix, "exact", base[0].compression,
                   recompute="auto" if length == "auto" else int(length))


BUDGET_PREFIX = "budget="


def budget_setting(ref: str) -> Setting:
    """``budget=<setting>``: the per-tensor plan within ``<setting>``'s predicted total (step peak + static
    memory) for the model and graph measured (only ``dgl-exact bench memory`` plans it)."""
    base = select(ref)
    if len(base) != 1 or base[0].impl != "exact" or base[0].budget_of:
        raise ValueError(f"{BUDGET_PREFIX}{ref}: the budget must be one dgl_exact setting's total (e.g. budget=INT2)")
    return Setting(f"budget = {base[0].name} total", "exact", CompressionConfig(bits=2), base[0].name)


def select(names: Optional[str], budgets: bool = False) -> List[Setting]:
    """Settings by comma-separated names (case-insensitive prefixes allowed); all if ``names`` is empty.
    With ``budgets``, ``budget=<setting>`` names a per-tensor plan (:func:`budget_setting`)."""
    if not names:
        return list(STANDARD)
    chosen = []
    for part in (p.strip().lower() for p in names.split(",") if p.strip()):
        if part.startswith(BUDGET_PREFIX):
            if not budgets:
                raise ValueError(f"{part!r}: budgeted plans are measured only by `dgl-exact bench memory`")
            chosen.append(budget_setting(part[len(BUDGET_PREFIX):].strip()))
            continue
        recomputed = _with_recompute(part)
        if recomputed is not None:
            chosen.append(recomputed)
            continue
        known = STANDARD + [PYG] + EXTRA
        matches = [s for s in known if s.name.lower() == part] or [s for s in known if s.name.lower().startswith(part)]
        if not matches:
            from ..errors import did_you_mean

            raise ValueError(f"unknown setting {part!r}{did_you_mean(part, [s.name for s in known])}")
        chosen.append(matches[0])
    return chosen
