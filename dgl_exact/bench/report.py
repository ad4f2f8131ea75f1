"""Machine descriptions, the layout of ``benchmarks/`` (``<machine>/<suite>/``) and the assembly of ``BENCHMARKS.md``
from its suites' reports."""
from __future__ import annotations

import datetime
import os
import platform
import re
import torch

from .._files import atomic_write
from . import suites
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


#: the suites of a machine's folder (``benchmarks/<machine>/<suite>/``), in the order BENCHMARKS.md shows them,
#: with their headings; each suite folder holds its current results and a README.md (heading, command, machine,
#: code, tables) that :func:`assemble` copies into BENCHMARKS.md. ``dgl-exact bench all`` writes the first four.
SUITES = {
    "memory": "Activation memory and step peak",
    "speed": "Epoch time",
    "kernels": "Kernel throughput",
    "accuracy": "Accuracy",
    "profile": "A training step on the GPU code path, counted",
    "plan": "Plan: predicted against measured memory",
    "budget": "Budgeted plans",
    "minibatch": "Largest mini-batch within a memory budget",
    "checks": "Checks",
}
SUITE_README = "README.md"

HEADER = """# Benchmarks

Current results, per machine and suite. Every table is generated from the result files in
`benchmarks/MACHINE/SUITE/`, with the command that wrote them and the machine it ran on written above it (each
suite's `runs.json` lists its runs). One command per machine regenerates that machine's sections and this file,
without measuring: `dgl-exact bench report --label MACHINE --benchmarks-md BENCHMARKS.md`; `dgl-exact bench all
--label MACHINE --benchmarks-md BENCHMARKS.md` reruns the memory, speed, kernels and accuracy suites first, and
each other suite's command (written in its section) reruns it with `--out benchmarks/MACHINE/SUITE`. Earlier
results are in the git history; what changed, in CHANGELOG.md.

Activation memory follows EXACT's protocol: bytes kept for backward by one training forward pass, excluding
model, data, graph and the step's outputs (CUDA: allocated-memory delta; CPU: unique storages saved for
backward, see `dgl_exact.memory`). Whether a graph fits is decided by the **step peak** beside it: the highest
memory of a whole training step (forward, loss, backward, Adam step; the second step, after a warm-up) above the
memory before it (CUDA: `max_memory_allocated`; CPU: resident high-water mark, `VmHWM` after `clear_refs`, see
`dgl_exact.memory.measure_step`). Ratios compare settings measured side by side in one command. Memory numbers
do not depend on machine load; timings do.

## Published figures (not measured here)

{published}
"""

_LINK = re.compile(r"(\]\()([^)#\s]+)(\))")


def _rebase_links(text: str, from_dir: str, to_dir: str) -> str:
    """Relative Markdown links of a file in ``from_dir`` rewritten to resolve from ``to_dir``."""
    def rebase(m):
        target = m.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return m.group(0)
        return m.group(1) + os.path.relpath(os.path.join(from_dir, target), to_dir).replace(os.sep, "/") + m.group(3)

    return _LINK.sub(rebase, text)


def _ordered_suites(machine_dir: str) -> list:
    present = [d for d in sorted(os.listdir(machine_dir))
               if os.path.isfile(os.path.join(machine_dir, d, SUITE_README))]
    return [s for s in SUITES if s in present] + [s for s in present if s not in SUITES]


def render(root: str = "benchmarks", out_dir: str = ".") -> str:
    """The text of BENCHMARKS.md: the published rows and, for every machine folder under ``root`` (sorted), its
    ``README.md`` (if any) and each suite's ``README.md`` in :data:`SUITES` order (other suites after them,
    sorted), relative links rewritten to resolve from ``out_dir``."""
    out_dir = os.path.abspath(out_dir)
    parts = [HEADER.format(published=markdown_table(published_rows(), ["source", "setting", "claim"]))]
    names = os.listdir(root) if os.path.isdir(root) else []
    machines = sorted(d for d in names if os.path.isdir(os.path.join(root, d)))
    for machine in machines:
        machine_dir = os.path.join(root, machine)
        suites = _ordered_suites(machine_dir)
        intro = os.path.join(machine_dir, SUITE_README)
        if not suites and not os.path.isfile(intro):
            continue
        parts.append(f"## {machine}\n")
        for path in ([intro] if os.path.isfile(intro) else []) + [os.path.join(machine_dir, s, SUITE_README)
                                                                  for s in suites]:
            with open(path, encoding="utf-8") as f:
                parts.append(_rebase_links(f.read().rstrip("\n") + "\n", os.path.dirname(os.path.abspath(path)),
                                           out_dir))
    return "\n".join(parts)


def assemble(root: str = "benchmarks", out: str = "BENCHMARKS.md") -> str:
    """Rebuild ``out`` from the reports under ``root`` (:func:`render`); returns ``out``."""
    text = render(root, os.path.dirname(os.path.abspath(out)))
    with atomic_write(out, "w", encoding="utf-8", shared=True) as f:
        f.write(text)
    return out


def write_suite_report(root: str, machine: str, suite: str, run: dict) -> str:
    """Record ``run`` (:mod:`.suites`: ``results``, ``command``, ``machine``, ``code``, ...) in
    ``<root>/<machine>/<suite>/runs.json`` and regenerate that suite's README.md from it; returns the README."""
    folder = os.path.join(root, machine, suite)
    suites.record_run(folder, run)
    return suites.write_suite(folder, suite, SUITES.get(suite, suite))


def report_machine(root: str, machine: str) -> tuple:
    """Regenerate the README.md of every suite of ``<root>/<machine>/`` that has a manifest (``runs.json``) from
    its result files; returns (the READMEs written, the suites without a manifest, whose README is left)."""
    machine_dir = os.path.join(root, machine)
    if not os.path.isdir(machine_dir):
        raise ValueError(f"no folder {machine_dir}: the machine's results go to {root}/MACHINE/SUITE/")
    written, left = [], []
    for suite in sorted(d for d in os.listdir(machine_dir) if os.path.isdir(os.path.join(machine_dir, d))):
        folder = os.path.join(machine_dir, suite)
        if os.path.isfile(os.path.join(folder, suites.MANIFEST)):
            written.append(suites.write_suite(folder, suite, SUITES.get(suite, suite)))
        else:
            left.append(suite)
    return written, left


def run_entry(results: str, command: str, device=None, **extra) -> dict:
    """A manifest entry for a run measured now, in this process: its machine line and the code measured."""
    from .provenance import stamp

    return {"results": results, "command": command, "machine": machine_line(device or "cpu"),
            "code": stamp()["code"], **extra}
