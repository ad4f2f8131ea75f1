"""Memory sizes in and out: the one parser of every size the package reads (``2GiB``, ``512 MiB``, ``1.5GB``,
``3e9``), the one printer of byte counts (``12.34 MiB``), and the memory a device offers.

Units: ``B``, ``K``/``KB``, ``M``/``MB``, ``G``/``GB``, ``T``/``TB`` are powers of 1000; ``KiB``, ``MiB``,
``GiB``, ``TiB`` powers of 1024 (case-insensitive). :func:`format_bytes` prints binary units with two
decimals; :func:`round_up_size` writes a count in that form so that reading it back is at least the count.
"""
from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction
from typing import Optional, Tuple

__all__ = ["MAX_BYTES", "UNITS", "parse_bytes", "format_bytes", "round_up_size", "device_bytes"]

#: what a byte count can hold (torch and the allocators count in int64)
MAX_BYTES = 2 ** 63 - 1

#: the units :func:`parse_bytes` reads (lower case) and their sizes in bytes
UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
         "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

#: the binary units :func:`format_bytes` prints, largest first
_PRINTED = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))

_EXAMPLES = "examples: 2GiB, 512MiB, 1.5GB, 3e9"


def parse_bytes(text, option: str = "size") -> int:
    """``"2GiB"``, ``"512 MiB"``, ``"1.5GB"``, ``"3e9"`` or an int: bytes. The one parser of every size the CLI
    takes: anything it cannot represent (``1e400GiB``, ``1e309``, ``inf``, ``nan``, negative, more than
    ``2**63 - 1`` bytes) is a ValueError naming ``option``, never an OverflowError."""
    if isinstance(text, bool):
        raise ValueError(f"{option}: cannot read {text!r} as a memory size; {_EXAMPLES}")
    if isinstance(text, int):
        value = text
    elif isinstance(text, float):
        if not math.isfinite(text):
            raise ValueError(f"{option}: {text!r} is not a finite memory size; {_EXAMPLES}")
        value = int(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
        if not m or m.group(2).lower() not in UNITS:
            raise ValueError(f"{option}: cannot read {text!r} as a memory size; {_EXAMPLES}")
        number, unit = m.group(1), UNITS[m.group(2).lower()]
        digits = Decimal(number)
        # exact arithmetic; an exponent beyond +-30 is rounded to 0 or to "too big" before Fraction sees it
        exact = Fraction(digits) if -30 <= digits.adjusted() <= 30 else Fraction(0 if digits.adjusted() < 0 else 2)
        if exact * unit > MAX_BYTES or digits.adjusted() > 30:
            raise ValueError(f"{option}: {str(text).strip()} is more than any memory ({MAX_BYTES:,} bytes); "
                             f"{_EXAMPLES}")
        value = int(exact * unit)
    if not 0 <= value <= MAX_BYTES:
        raise ValueError(f"{option}: {text!r} bytes is not a memory size (0 to {MAX_BYTES:,}); {_EXAMPLES}")
    return value


def format_bytes(n: Optional[float]) -> str:
    """``12.34 MiB``: ``n`` bytes in the largest binary unit it reaches, two decimals (``512 B`` below 1 KiB,
    ``n/a`` for None)."""
    if n is None:
        return "n/a"
    for unit, scale in _PRINTED:
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def round_up_size(needed: int) -> Tuple[str, int]:
    """``(text, bytes)``: ``needed`` rounded up to what :func:`format_bytes` shows (two decimals of its unit),
    written so that giving ``text`` back to :func:`parse_bytes` is at least ``needed`` bytes."""
    for unit, scale in _PRINTED:
        if needed >= scale:
            text = f"{-(-needed * 100 // scale) / 100:.2f}{unit}"
            value = parse_bytes(text)
            while value < needed:  # float formatting fell a hair short
                text = f"{float(text[:-3]) + 0.01:.2f}{unit}"
                value = parse_bytes(text)
            return text, value
    return f"{int(needed)}B", int(needed)


def device_bytes(device: str) -> tuple:
    """``(bytes, description)`` of the memory a device offers: ``cpu`` (available memory, ``MemAvailable``),
    ``cuda`` / ``cuda:N`` (the GPU's total memory), or a size such as ``80GiB``."""
    d = str(device).strip()
    if d == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        n = int(line.split()[1]) * 1024
                        return n, f"cpu (available memory {format_bytes(n)})"
        except OSError:
            pass
        return None, "cpu (available memory unknown)"
    if d.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"device {d!r}: no CUDA device visible; give its memory size instead, e.g. 80GiB")
        props = torch.cuda.get_device_properties(torch.device(d))
        return props.total_memory, f"{d} ({props.name}, {format_bytes(props.total_memory)})"
    n = parse_bytes(d, "device")
    return n, f"{format_bytes(n)} device"
