"""Everything a training run is configured by, validated in one place, loadable from YAML.

Every :class:`TrainConfig` field is checked against :data:`FIELD_RULES` (a fields's own annotation
when it has no entry there), whether the config comes from Python, a ``--conf`` YAML file or the
command line. Types are strict: nothing is coerced. An int field refuses ``2.7`` (and ``2.0``), a bool
field refuses ``"false"`` and ``1``, a number field refuses the string ``"0.01"``; numbers must be
finite. YAML files are read as YAML 1.2 reads numbers: ``1e-3`` is the float 0.001 (YAML 1.1, and so
PyYAML, would read it as a string), while a quoted ``"1e-3"`` stays a string and is refused.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import os
import re
from typing import Any, Dict, Optional, Tuple

import yaml

from ..compression_config import MAX_BLOCK_ROWS, VALID_BITS, VALID_LEVELS, CompressionConfig
from .models import MODELS, recompute_length
from .pyg_models import PYG_ONLY_NETWORKS

SAMPLERS = ("full", "saint", "cluster", "neighbor")
#: the models a run may name: the trainer's (both frameworks) and those built of PyG's layers alone (framework pyg)
TRAIN_MODELS = tuple(MODELS) + PYG_ONLY_NETWORKS
#: the layers a model is built of (TrainConfig.framework)
FRAMEWORKS = ("dgl", "pyg")
SAINT_MODES = ("node", "edge", "walk")
CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


MAX_SEED = 2**64 - 1  # torch.manual_seed takes up to 64 bits; numpy's SeedSequence any non-negative int
# sizes and counts (widths, heads, batch and sampler sizes, epochs): int32, what DGL's and torch's kernels index
# a dimension with in places, and far above anything trainable
MAX_COUNT = 2**31 - 1
_POWERS = {2**64 - 1: "2**64 - 1", 2**31 - 1: "2**31 - 1"}  # bounds as messages write them

DEFAULT_COMPRESSION = CompressionConfig(bits=2)
# The options that set TrainConfig.compression: CompressionConfig's fields, with act_fp for "not enabled"
# (derived, so a new CompressionConfig field becomes an option: test_config asks for its FIELD_RULES entry).
COMPRESSION_OPTIONS = tuple(f.name for f in dataclasses.fields(CompressionConfig) if f.name != "enabled") + ("act_fp",)


def compression_options(compression: CompressionConfig) -> Dict[str, Any]:
    """``compression`` as the flat options of a :class:`TrainConfig` (``enabled`` as ``act_fp``)."""
    values = dataclasses.asdict(compression)
    values["act_fp"] = not values.pop("enabled")
    return {name: values[name] for name in COMPRESSION_OPTIONS}


def with_compression_options(compression: CompressionConfig, options: Dict[str, Any]) -> CompressionConfig:
    """``compression`` with some flat options (:data:`COMPRESSION_OPTIONS`) changed, each checked by its
    rule first (ValueError naming the option)."""
    changes = {name: check_field(name, value) for name, value in options.items()}
    if "act_fp" in changes:
        changes["enabled"] = not changes.pop("act_fp")
    return compression.replace(**changes)


@dataclasses.dataclass(frozen=True)
class Rule:
    """What one :class:`TrainConfig` field accepts.

    ``kind`` is ``"int"`` (an integer, never a bool or a float), ``"number"`` (an int or a float, never a
    bool or a string; stored as a finite float), ``"bool"`` (True or False only), ``"str"`` (a string;
    an ``os.PathLike`` is stored as its string) or ``"choice"`` (one of ``choices``, exactly). ``lo`` /
    ``hi`` bound ints and numbers (inclusive unless ``lo_open`` / ``hi_open``); an int rule with
    ``choices`` accepts those values only. ``optional`` also accepts None. ``note`` ends the message.
    """

    kind: str
    lo: Optional[float] = None
    hi: Optional[float] = None
    lo_open: bool = False
    hi_open: bool = False
    choices: Tuple[Any, ...] = ()
    optional: bool = False
    note: str = ""

    def expected(self) -> str:
        """What the rule accepts, as the error message says it (``an int in {1, 2, 4, 8}``)."""
        if self.kind == "bool":
            text = "true or false"
        elif self.kind == "str":
            text = "a string"
        elif self.kind == "choice":
            text = "one of " + ", ".join(map(str, self.choices))
        elif self.choices:
            text = "an int in {" + ", ".join(map(str, self.choices)) + "}"
        else:
            text = ("an int" if self.kind == "int" else "a number") + self._range()
        return text + (" or null (None)" if self.optional else "")

    def _range(self) -> str:
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None:
            if self.kind == "int":
                return f" in [{lo}, {_POWERS.get(hi, hi)}]"
            return f" in {'(' if self.lo_open else '['}{lo:g}, {hi:g}{')' if self.hi_open else ']'}"
        if lo is not None:
            return f" {'>' if self.lo_open else '>='} {lo:g}"
        if hi is not None:
            return f" {'<' if self.hi_open else '<='} {hi:g}"
        return ""

    def check(self, label: str, value: Any) -> Any:
        """``value`` as stored (ints as int, numbers as float), or ValueError naming ``label``, the value,
        its type and what is expected."""
        if value is None and self.optional:
            return None
        ok, stored = self._accept(value)
        if not ok:
            hint = ""
            if isinstance(value, str) and self.kind in ("int", "number", "bool"):
                hint = " (a quoted value is a string: write it without quotes)"
            note = f" ({self.note})" if self.note else ""
            raise ValueError(f"{label} must be {self.expected()}{note}, got {value!r} ({type(value).__name__}){hint}")
        return stored

    def _accept(self, value: Any) -> Tuple[bool, Any]:
        if self.kind == "bool":
            return isinstance(value, bool), value
        if self.kind == "str":
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
            return isinstance(value, str), value
        if self.kind == "choice":
            return isinstance(value, str) and value in self.choices, value
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False, value
        if self.kind == "int":
            if not isinstance(value, numbers.Integral):
                return False, value
            value = int(value)
            if self.choices:
                return value in self.choices, value
        else:
            value = float(value)
            if not math.isfinite(value):
                return False, value
        lo_ok = self.lo is None or (value > self.lo if self.lo_open else value >= self.lo)
        hi_ok = self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)
        return lo_ok and hi_ok, value


# What each field accepts. A field missing here is checked by its annotation (int, float, bool, str,
# Optional[...]): add an entry when it needs a range or a set of choices.
FIELD_RULES: Dict[str, Rule] = {
    "dataset": Rule("str"),
    "model": Rule("choice", choices=TRAIN_MODELS),
    "sampler": Rule("choice", choices=SAMPLERS),
    "framework": Rule("choice", choices=FRAMEWORKS),
    "bits": Rule("int", choices=VALID_BITS),
    "kept_frac": Rule("number", 0.0, 1.0, lo_open=True, note="1 disables random projection"),
    "block_rows": Rule("int", 1, MAX_BLOCK_ROWS, note="rows sharing one min/scale; 1 = one per row"),
    "levels": Rule("choice", choices=VALID_LEVELS),
    "stochastic": Rule("bool", note="false: round to the nearest level (biased; for ablations)"),
    "nonfinite": Rule("choice", choices=("propagate", "raise")), "act_fp": Rule("bool"),
    "hidden": Rule("int", 1, MAX_COUNT), "layers": Rule("int", 1, MAX_COUNT), "heads": Rule("int", 1, MAX_COUNT),
    "dropout": Rule("number", 0.0, 1.0, hi_open=True), "input_dropout": Rule("number", 0.0, 1.0, hi_open=True),
    "alpha": Rule("number", 0.0, 1.0), "lambda_": Rule("number", 0.0),
    "edge_drop": Rule("number", 0.0, 1.0, hi_open=True, note="fraction of edges dropped per training forward"),
    "mask_rate": Rule("number", 0.0, 1.0, lo_open=True, hi_open=True,
                      note="use_labels: fraction of training nodes whose labels are inputs each epoch"),
    "lr_warmup": Rule("int", 0, MAX_COUNT, note="epochs of linear learning-rate warm-up; 0: none"),
    "optimizer": Rule("choice", choices=("adam", "rmsprop", "sgd")),
    "loss": Rule("choice", choices=("ce", "exact_log"), note="exact_log: EXACT's arxiv objective"),
    "lr": Rule("number", 0.0, lo_open=True), "weight_decay": Rule("number", 0.0),
    "grad_norm": Rule("number", 0.0, lo_open=True, optional=True),
    "epochs": Rule("int", 1, MAX_COUNT), "eval_every": Rule("int", 1, MAX_COUNT), "runs": Rule("int", 1, MAX_COUNT),
    "eval_batch_size": Rule("int", 1, MAX_COUNT, optional=True,
                            note="layer-wise evaluation in batches of this many nodes; null: whole graph at once"),
    "seed": Rule("int", 0, MAX_SEED, note="torch takes 64-bit seeds; run r uses seed + r"),
    "saint_mode": Rule("choice", choices=SAINT_MODES), "saint_budget": Rule("int", 1, MAX_COUNT),
    "walk_length": Rule("int", 1, MAX_COUNT),
    "sample_coverage": Rule("int", 0, MAX_COUNT, note="0 skips GraphSAINT's normalisation pre-sampling"),
    "saint_steps": Rule("int", 1, MAX_COUNT, optional=True,
                        note="GraphSAINT subgraphs per epoch; null: from the budget"),
    "num_parts": Rule("int", 1, MAX_COUNT), "parts_per_batch": Rule("int", 1, MAX_COUNT),
    "fanouts": Rule("str", optional=True, note="neighbor sampler: one fan-out per layer such as 15,10,5; -1: all"),
    "batch_size": Rule("int", 1, MAX_COUNT, optional=True, note="neighbor sampler: seed nodes per batch; null: 1024"),
    "device": Rule("str"), "data_root": Rule("str"),
    "recompute": Rule("str", optional=True,
                      note="GCNII: layers per recomputed segment (an int or auto = round(sqrt(layers))); null: off"),
}

_ANNOTATION_RULES = {"int": Rule("int"), "float": Rule("number"), "bool": Rule("bool"), "str": Rule("str")}


def field_rule(name: str) -> Optional[Rule]:
    """The rule of field ``name``: its :data:`FIELD_RULES` entry, else one from its annotation (None when
    the annotation is not a plain int, float, bool or str, optionally ``Optional[...]``)."""
    if name in FIELD_RULES:
        return FIELD_RULES[name]
    annotation = {f.name: f.type for f in dataclasses.fields(TrainConfig)}.get(name)
    if not isinstance(annotation, str):
        annotation = getattr(annotation, "__name__", str(annotation))
    inner = re.fullmatch(r"(?:typing\.)?Optional\[(\w+)\]|(\w+) \| None|(\w+)", annotation.strip())
    if inner is None:
        return None
    base = next(g for g in inner.groups() if g)
    rule = _ANNOTATION_RULES.get(base)
    return dataclasses.replace(rule, optional=True) if rule is not None and not inner.group(3) else rule


def option_label(name: str) -> str:
    """How messages name field ``name``: as the command-line option without dashes (``kept-frac``)."""
    return "lambda" if name == "lambda_" else name.replace("_", "-")


def check_field(name: str, value: Any) -> Any:
    """``value`` validated (and normalised: ints as int, numbers as float) for field ``name``; ValueError
    if it does not fit, naming the field, the value, its type and what is expected."""
    rule = field_rule(name)
    return value if rule is None else rule.check(option_label(name), value)


@dataclasses.dataclass
class TrainConfig:
    """A training run. Field names match the ``dgl-exact train`` options (``--kept-frac`` -> ``kept_frac``).

    The activation compression is one :class:`~dgl_exact.compression_config.CompressionConfig`, ``compression``
    (default: INT2). As options (command line, YAML, :meth:`to_dict`, checkpoints) its fields are flat:
    ``bits``, ``kept_frac``, ``block_rows``, ``levels``, ``stochastic``, ``nonfinite`` and ``act_fp``
    (``not compression.enabled``). The constructor and :meth:`replace` take them too, applied on top of
    ``compression`` (``TrainConfig(bits=4)``, ``cfg.replace(act_fp=True)``), and reading them as attributes
    (``cfg.bits``) reads ``compression``. :meth:`fields` lists the options.
    """

    dataset: str = "cora"
    model: str = "gcn"
    sampler: str = "full"
    # the layers the model is built of: DGL's converted to dgl_exact's ("dgl"), or PyTorch Geometric's
    # converted by compress_model to dgl_exact.pyg's ("pyg"; whole graphs and the subgraph samplers)
    framework: str = "dgl"
    # activation compression; the constructor also takes its fields as flat options (see the class docstring)
    compression: CompressionConfig = DEFAULT_COMPRESSION
    amp: bool = False
    # model
    hidden: int = 64
    layers: int = 2
    dropout: float = 0.5
    input_dropout: float = 0.0
    dropout2: bool = False   # EXACT's --dropout2: non-inverted dropout (no 1/(1-p) in training, x (1-p) in eval)
    batch_norm: bool = False
    heads: int = 3
    alpha: float = 0.1
    lambda_: float = 0.5
    # GCNII options (EXACT's GCN2 model): separate weight for the initial representation when false, a
    # residual connection per layer, and beta = 1 in every layer (EXACT's arxiv run) when identity_mapping false
    shared_weights: bool = True
    residual: bool = False   # also GAT's: EXACT's arxiv GAT adds a bias-free linear map of each layer's input
    identity_mapping: bool = True
    # GCNII's recompute mode: segments of this many layers keep only their compressed input and re-run in
    # the backward (an int, "auto" = round(sqrt(layers)); None or 0: off). See models.GCNII.
    recompute: Optional[str] = None
    # EXACT's arxiv GAT: edges dropped per training forward; one attention vector for both edge ends when
    # use_attn_dst is false; labels as inputs (use_labels: a random mask_rate of the training nodes shows
    # its one-hot label, the loss is on the others; evaluation shows all training labels)
    edge_drop: float = 0.0
    use_attn_dst: bool = True
    use_labels: bool = False
    mask_rate: float = 0.5
    # optimisation
    loss: str = "ce"   # "ce" or "exact_log" (EXACT's arxiv objective, single-label only)
    optimizer: str = "adam"
    lr: float = 0.01
    lr_warmup: int = 0   # EXACT's adjust_lr: epoch e (1-based) <= N trains with lr * e / N (EXACT: N = 50)
    weight_decay: float = 5e-4
    grad_norm: Optional[float] = None
    epochs: int = 200
    eval_every: int = 1
    # evaluate layer by layer in batches of this many destination nodes (EXACT's products scripts)
    eval_batch_size: Optional[int] = None
    runs: int = 1
    seed: int = 0
    # samplers
    saint_mode: str = "walk"
    saint_budget: int = 3000
    walk_length: int = 2
    sample_coverage: int = 50
    saint_steps: Optional[int] = None   # GraphSAINT subgraphs per epoch; None: ceil(num_nodes / nominal size)
    num_parts: int = 1000
    parts_per_batch: int = 20
    # neighbour sampling (DGL's NeighborSampler): fan-out per layer, first layer first, as "15,10,5" (-1: all
    # in-neighbours; None: 10 per layer), and seed nodes per batch (None: 1024)
    fanouts: Optional[str] = None
    batch_size: Optional[int] = None
    # EXACT's --inductive: train on the subgraph induced by the training nodes, evaluate on the full graph
    inductive: bool = False
    # where
    device: str = "auto"
    data_root: str = "data"
    # data preprocessing: EXACT's (x - mean) / std of the features (its recipe for yelp and reddit2)
    standardize: bool = False

    def __post_init__(self):
        """Checks every field against its rule (:data:`FIELD_RULES`); ValueError on the first that fails."""
        if not isinstance(self.compression, CompressionConfig):
            raise ValueError(f"compression must be a CompressionConfig, got {type(self.compression).__name__}")
        if isinstance(self.recompute, int) and not isinstance(self.recompute, bool):
            self.recompute = str(self.recompute)
        for f in dataclasses.fields(self):
            if f.name != "compression":
                setattr(self, f.name, check_field(f.name, getattr(self, f.name)))
        self._check_neighbor_options()
        self._check_recompute()
        self._check_framework()
        if self.seed + self.runs - 1 > MAX_SEED:
            raise ValueError(f"seed + runs - 1 must be <= 2**64 - 1 (run r uses seed + r), got seed {self.seed} "
                             f"with {self.runs} runs")

    def _check_framework(self) -> None:
        """``framework: pyg``: PyTorch Geometric installed, and none of the options only the DGL-built models have
        (EXACT's GAT and GCNII variants, non-inverted dropout, input dropout)."""
        if self.framework != "pyg":
            if self.model in PYG_ONLY_NETWORKS:
                raise ValueError(f"{self.model} is built of PyG's layers only: add --framework pyg (pip install "
                                 f"'dgl-exact[pyg]'), or use a model of framework {self.framework}: "
                                 f"{', '.join(MODELS)}")
            return
        import importlib.util

        if importlib.util.find_spec("torch_geometric") is None:
            raise ValueError("framework pyg needs PyTorch Geometric: pip install 'dgl-exact[pyg]'")
        if self.eval_batch_size is not None:
            raise ValueError("framework pyg evaluates on the whole graph (its models have no layer-wise "
                             "evaluation): leave --eval-batch-size unset")
        defaults = {"input_dropout": 0.0, "dropout2": False, "edge_drop": 0.0, "residual": False,
                    "use_attn_dst": True, "shared_weights": True, "identity_mapping": True, "recompute": None}
        given = [name for name, value in defaults.items() if getattr(self, name) != value]
        if given:
            raise ValueError(f"framework pyg builds PyG's GCN, GraphSAGE, GAT and GCNII without "
                             f"{', '.join('--' + option_label(n) for n in given)}: leave "
                             f"{'them' if len(given) > 1 else 'it'} at the default or use framework dgl")

    def _check_recompute(self) -> None:
        """``recompute``: a segment length, ``auto`` or off; GCNII's only."""
        if self.recompute is None:
            return
        try:
            length = recompute_length(self.recompute, self.layers)
        except ValueError:
            raise ValueError(f"recompute must be a positive number of layers per segment, 0 (off) or auto; "
                             f"got {self.recompute!r}") from None
        if length and self.model != "gcn2":
            raise ValueError(f"recompute is a GCNII (gcn2) option; {self.model} has none (leave it out)")

    def _check_neighbor_options(self) -> None:
        """The neighbour sampler's options go with ``sampler: neighbor`` only; its fan-outs are one per layer
        (stored canonically, ``15,10,5``); models without a block form are refused with it."""
        if self.sampler != "neighbor":
            given = [name for name in ("fanouts", "batch_size") if getattr(self, name) is not None]
            if given:
                names = " and ".join("--" + option_label(n) for n in given)
                raise ValueError(f"{names} {'are options' if len(given) > 1 else 'is an option'} of the neighbour "
                                 f"sampler: add --sampler neighbor (now {self.sampler}) or leave "
                                 f"{'them' if len(given) > 1 else 'it'} out")
            return
        from .neighbor import format_fanouts, parse_fanouts

        if self.fanouts is not None:
            fanouts = parse_fanouts(self.fanouts)
            if len(fanouts) != self.layers:
                example = ",".join(["10"] * self.layers)
                raise ValueError(f"fanouts {self.fanouts!r} gives {len(fanouts)} fan-out(s) for {self.layers} "
                                 f"layer(s): give one per layer (e.g. --fanouts {example}), or --layers "
                                 f"{len(fanouts)}")
            self.fanouts = format_fanouts(fanouts)
        if self.model == "gcn2" and self.framework != "pyg":  # (PyG's runs on the sampled subgraph)
            raise ValueError("gcn2 (GCNII) runs on whole (sub)graphs: every layer mixes in the initial "
                             "representation of the same nodes, which a block's shrinking node sets do not hold; "
                             "use --sampler full, saint or cluster, or another model with --sampler neighbor")
        if self.edge_drop:
            raise ValueError("edge-drop needs whole (sub)graphs, not neighbour-sampled blocks; leave it at 0 "
                             "with --sampler neighbor")

    def neighbor_fanouts(self):
        """The neighbour sampler's fan-outs as ints, one per layer (default 10 each)."""
        from .neighbor import DEFAULT_FANOUT, parse_fanouts

        return parse_fanouts(self.fanouts) if self.fanouts is not None else [DEFAULT_FANOUT] * self.layers

    def to_dict(self) -> Dict[str, Any]:
        """The options of this run, flat (``compression`` as its options: ``bits``, ``act_fp``, ...), in the
        order of :meth:`fields`; ``TrainConfig(**cfg.to_dict()) == cfg``."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name == "compression":
                out.update(compression_options(self.compression))
            else:
                out[f.name] = getattr(self, f.name)
        return out

    def replace(self, **changes) -> "TrainConfig":
        """A copy with some options changed (flat compression options included), validated."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def fields(cls):
        """The option names: every field, with ``compression`` given as its flat options."""
        names = []
        for f in dataclasses.fields(cls):
            names += list(COMPRESSION_OPTIONS) if f.name == "compression" else [f.name]
        return names


def _accept_compression_options(cls):
    """Let the dataclass constructor of ``cls`` take the flat compression options (``bits=2``, ...) too:
    they are checked by their option rules and applied on top of ``compression``."""
    generated = cls.__init__

    @functools.wraps(generated)
    def __init__(self, *args, **kwargs):
        options = {name: kwargs.pop(name) for name in COMPRESSION_OPTIONS if name in kwargs}
        generated(self, *args, **kwargs)
        if options:
            self.compression = with_compression_options(self.compression, options)

    cls.__init__ = __init__
    for name in COMPRESSION_OPTIONS:  # read-only: change them with replace()
        setattr(cls, name, property(lambda self, name=name: compression_options(self.compression)[name],
                                    doc=f"``{name}`` of ``compression`` (read-only; see the class docstring)."))
    return cls


TrainConfig = _accept_compression_options(TrainConfig)


def resolve_conf_path(conf: str) -> str:
    """A YAML path, or the name of a bundled config (``arxiv_sage`` -> ``dgl_exact/configs/arxiv_sage.yaml``).
    FileNotFoundError if neither exists, ValueError if ``conf`` is a folder."""
    if os.path.exists(conf) and not os.path.isdir(conf):
        return conf
    candidate = os.path.join(CONFIG_DIR, conf if conf.endswith((".yaml", ".yml")) else conf + ".yaml")
    if os.path.isfile(candidate):
        return candidate
    if os.path.isdir(conf):
        raise ValueError(f"conf {conf}: is a folder; give a YAML file or one of the bundled configs "
                         f"({', '.join(bundled_configs())})")
    from ..errors import did_you_mean

    raise FileNotFoundError(f"config {conf!r} not found: give a YAML file path or a bundled config"
                            + did_you_mean(conf, bundled_configs(), "bundled"))


def bundled_configs():
    if not os.path.isdir(CONFIG_DIR):
        return []
    return sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))


class _ConfLoader(yaml.SafeLoader):
    """PyYAML's safe loader (plain data only), reading numbers as YAML 1.2 does, and refusing a key given
    twice in one mapping (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"key {key_node.value!r} given twice",
                                                            key_node.start_mark)
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) floats need a dot and a signed exponent: ``1e-3`` and ``1.0e3`` would be strings.
_ConfLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong and where."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else problem


def load_conf(conf: str) -> Dict[str, Any]:
    """Read a YAML file of ``TrainConfig`` defaults (keys may use dashes) and check every value as
    :class:`TrainConfig` does. Unknown keys, a key given twice, a value of the wrong type or range, a file
    that is not YAML or not a mapping: ValueError naming the file (``conf PATH: ...``)."""
    path = resolve_conf_path(conf)
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=_ConfLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ValueError(f"conf {path}: not valid YAML: {_yaml_problem(e)}") from None
    except UnicodeDecodeError:
        raise ValueError(f"conf {path}: not a text file (UTF-8 YAML expected)") from None
    except OSError as e:
        raise ValueError(f"conf {path}: cannot read it ({e.strerror or e})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"conf {path}: expected a mapping of option: value, got a {type(data).__name__}")
    out = {}
    known = TrainConfig.fields()
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name == "lambda":
            name = "lambda_"
        if not isinstance(key, str) or name not in known:
            raise ValueError(f"conf {path}: unknown option {key!r}; valid options: "
                             f"{', '.join(option_label(k) for k in known)}")
        if name in out:
            raise ValueError(f"conf {path}: {option_label(name)} given twice")
        try:
            out[name] = check_field(name, value)
        except ValueError as e:
            raise ValueError(f"conf {path}: {e}") from None
    return out
