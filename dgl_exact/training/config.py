"""Everything a training run is configured by, validated in one place, loadable from YAML."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Optional

import yaml

from ..config import VALID_BITS, VALID_LEVELS, CompressionConfig
from .models import MODELS

SAMPLERS = ("full", "saint", "cluster")
SAINT_MODES = ("node", "edge", "walk")
CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


@dataclasses.dataclass
class TrainConfig:
    """A training run. Field names match the ``dgl-exact train`` options (``--kept-frac`` -> ``kept_frac``)."""

    dataset: str = "cora"
    model: str = "gcn"
    sampler: str = "full"
    # compression
    bits: int = 2
    kept_frac: float = 1.0
    block_rows: int = 1
    levels: str = "uniform"
    act_fp: bool = False
    amp: bool = False
    # model
    hidden: int = 64
    layers: int = 2
    dropout: float = 0.5
    input_dropout: float = 0.0
    batch_norm: bool = False
    heads: int = 3
    alpha: float = 0.1
    lambda_: float = 0.5
    # optimisation
    optimizer: str = "adam"
    lr: float = 0.01
    weight_decay: float = 5e-4
    grad_norm: Optional[float] = None
    epochs: int = 200
    eval_every: int = 1
    runs: int = 1
    seed: int = 0
    # samplers
    saint_mode: str = "walk"
    saint_budget: int = 3000
    walk_length: int = 2
    sample_coverage: int = 50
    num_parts: int = 1000
    parts_per_batch: int = 20
    # where
    device: str = "auto"
    data_root: str = "data"

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; choose one of {', '.join(MODELS)}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {self.sampler!r}; choose one of {', '.join(SAMPLERS)}")
        if self.bits not in VALID_BITS:
            raise ValueError(f"bits must be one of {', '.join(map(str, VALID_BITS))}, got {self.bits}")
        if not 0.0 < float(self.kept_frac) <= 1.0:
            raise ValueError(f"kept-frac must be in (0, 1] (1 disables random projection), got {self.kept_frac}")
        if self.levels not in VALID_LEVELS:
            raise ValueError(f"levels must be one of {', '.join(VALID_LEVELS)}, got {self.levels!r}")
        if self.saint_mode not in SAINT_MODES:
            raise ValueError(f"saint mode must be one of {', '.join(SAINT_MODES)}, got {self.saint_mode!r}")
        if self.optimizer not in ("adam", "rmsprop", "sgd"):
            raise ValueError(f"optimizer must be adam, rmsprop or sgd, got {self.optimizer!r}")
        for name in ("hidden", "layers", "epochs", "runs", "eval_every", "block_rows", "heads", "num_parts",
                     "parts_per_batch", "saint_budget", "walk_length"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("dropout", "input_dropout"):
            if not 0.0 <= float(getattr(self, name)) < 1.0:
                raise ValueError(f"{name.replace('_', '-')} must be in [0, 1), got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.grad_norm is not None and self.grad_norm <= 0:
            raise ValueError(f"grad-norm must be > 0, got {self.grad_norm}")

    @property
    def compression(self) -> CompressionConfig:
        """The activation compression of this run (disabled with ``act_fp``)."""
        return CompressionConfig(bits=self.bits, kept_frac=self.kept_frac, block_rows=self.block_rows,
                                 levels=self.levels, enabled=not self.act_fp)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def fields(cls):
        return [f.name for f in dataclasses.fields(cls)]


def resolve_conf_path(conf: str) -> str:
    """A YAML path, or the name of a bundled config (``arxiv_sage`` -> ``dgl_exact/configs/arxiv_sage.yaml``)."""
    if os.path.exists(conf):
        return conf
    candidate = os.path.join(CONFIG_DIR, conf if conf.endswith((".yaml", ".yml")) else conf + ".yaml")
    if os.path.exists(candidate):
        return candidate
    raise FileNotFoundError(f"config {conf!r} not found: give a YAML file path or one of the bundled configs "
                            f"({', '.join(bundled_configs())})")


def bundled_configs():
    if not os.path.isdir(CONFIG_DIR):
        return []
    return sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))


def load_conf(conf: str) -> Dict[str, Any]:
    """Read a YAML file of ``TrainConfig`` defaults (keys may use dashes); unknown keys are an error."""
    path = resolve_conf_path(conf)
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of option: value")
    out = {}
    known = set(TrainConfig.fields())
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name == "lambda":
            name = "lambda_"
        if name not in known:
            raise ValueError(f"{path}: unknown option {key!r}; known: {', '.join(sorted(known))}")
        out[name] = value
    return out
