"""The settings every benchmark compares, side by side, in one process."""
from __future__ import annotations

import dataclasses
from typing import List, Optional

from ..config import CompressionConfig


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    impl: str                              # "dgl" (dgl.nn + torch layers), "exact" (dgl_exact) or "pyg"
    compression: Optional[CompressionConfig]  # None for the baselines' plain autograd
    # a per-tensor plan (dgl_exact.planning.budget) within this uniform setting's predicted total memory;
    # ``compression`` is then the configuration in force for what the plan does not cover
    budget_of: Optional[str] = None

    @property
    def is_baseline(self) -> bool:
        return self.impl != "exact"


# i-EXACT's block-wise setting: with projection to 16 of 128 columns a row's INT2 codes take 4 bytes and
# its (min, step) 4 more; blocks of 64 rows cut that metadata 64x.
BLOCK_ROWS = 64

STANDARD: List[Setting] = [
    Setting("DGL fp32", "dgl", None),
    Setting("dgl_exact fp32", "exact", CompressionConfig(enabled=False)),
    Setting("INT8", "exact", CompressionConfig(bits=8)),
    Setting("INT4", "exact", CompressionConfig(bits=4)),
    Setting("INT2", "exact", CompressionConfig(bits=2)),
    Setting("INT2 + RP(0.125)", "exact", CompressionConfig(bits=2, kept_frac=0.125)),
    Setting("INT2 + RP(0.125) + blocks(64) + optimal", "exact",
            CompressionConfig(bits=2, kept_frac=0.125, block_rows=BLOCK_ROWS, levels="optimal")),
    Setting("INT1", "exact", CompressionConfig(bits=1)),
]
PYG = Setting("PyG fp32", "pyg", None)


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
        matches = [s for s in STANDARD + [PYG] if s.name.lower() == part] or \
                  [s for s in STANDARD + [PYG] if s.name.lower().startswith(part)]
        if not matches:
            raise ValueError(f"unknown setting {part!r}; known: {', '.join(s.name for s in STANDARD + [PYG])}")
        chosen.append(matches[0])
    return chosen
