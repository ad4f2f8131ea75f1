"""What to compress and how: an immutable :class:`CompressionConfig`, a process-wide default, and
scoped overrides (``with dgl_exact.config(bits=2): ...``) local to the current execution context.

Resolution order for an op: an explicit ``config=`` argument, else a module's ``compression=``,
else the innermost active ``dgl_exact.config(...)`` scope of the current context, else the global
default set by :func:`set_config` (initially ``CompressionConfig()``: INT8, no projection).

Scopes live in a :class:`contextvars.ContextVar`, not in thread-local storage: every thread has its own
context, and so does every asyncio task (a task starts with a copy of its creator's context), so a scope
entered in one task or thread is never seen by another, even when tasks interleave on one thread.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import threading
from typing import Iterator, Optional

from . import tracing

__all__ = ["CompressionConfig", "get_config", "set_config", "config", "resolve_config", "VALID_BITS", "MAX_BLOCK_ROWS",
           "VALID_LEVELS", "DISABLED", "ConfiguredModule"]

VALID_BITS = (1, 2, 4, 8)
# the kernels index groups in 64 bits, but the reference backend expands a group's (lo, step) to its rows
# (repeat_interleave) and the compiled one divides in 32 bits when it can; a block of a tensor's rows or more
# is one group per tensor anyway, so no tensor needs more (torch tensors past 2**31 rows are not trained on)
MAX_BLOCK_ROWS = 2 ** 31 - 1
VALID_LEVELS = ("uniform", "optimal")


@dataclasses.dataclass(frozen=True)
class CompressionConfig:
    """How saved activations are compressed.

    Parameters
    ----------
    bits : int, default 8
        Bits per stored value: 1, 2, 4 or 8.
    kept_frac : float, default 1.0
        Fraction of feature columns kept by the random projection, in (0, 1]. 1.0 disables projection;
        otherwise a D-wide activation is stored as ``ceil(kept_frac * D)`` projected columns.
    block_rows : int, default 1
        Consecutive rows that share one (min, step) pair. 1 is EXACT's per-row grouping; larger values
        are i-EXACT's block-wise quantization (less metadata, wider ranges). At most ``MAX_BLOCK_ROWS``
        (2**31 - 1).
    levels : {"uniform", "optimal"}, default "uniform"
        Quantization levels in code space. "optimal" uses levels that minimise the expected stochastic
        rounding variance under i-EXACT's clipped-normal model, for any bit width.
    stochastic : bool, default True
        Stochastic (unbiased) rounding. False rounds to the nearest level (biased; for ablations).
    enabled : bool, default True
        False keeps activations unquantised (the exact fp baseline with dgl_exact's memory-lean ops). A
        ``kept_frac`` below 1 still projects (EXACT's ``--act_fp --kept_frac``): the projected activation
        is kept in its own dtype.
    nonfinite : {"propagate", "raise"}, default "propagate"
        What a group containing NaN or Inf becomes. "propagate" decodes the whole group as NaN, so the
        gradient is visibly non-finite (GradScaler skips the step; ``clip_grad_norm_`` can error) and no
        finite-but-wrong gradient is ever produced, at no synchronisation cost. "raise" checks during
        compression and raises ``FloatingPointError`` (one device synchronisation per compression).
    """

    bits: int = 8
    kept_frac: float = 1.0
    block_rows: int = 1
    levels: str = "uniform"
    stochastic: bool = True
    enabled: bool = True
    nonfinite: str = "propagate"

    def __post_init__(self):
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or self.bits not in VALID_BITS:
            raise ValueError(f"bits must be one of {VALID_BITS}, got {self.bits!r}")
        try:
            if isinstance(self.kept_frac, (bool, str, bytes)):
                raise TypeError  # float(True) / float("0.5") would pass silently
            kept = float(self.kept_frac)
        except (TypeError, ValueError):
            raise ValueError(f"kept_frac must be a number in (0, 1], got {self.kept_frac!r}") from None
        if not (0.0 < kept <= 1.0) or math.isnan(kept):
            raise ValueError(f"kept_frac must be in (0, 1] (1.0 disables projection), got {self.kept_frac!r}")
        object.__setattr__(self, "kept_frac", kept)
        if (isinstance(self.block_rows, bool) or not isinstance(self.block_rows, int)
                or not 1 <= self.block_rows <= MAX_BLOCK_ROWS):
            raise ValueError(f"block_rows must be an integer from 1 to {MAX_BLOCK_ROWS} (2**31 - 1; 1 = one group "
                             f"per row, a block of at least a tensor's rows = one group per tensor), got "
                             f"{self.block_rows!r}")
        if self.levels not in VALID_LEVELS:
            raise ValueError(f"levels must be one of {VALID_LEVELS}, got {self.levels!r}")
        if not isinstance(self.stochastic, bool):
            raise ValueError(f"stochastic must be True or False, got {self.stochastic!r}")
        if not isinstance(self.enabled, bool):
            raise ValueError(f"enabled must be True or False, got {self.enabled!r}")
        if self.nonfinite not in ("propagate", "raise"):
            raise ValueError(f"nonfinite must be 'propagate' or 'raise', got {self.nonfinite!r}")

    def replace(self, **changes) -> "CompressionConfig":
        """A copy with some fields changed (validated like the constructor)."""
        return dataclasses.replace(self, **changes)

    def projected_width(self, width: int) -> int:
        """Columns stored for a ``width``-column activation: ``ceil(kept_frac * width)``, at least 1."""
        if self.kept_frac >= 1.0:
            return width
        # round first: 0.07 * 100 is 7.000000000000001 in binary floating point and must give 7, not 8
        return max(1, math.ceil(round(self.kept_frac * width, 9)))

    def describe(self) -> str:
        """A short human-readable label, e.g. ``INT2 kf=0.125 blocks=64 optimal``."""
        if not self.enabled:
            if self.kept_frac >= 1.0:
                return "fp (uncompressed)"
            return f"fp kf={self.kept_frac:g} (projected, unquantised)"
        parts = [f"INT{self.bits}"]
        if self.kept_frac < 1.0:
            parts.append(f"kf={self.kept_frac:g}")
        if self.block_rows > 1:
            parts.append(f"blocks={self.block_rows}")
        if self.levels != "uniform":
            parts.append(self.levels)
        if not self.stochastic:
            parts.append("nearest")
        return " ".join(parts)


_global_lock = threading.Lock()
_global_config = CompressionConfig()
# The active scopes, innermost last. An immutable tuple: a context copied into a new asyncio task shares
# its creator's value, and a scope entered by the task sets a new tuple in the task's own context only.
_scopes: contextvars.ContextVar = contextvars.ContextVar("dgl_exact_config_scopes", default=())


def _stack() -> list:
    """The active scopes of the current context, outermost first (a copy)."""
    return list(_scopes.get())


def get_config() -> CompressionConfig:
    """The configuration in force in the current context (innermost scope, else the global default).
    While dynamo traces, the one in force at trace time, baked into the compiled code (dynamo cannot read
    a ContextVar; see :mod:`dgl_exact.ops.captured`)."""
    if tracing.active():
        return config_at_trace()
    scopes = _scopes.get()
    return scopes[-1] if scopes else _global_config


def set_config(config: Optional[CompressionConfig] = None, **changes) -> CompressionConfig:
    """Set the process-wide default. Pass a :class:`CompressionConfig`, or field changes applied to the
    current default (``set_config(bits=2)``). Returns the previous default."""
    global _global_config
    if config is not None and not isinstance(config, CompressionConfig):
        raise TypeError(f"set_config expects a CompressionConfig, got {type(config).__name__}")
    with _global_lock:
        previous = _global_config
        base = config if config is not None else previous
        _global_config = base.replace(**changes) if changes else base
    return previous


@contextlib.contextmanager
def config(config: Optional[CompressionConfig] = None, **changes) -> Iterator[CompressionConfig]:
    """Scoped override for the current thread or asyncio task; nestable.
    ``with dgl_exact.config(bits=2, kept_frac=0.125):`` changes fields of the configuration in force;
    ``with dgl_exact.config(cfg):`` uses ``cfg``. Leaving the block restores exactly the scopes that were
    active on entry, in this context only."""
    if config is not None and not isinstance(config, CompressionConfig):
        raise TypeError(f"config expects a CompressionConfig, got {type(config).__name__}")
    base = config if config is not None else get_config()
    scoped = base.replace(**changes) if changes else base
    outer = _scopes.get()
    token = _scopes.set(outer + (scoped,))
    try:
        yield scoped
    finally:
        try:
            _scopes.reset(token)
        except ValueError:  # left in another context than entered (a generator resumed elsewhere):
            current = _scopes.get()  # drop this scope there, leave that context's other scopes alone
            if current and current[-1] is scoped:
                _scopes.set(current[:-1])


def resolve_config(explicit: Optional[CompressionConfig] = None) -> CompressionConfig:
    """``explicit`` if given (validated type), else the configuration in force."""
    if explicit is None:
        return get_config()
    if not isinstance(explicit, CompressionConfig):
        raise TypeError(f"expected a CompressionConfig or None, got {type(explicit).__name__}")
    return explicit


#: the configuration a module runs under outside training (nothing is kept for backward then)
DISABLED = CompressionConfig(enabled=False)


class ConfiguredModule:
    """Mixin of every compressed module (DGL's and PyG's drop-ins, the building blocks): ``compression``, a
    :class:`CompressionConfig` for this module or None to follow the configuration in force
    (``dgl_exact.config(...)`` scopes, then ``dgl_exact.set_config``), and the configuration a forward runs
    under (:data:`DISABLED` in ``eval()`` mode)."""

    compression: Optional[CompressionConfig] = None

    def _init_compression(self, compression: Optional[CompressionConfig]) -> None:
        if compression is not None and not isinstance(compression, CompressionConfig):
            raise TypeError("compression must be a dgl_exact.CompressionConfig or None, "
                            f"got {type(compression).__name__}")
        self.compression = compression

    def _config(self) -> CompressionConfig:
        if not self.training:
            return DISABLED
        return resolve_config(self.compression)


#: the fields of a :class:`CompressionConfig`, in order
CFG_FIELDS = tuple(f.name for f in dataclasses.fields(CompressionConfig))


@tracing.assume_constant
def _config_fields() -> tuple:
    cfg = get_config()
    return tuple(getattr(cfg, f) for f in CFG_FIELDS)


def config_at_trace() -> CompressionConfig:
    """:func:`get_config` while compiling: the configuration in force when dynamo traces, a constant of the
    compiled code (a later ``dgl_exact.config(...)`` scope does not recompile: set a module's
    ``compression`` or call ``torch._dynamo.reset()``)."""
    return CompressionConfig(**dict(zip(CFG_FIELDS, _config_fields())))
