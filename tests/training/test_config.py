"""TrainConfig (dgl_exact.training.config): strict types, from Python as from a ``--conf`` file; the bundled
configs.

Every bundled config that claims EXACT's hyperparameters equals EXACT's own recipe.

The table below is transcribed by hand from EXACT's repository (zirui-ray-liu/Exact, commit 495e422):
``mem_speed_bench/{non_ogb_datasets,arxiv,products}/conf/*.yaml`` and the training scripts beside them
(which add: no weight decay anywhere, Adam unless ``optim: rmsprop``, ``grad_norm`` from the conf for
arxiv/products, features standardised for Yelp and Reddit2 in ``data.py``, the ``reddit`` entry used for
``--dataset reddit2``). Keys are dgl_exact's ``TrainConfig`` names: ``hidden_channels`` -> ``hidden``,
``num_layers`` -> ``layers``, GraphSAINT ``batch_size`` (roots) -> ``saint_budget``, ClusterGCN
``batch_size`` -> ``parts_per_batch``, GCNII ``theta`` -> ``lambda_``.

``UNSUPPORTED`` lists EXACT settings dgl_exact cannot express yet; each must be explained in a comment
of the config (the words are looked for in it), so a difference is never silent.
"""
import numpy as np
import pytest

from dgl_exact.compression_config import CompressionConfig, set_config
from dgl_exact.training.config import CONFIG_DIR, FIELD_RULES, TrainConfig, bundled_configs, field_rule, load_conf

# EXACT's scripts: --dropout2 and --inductive off unless given; full-graph evaluation unless said below
_BASE = {"optimizer": "adam", "weight_decay": 0.0, "lr": 0.01, "loss": "ce", "dropout2": False, "inductive": False,
         "eval_batch_size": None, "edge_drop": 0.0, "use_labels": False, "use_attn_dst": True, "lr_warmup": 0}
# EXACT's arxiv scripts (train_full_batch.py, train_mini_batch.py): use_custom_loss defaults to true
_ARXIV = {"loss": "exact_log"}


def _full(dataset, model, layers, hidden, dropout, epochs, **kw):
    return {**_BASE, "dataset": dataset, "model": model, "sampler": "full", "layers": layers, "hidden": hidden,
            "dropout": dropout, "batch_norm": True, "epochs": epochs, **kw}


# nodes of the graph EXACT samples from (transductive: the whole graph)
NUM_NODES = {"flickr": 89250, "reddit": 232965, "reddit2": 232965, "yelp": 716847, "ogbn-arxiv": 169343}


def _saint(dataset, roots, walk, layers, hidden, dropout, epochs, **kw):
    # EXACT's non_ogb_datasets/train_mini_batch.py: num_steps = int(num_nodes / batch_size / walk_length)
    steps = int(NUM_NODES[dataset] / roots / walk) if dataset in NUM_NODES else None
    return {**_BASE, "dataset": dataset, "model": "sage", "sampler": "saint", "saint_mode": "walk",
            "saint_budget": roots, "walk_length": walk, "sample_coverage": 0, "saint_steps": steps, "layers": layers,
            "hidden": hidden, "dropout": dropout, "batch_norm": True, "epochs": epochs, **kw}


def _cluster(dataset, parts, per_batch, hidden, dropout, epochs, **kw):
    return {**_BASE, "dataset": dataset, "model": "sage", "sampler": "cluster", "num_parts": parts,
            "parts_per_batch": per_batch, "layers": 2, "hidden": hidden, "dropout": dropout, "batch_norm": True,
            "epochs": epochs, **kw}


EXACT = {}
for _name, _ds, _std in (("flickr", "flickr", False), ("reddit", "reddit", False), ("reddit2", "reddit2", True),
                         ("yelp", "yelp", True)):
    _s = {"standardize": True} if _std else {}
    _p = "yelp" if _ds == "yelp" else ("flickr" if _ds == "flickr" else "reddit")
    # non_ogb_datasets/conf/{gcn,sage,gcn2}.yaml
    _gcn = {"flickr": (2, 256, 0.3, 400), "reddit": (2, 256, 0.5, 400), "yelp": (2, 512, 0.1, 500)}[_p]
    EXACT[f"{_name}_gcn"] = _full(_ds, "gcn", *_gcn, **_s)
    EXACT[f"{_name}_sage"] = _full(_ds, "sage", *_gcn, **_s)
    _g2 = {"flickr": (8, 256, 0.5, 400, 0.1), "reddit": (4, 256, 0.5, 400, 0.1), "yelp": (4, 512, 0.0, 500, 0.2)}[_p]
    EXACT[f"{_name}_gcn2"] = _full(_ds, "gcn2", *_g2[:4], alpha=_g2[4], lambda_=0.5, shared_weights=False,
                                   residual=False, identity_mapping=True, **_s)
    # non_ogb_datasets/conf/saint_sage.yaml
    _sa = {"flickr": (6000, 2, 2, 256, 0.2, 15), "reddit": (2000, 4, 2, 128, 0.1, 40),
           "yelp": (1250, 2, 2, 512, 0.1, 75)}[_p]
    EXACT[f"{_name}_saint_sage"] = _saint(_ds, *_sa, **_s)
    # non_ogb_datasets/conf/cluster_gcn.yaml
    _cl = {"flickr": (1000, 30, 256, 0.2, 15), "reddit": (1500, 20, 128, 0.2, 40), "yelp": (5000, 20, 512, 0.1, 75)}[_p]
    EXACT[f"{_name}_cluster_sage"] = _cluster(_ds, *_cl, **_s)

# arxiv/conf/*.yaml
EXACT["arxiv_gcn"] = _full("ogbn-arxiv", "gcn", 3, 128, 0.5, 500, grad_norm=0.5, **_ARXIV)
EXACT["arxiv_sage"] = _full("ogbn-arxiv", "sage", 3, 128, 0.5, 500, grad_norm=0.5, **_ARXIV)
EXACT["arxiv_gcn2"] = _full("ogbn-arxiv", "gcn2", 16, 256, 0.1, 1000, alpha=0.5, lr=0.001, grad_norm=0.5,
                            shared_weights=False, residual=True, identity_mapping=False,  # no theta: beta = 1
                            **_ARXIV)
# arxiv/conf/gat.yaml: edge_drop, use_attn_dst, residual; use_labels/mask_rate and adjust_lr (warm-up over
# 50 epochs in train_full_batch.py's adjust_learning_rate)
EXACT["arxiv_gat"] = _full("ogbn-arxiv", "gat", 3, 128, 0.75, 2000, heads=3, input_dropout=0.25,
                           optimizer="rmsprop", lr=0.002, edge_drop=0.7, use_attn_dst=False, residual=True,
                           use_labels=True, mask_rate=0.5, lr_warmup=50, **_ARXIV)
EXACT["arxiv_saint_sage"] = _saint("ogbn-arxiv", 10000, 3, 3, 256, 0.5, 500, grad_norm=0.5, **_ARXIV)
# products/conf/*.yaml (GraphSAINT roots and ClusterGCN batch size come from EXACT's command line);
# products/train_mini_batch.py evaluates layer-wise: NeighborSampler(sizes=[-1], batch_size=4096)
EXACT["products_sage"] = _full("ogbn-products", "sage", 3, 256, 0.5, 500, batch_norm=False, lr=0.002, grad_norm=0.5)
EXACT["products_saint_sage"] = {k: v for k, v in _saint("ogbn-products", None, 3, 3, 256, 0.5, 20, batch_norm=False,
                                                         saint_steps=30, eval_batch_size=4096).items()
                                if k != "saint_budget"}
EXACT["products_cluster_sage"] = {k: v for k, v in _cluster("ogbn-products", 15000, None, 256, 0.5, 50,
                                                            batch_norm=False, lr=0.001, layers=3,
                                                            eval_batch_size=4096).items()
                                  if k != "parts_per_batch"}

UNSUPPORTED = {
    "products_saint_sage": [("roots from the command line", ["--batch_size"])],
    "products_cluster_sage": [("batch size from the command line", ["--batch_size"])],
}


def _claims_exact(name):
    with open(f"{CONFIG_DIR}/{name}.yaml") as f:
        return "EXACT" in f.readline()


def test_every_exact_config_is_in_the_table():
    claiming = {n for n in bundled_configs() if _claims_exact(n)}
    assert claiming == set(EXACT), (sorted(claiming - set(EXACT)), sorted(set(EXACT) - claiming))


@pytest.mark.parametrize("name", sorted(EXACT))
def test_config_equals_exact(name):
    conf = load_conf(name)
    got = TrainConfig(**conf).to_dict()
    diff = {k: (got.get(k), v) for k, v in EXACT[name].items() if got.get(k) != v}
    assert not diff, f"{name}: (ours, EXACT's) {diff}"
    if "standardize" not in EXACT[name]:
        assert not got["standardize"], name


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_differences_are_explained_in_the_config(name):
    with open(f"{CONFIG_DIR}/{name}.yaml") as f:
        comments = "\n".join(line for line in f if line.startswith("#"))
    for what, words in UNSUPPORTED[name]:
        assert all(w in comments for w in words), f"{name}: EXACT's {what} is not explained ({words})"


def test_exact_steps_per_epoch_reach_the_sampler():
    from dgl_exact.training.trainer import Trainer

    conf = {**load_conf("flickr_saint_sage"), "dataset": "synthetic-small", "saint_budget": 50, "epochs": 1,
            "device": "cpu"}
    trainer = Trainer(TrainConfig(**conf), progress=False, log=lambda *a, **k: None)
    sampler = trainer.sampler
    assert len(sampler) == 7    # the config's saint_steps (the sampler's own default here: ceil(2000 / 150) = 14)


# ------------------------------------------------------------------------------------------------
# TrainConfig: strict types, from Python as from a --conf file
# ------------------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _restore_global_config():
    """Every test starts from the documented default and leaves the process-wide default as it found it."""
    previous = set_config(CompressionConfig())
    yield
    set_config(previous)


@pytest.mark.parametrize("field, bad, needle", [
    ("bits", 2.7, "bits must be an int in {1, 2, 4, 8}, got 2.7 (float)"),
    ("bits", 2.0, "got 2.0 (float)"),
    ("bits", "2", "got '2' (str)"),
    ("bits", True, "got True (bool)"),
    ("act_fp", "false", "act-fp must be true or false, got 'false' (str)"),
    ("act_fp", 0, "got 0 (int)"),
    ("amp", np.bool_(True), "amp must be true or false"),
    ("lr", "1e-3", "lr must be a number > 0, got '1e-3' (str)"),
    ("lr", float("nan"), "got nan (float)"),
    ("lr", True, "got True (bool)"),
    ("epochs", 2.5, "epochs must be an int in [1, 2**31 - 1], got 2.5 (float)"),
    ("epochs", 0, "got 0 (int)"),
    ("dataset", 5, "dataset must be a string, got 5 (int)"),
    ("model", "GCN", "model must be one of gcn"),
    ("kept_frac", float("inf"), "kept-frac must be a number in (0, 1]"),
    ("dropout", 1.0, "dropout must be a number in [0, 1)"),
    ("weight_decay", -1e-4, "weight-decay must be a number >= 0"),
    ("grad_norm", "1", "grad-norm must be a number > 0 or null (None)"),
    ("seed", 2**64, "seed must be an int in [0, 2**64 - 1]"),
    ("seed", -1, "seed must be an int in [0, 2**64 - 1]"),
    ("lambda_", -0.5, "lambda must be a number >= 0"),
    ("sample_coverage", 0.5, "sample-coverage must be an int in [0, 2**31 - 1]"),
    ("hidden", 2**31, "hidden must be an int in [1, 2**31 - 1], got 2147483648 (int)"),
    ("heads", 10**30, "heads must be an int in [1, 2**31 - 1]"),
    ("block_rows", 10**30, "block-rows must be an int in [1, 2**31 - 1]"),
    ("batch_size", 2**31, "batch-size must be an int in [1, 2**31 - 1] or null"),
    ("saint_budget", 2**63, "saint-budget must be an int in [1, 2**31 - 1]"),
    ("num_parts", 2**40, "num-parts must be an int in [1, 2**31 - 1]"),
    ("epochs", 2**31, "epochs must be an int in [1, 2**31 - 1]"),
])
def test_train_config_types_are_strict(field, bad, needle):
    """``TrainConfig(bits=2.7)`` used to train INT2, ``act_fp="false"`` turned compression off, ``lr="1e-3"``
    failed with a comparison error: every field now refuses the wrong type with a message naming the field,
    the value and its type."""
    with pytest.raises(ValueError) as err:
        TrainConfig(**{field: bad})
    assert needle in str(err.value)


def test_train_config_normalises_numbers():
    cfg = TrainConfig(lr=1, kept_frac=np.float32(0.5), hidden=np.int64(16), seed=2**64 - 1, grad_norm=2)
    assert (type(cfg.lr), type(cfg.kept_frac), type(cfg.hidden), type(cfg.grad_norm)) == (float, float, int, float)
    assert cfg.lr == 1.0 and cfg.hidden == 16 and cfg.seed == 2**64 - 1
    with pytest.raises(ValueError, match=r"seed \+ runs - 1"):
        TrainConfig(seed=2**64 - 1, runs=2)
    with pytest.raises(ValueError, match="bits"):
        TrainConfig().replace(bits=3)


def test_every_train_config_field_has_a_rule():
    """New fields slot in: a field without a FIELD_RULES entry is checked by its annotation."""
    for name in TrainConfig.fields():
        assert field_rule(name) is not None, f"{name}: add a FIELD_RULES entry"
    assert set(FIELD_RULES) <= set(TrainConfig.fields())


def test_yaml_numbers_are_read_as_yaml_1_2(tmp_path):
    """PyYAML (YAML 1.1) reads ``1e-3`` as a string; a --conf file reads it as the float it means."""
    conf = tmp_path / "c.yaml"
    conf.write_text("lr: 1e-3\nweight_decay: 5E-4\nalpha: .5e-1\nkept-frac: 1.25e-1\nepochs: 3\ngrad_norm: null\n")
    values = load_conf(str(conf))
    assert values == {"lr": 0.001, "weight_decay": 0.0005, "alpha": 0.05, "kept_frac": 0.125, "epochs": 3,
                      "grad_norm": None}
    assert type(values["epochs"]) is int


def test_yaml_round_trip_of_a_config(tmp_path):
    """What the multi-process launcher writes (``yaml.safe_dump(cfg.to_dict())``) loads back equal."""
    import yaml

    cfg = TrainConfig(lr=1e-5, weight_decay=0.0, grad_norm=0.5, seed=2**63, kept_frac=0.125)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    assert TrainConfig(**load_conf(str(path))) == cfg


def test_train_config_holds_a_compression_config(tmp_path):
    """One CompressionConfig inside TrainConfig; its fields stay flat options (YAML, to_dict, checkpoints),
    stochastic and nonfinite included (the benchmarks used to drop them)."""
    import yaml

    assert TrainConfig().compression == CompressionConfig(bits=2)
    cfg = TrainConfig(bits=4, block_rows=8, stochastic=False, nonfinite="raise")
    assert cfg.compression == CompressionConfig(bits=4, block_rows=8, stochastic=False, nonfinite="raise")
    assert (cfg.bits, cfg.act_fp, cfg.stochastic) == (4, False, False)
    assert cfg.replace(act_fp=True).compression == cfg.compression.replace(enabled=False)
    given = TrainConfig(compression=CompressionConfig(bits=1, levels="optimal"), kept_frac=0.5)
    assert given.compression == CompressionConfig(bits=1, levels="optimal", kept_frac=0.5)
    assert TrainConfig(**cfg.to_dict()) == cfg and cfg.to_dict()["nonfinite"] == "raise"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    assert TrainConfig(**load_conf(str(path))) == cfg
    with pytest.raises(AttributeError):
        cfg.bits = 8
    with pytest.raises(ValueError, match="nonfinite must be one of propagate, raise"):
        TrainConfig(nonfinite="ignore")
    with pytest.raises(ValueError, match="compression must be a CompressionConfig"):
        TrainConfig(compression={"bits": 2})


def test_accuracy_grid_trains_the_whole_compression_setting(monkeypatch):
    from dgl_exact.bench import runner
    from dgl_exact.planning.settings import Setting
    from dgl_exact.training import trainer as trainer_module

    seen = []

    class Recorder:
        def __init__(self, cfg, **kwargs):
            seen.append(cfg)

        def fit(self):
            raise StopIteration

    monkeypatch.setattr(trainer_module, "Trainer", Recorder)
    setting = CompressionConfig(bits=4, stochastic=False, nonfinite="raise", block_rows=2)
    for compression in (setting, None):
        with pytest.raises(StopIteration):
            runner.accuracy_grid(None, TrainConfig(bits=8), [Setting("s", "exact", compression)], 3, None, False)
    assert seen[0].compression == setting and seen[0].runs == 3
    assert seen[1].compression == CompressionConfig(bits=8, enabled=False)
