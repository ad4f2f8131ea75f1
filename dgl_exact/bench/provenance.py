"""What code a benchmark measured: the git commit of the dgl_exact source (when it runs from a git checkout),
or the package version only (installed from a wheel: "no git checkout"), and whether the checkout had
uncommitted changes to the measured code (tracked files under ``dgl_exact/``, ``cuda/``, ``setup.*``).

Every benchmark output file carries it (:class:`~dgl_exact.bench.results.ResultSink`); ``dgl-exact bench``
refuses a dirty tree unless ``--allow-dirty`` is given."""
from __future__ import annotations

import os
import subprocess
from typing import Dict, Optional

#: paths, relative to the checkout's root, whose uncommitted changes make a measurement untraceable
MEASURED_PATHS = ("dgl_exact", "cuda", "setup.*")
_TIMEOUT_S = 5.0

_current: Optional[Dict] = None


def _git(cwd: str, *args: str) -> Optional[str]:
    """stdout of ``git -C cwd ARGS``, or None (no git, not a checkout, timed out, failed)."""
    try:
        proc = subprocess.run(["git", "-C", cwd, *args], capture_output=True, text=True, timeout=_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _version() -> str:
    from .. import __version__

    return __version__


def provenance(src_dir: str, package: str = "dgl_exact") -> Dict:
    """``{"version", "commit", "dirty", "dirty_paths", "code"}`` for the package whose source folder is
    ``src_dir``. ``commit`` is None and ``code`` says "no git checkout" unless ``src_dir`` is the folder
    ``<checkout root>/<package>`` of a git checkout (an installed package inside some other repository's
    tree is not one); ``code`` is the one line every output file carries."""
    version = _version()
    result = {"version": version, "commit": None, "dirty": False, "dirty_paths": [],
              "code": f"dgl_exact {version}, no git checkout (commit unknown)"}
    top = _git(src_dir, "rev-parse", "--show-toplevel")
    if top is None:
        return result
    top = top.strip()
    if os.path.realpath(os.path.join(top, package)) != os.path.realpath(src_dir):
        return result
    commit = _git(top, "rev-parse", "HEAD")
    status = _git(top, "status", "--porcelain", "--untracked-files=no", "--", *MEASURED_PATHS)
    if commit is None or status is None:
        return result
    paths = sorted({line[3:].split(" -> ")[-1] for line in status.splitlines() if line.strip()})
    result.update(commit=commit.strip(), dirty=bool(paths), dirty_paths=paths)
    code = f"dgl_exact {version}, git commit {result['commit']}"
    if paths:
        shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        code += f"; dirty tree: uncommitted changes to {shown}"
    result["code"] = code
    return result


def package_dir() -> str:
    """The folder of the dgl_exact package being run (``dgl_exact.__file__``'s)."""
    from .. import __file__ as init

    return os.path.dirname(os.path.abspath(init))


def current() -> Dict:
    """This process's provenance (computed once)."""
    global _current
    if _current is None:
        _current = provenance(package_dir())
    return _current


def check(allow_dirty: bool) -> Dict:
    """This process's provenance; ValueError (one line) if the measured code has uncommitted changes and
    ``allow_dirty`` is false."""
    prov = current()
    if prov["dirty"] and not allow_dirty:
        shown = ", ".join(prov["dirty_paths"][:5]) + (" ..." if len(prov["dirty_paths"]) > 5 else "")
        raise ValueError(f"uncommitted changes to {shown}: the results could not be traced to a commit; "
                         "commit them, or add --allow-dirty (every output file then says so)")
    return prov


def stamp() -> Dict:
    """The columns every benchmark row carries: ``commit`` (None without a git checkout) and ``code``."""
    prov = current()
    return {"commit": prov["commit"], "code": prov["code"]}
