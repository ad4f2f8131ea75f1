"""Machine descriptions and the assembly of ``BENCHMARKS.md`` from per-machine reports."""
from __future__ import annotations

import datetime
import glob
import os
import platform
from typing import Optional

import torch

from .._files import atomic_write
from .results import markdown_table
from .runner import published_rows


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_line(device) -> str:
    from .. import __version__, backend
    from .._compat import import_dgl

    from ..training.trainer import resolve_device

    device = resolve_device(str(device))
    if device.type == "cuda":
        hw = f"GPU {torch.cuda.get_device_name(device)}"
    else:
        hw = f"CPU {cpu_name()}, {torch.get_num_threads()} threads"
    return (f"{hw}; torch {torch.__version__}, dgl {import_dgl().__version__}, dgl_exact {__version__}, "
            f"kernel backend {backend(device).primary}; {datetime.date.today().isoformat()}")


HEADER = """# Benchmarks

Every number below comes from the command written next to it, run on the machine named with it. Ratios
compare settings measured side by side in one process. Activation memory follows EXACT's protocol:
bytes kept for backward by one training forward pass, excluding model, data, graph and the step's
outputs (CUDA: allocated-memory delta; CPU: unique storages saved for backward, see `dgl_exact.memory`).
Whether a graph fits is decided by the **step peak** beside it: the highest memory of a whole training
step (forward, loss, backward, Adam step; the second step, after a warm-up) above the memory before it
(CUDA: `max_memory_allocated`; CPU: resident high-water mark, `VmHWM` after `clear_refs`, see
`dgl_exact.memory.measure_step`). Memory numbers do not depend on machine load; timings do.

Regenerate a machine's section with `dgl-exact bench all --label NAME --benchmarks-md FILE` (writes
`benchmarks/NAME/bench-all/` and rebuilds FILE from every `REPORT.md` under `benchmarks/`).

## Published figures (not measured here)

{published}
"""


def assemble(root: str = "benchmarks", out: str = "BENCHMARKS.md") -> str:
    """Rebuild ``out`` from the published rows and every ``REPORT.md`` under ``root``."""
    parts = [HEADER.format(published=markdown_table(published_rows(), ["source", "setting", "claim"]))]
    for report in sorted(glob.glob(os.path.join(root, "**", "REPORT.md"), recursive=True)):
        with open(report) as f:
            parts.append(f.read())
    text = "\n".join(parts)
    with atomic_write(out, "w", encoding="utf-8", shared=True) as f:
        f.write(text)
    return out


def write_report(folder: str, label: str, command: str, sections, figures, device: Optional[str] = None,
                 link_base: Optional[str] = None) -> str:
    """``<folder>/REPORT.md``: the command, the machine, the code measured and each section's Markdown."""
    from .provenance import stamp

    lines = [f"## {label}", "", f"Command: `{command}`", "", f"Machine: {machine_line(device or 'cpu')}", "",
             f"Code: {stamp()['code']}", ""]
    for text in sections:
        lines += [text, ""]
    for fig in figures:
        rel = os.path.relpath(fig, link_base or os.getcwd())  # as linked from BENCHMARKS.md
        lines += [f"![{os.path.basename(fig)}]({rel})", ""]
    path = os.path.join(folder, "REPORT.md")
    with atomic_write(path, "w", encoding="utf-8", shared=True) as f:
        f.write("\n".join(lines))
    return path
