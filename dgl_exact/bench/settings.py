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


def select(names: Optional[str]) -> List[Setting]:
    """Settings by comma-separated names (case-insensitive prefixes allowed); all if ``names`` is empty."""
    if not names:
        return list(STANDARD)
    chosen = []
    for part in (p.strip().lower() for p in names.split(",") if p.strip()):
        matches = [s for s in STANDARD + [PYG] if s.name.lower() == part] or \
                  [s for s in STANDARD + [PYG] if s.name.lower().startswith(part)]
        if not matches:
            raise ValueError(f"unknown setting {part!r}; known: {', '.join(s.name for s in STANDARD + [PYG])}")
        chosen.append(matches[0])
    return chosen
