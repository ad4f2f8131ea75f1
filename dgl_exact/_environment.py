"""Every environment variable dgl_exact reads, declared in one place with what it accepts.

:func:`read` parses one variable (unset or empty: its default) and :func:`check` all of them, with the
relations between them (``RANK < WORLD_SIZE``): the ``dgl-exact`` command calls :func:`check` before any
work, so a bad value ends in one line naming the variable, its value and what is expected
(:class:`EnvironmentVariableError`, exit status 2), and the code that reads a variable later gets the
same line. Variables read by torch or numba only (``OMP_NUM_THREADS``, ``NUMBA_*``) are theirs to check.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Dict, Optional, Tuple

from .errors import UserError

__all__ = ["EnvironmentVariableError", "Variable", "VARIABLES", "KERNEL_BACKEND_NAMES", "MAX_SECONDS", "read", "check"]

# the names DGL_EXACT_BACKEND accepts: dgl_exact.kernels.spec.BACKENDS and its deprecated aliases (a test
# keeps the two lists equal; this module sits below kernels and cannot import them)
KERNEL_BACKEND_NAMES = ("ext", "numba", "dgl", "torch", "cuda")
_FLAG_VALUES = {"1": True, "true": True, "t": True, "yes": True, "y": True, "on": True,
                "0": False, "false": False, "f": False, "no": False, "n": False, "off": False}  # click's words


class EnvironmentVariableError(UserError, ValueError):
    """An environment variable with a value dgl_exact cannot use (one line; a ``ValueError`` too)."""


@dataclasses.dataclass(frozen=True)
class Variable:
    """One environment variable: ``parse`` turns its text into a value or raises ``ValueError``;
    ``expected`` says in words what it accepts."""

    name: str
    parse: Callable[[str], Any]
    expected: str
    default: Any
    doc: str


def _integer(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text.strip())
        if not minimum <= value <= maximum:
            raise ValueError(text)
        return value

    return parse


def _seconds(text: str) -> float:
    value = float(text.strip())
    if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
        raise ValueError(text)
    return value


def _flag(text: str) -> bool:
    return _FLAG_VALUES[text.strip().lower()]  # KeyError is caught as a bad value below


def _choice(names: Tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in names:
            raise ValueError(text)
        return text

    return parse


def _url(text: str) -> str:
    if "://" not in text or not text.split("://", 1)[1].strip():
        raise ValueError(text)
    return text


def _text(text: str) -> str:
    if not text.strip():
        raise ValueError(text)
    return text


MAX_SECONDS = 86400.0 * 999_999_999  # datetime.timedelta's longest (torch.distributed takes timeouts as one)
_MAX_PROCESSES = 2 ** 31 - 1  # torch.distributed keeps ranks as int32
_FLAG = "1, true, yes, on, 0, false, no or off"
_SECONDS = f"a number of seconds > 0 and at most {MAX_SECONDS:g}"

VARIABLES: Dict[str, Variable] = {v.name: v for v in [
    Variable("DGL_EXACT_BACKEND", _choice(KERNEL_BACKEND_NAMES), "one of ext, numba, dgl, torch", None,
             "force one kernel backend (dgl_exact.kernels)"),
    Variable("DGL_EXACT_BUILD_CPU_EXT", _flag, _FLAG, False, "use the CPU part of the compiled extension"),
    Variable("DGL_EXACT_VERBOSE_BUILD", _flag, _FLAG, False, "show the compiler's output when building the extension"),
    Variable("DGL_EXACT_DATA", _text, "a folder path", "data", "where datasets are kept (--data-root's default)"),
    Variable("DGL_REPO", _url, "a URL such as https://data.dgl.ai/", None,
             "DGL's download server (dgl_exact.data.dgl_builtin builds its URLs as DGL does)"),
    Variable("DGL_EXACT_ALLOW_DIRTY", _flag, _FLAG, False, "--allow-dirty of the bench commands"),
    Variable("DGL_EXACT_DIST_TIMEOUT", _seconds, _SECONDS, None,
             "timeout of a training step's collectives (--dist-timeout's default)"),
    Variable("DGL_EXACT_DIST_SETUP_TIMEOUT", _seconds, _SECONDS, None,
             "timeout of the waits for rank-0-only work"),
    Variable("DGL_EXACT_NPROC_CHILD", _choice(("0", "1")), "0 or 1", "0",
             "set to 1 by train --nproc in the processes it starts"),
    Variable("DGL_EXACT_OVERSUBSCRIBE", _flag, _FLAG, False, "let --nproc start more CPU workers than cores"),
    # torchrun's (and train --nproc's) description of a data-parallel job
    Variable("WORLD_SIZE", _integer(1, _MAX_PROCESSES), f"an integer from 1 to {_MAX_PROCESSES}", 1,
             "processes in the job"),
    Variable("RANK", _integer(0, _MAX_PROCESSES - 1), "an integer >= 0 below WORLD_SIZE", 0, "this process's rank"),
    Variable("LOCAL_WORLD_SIZE", _integer(1, _MAX_PROCESSES), f"an integer from 1 to {_MAX_PROCESSES}", None,
             "processes on this machine"),
    Variable("LOCAL_RANK", _integer(0, _MAX_PROCESSES - 1), "an integer >= 0 below LOCAL_WORLD_SIZE", None,
             "this process's rank on its machine"),
    Variable("MASTER_ADDR", _text, "a host name or address", None, "where rank 0 listens"),
    Variable("MASTER_PORT", _integer(1, 65535), "a TCP port from 1 to 65535", None, "the port rank 0 listens on"),
]}


def _message(variable: Variable, value: str, expected: Optional[str] = None) -> str:
    return f"environment variable {variable.name}={value!r}: expected {expected or variable.expected}"


def read(name: str, default: Any = ...) -> Any:
    """The value of the declared variable ``name`` (unset or empty: ``default``, else its declared default);
    :class:`EnvironmentVariableError` for a value it does not accept."""
    variable = VARIABLES[name]
    text = os.environ.get(name)
    if text is None or text == "":
        return variable.default if default is ... else default
    try:
        return variable.parse(text)
    except (ValueError, KeyError, OverflowError):
        raise EnvironmentVariableError(_message(variable, text)) from None


def check() -> None:
    """Check every declared variable that is set, then the relations between them; the first bad one raises
    :class:`EnvironmentVariableError` (one line)."""
    for name in VARIABLES:
        read(name)
    for rank, size in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        if os.environ.get(rank) and os.environ.get(size) and read(rank) >= read(size):
            raise EnvironmentVariableError(_message(VARIABLES[rank], os.environ[rank],
                                                    f"an integer below {size}={os.environ[size]}"))
    if os.environ.get("LOCAL_WORLD_SIZE") and os.environ.get("WORLD_SIZE") and \
            read("LOCAL_WORLD_SIZE") > read("WORLD_SIZE"):
        raise EnvironmentVariableError(_message(VARIABLES["LOCAL_WORLD_SIZE"], os.environ["LOCAL_WORLD_SIZE"],
                                                f"at most WORLD_SIZE={os.environ['WORLD_SIZE']}"))
