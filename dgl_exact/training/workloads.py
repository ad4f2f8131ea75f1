"""What each model needs from its workload, in one table, and the one way a graph is prepared for a model.

The trainer (:class:`~dgl_exact.training.trainer.Trainer`), the memory planner
(:mod:`dgl_exact.planning.predict`, whose predictions are only as good as its sample graphs are prepared like
the trainer's) and the benchmarks (:class:`dgl_exact.bench.runner.Workload`) all read :data:`MODEL_TRAITS` and
call :func:`prepare_graph`; none keeps its own copy of these facts.

Preparing a graph for a model (:func:`prepare_graph`):

1. ids in int32 when the counts allow (:func:`~dgl_exact.data.compact.compact_graph`), except for the
   ``as_given`` layout;
2. a model with :attr:`ModelTraits.self_loops` gets exactly one self loop per node (existing self loops are
   removed first, unless the graph is known to hold one per node already);
3. the sparse formats the layout needs: ``training`` (full-graph training: CSC and CSR only, or the CSC
   alone without edge ids on a symmetric graph for a :attr:`ModelTraits.csc_only` model,
   :func:`~dgl_exact.data.compact.training_graph`), ``sampled`` (samplers and layer-wise evaluation read
   a COO: every format) or ``as_given`` (ids and formats untouched: the benchmarks' baselines).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Union

from .._compat import import_dgl
from ..data.compact import compact_graph, training_graph
from .pyg_models import PYG_GAT_HEADS, PYG_ONLY_NETWORKS


__all__ = ["ModelTraits", "MODEL_TRAITS", "PYG_MODEL_TRAITS", "PYG_MODELS", "SELF_LOOP_MODELS", "CSC_ONLY_MODELS",
           "LAYOUTS", "model_traits", "prepare_graph"]


@dataclasses.dataclass(frozen=True)
class ModelTraits:
    """The workload facts of one model name.

    ``self_loops``: trained on the graph with one self loop per node (GCN's normalisation counts the node
    itself, GAT attends to it, GCNII's propagation is GCN's). ``csc_only``: its backward has no transposed
    aggregation with edge weights (GAT's attention is one), so on a symmetric graph full-graph training holds
    the CSC alone. ``hidden``: the default width of ``dgl-exact bench`` and the planner (the EXACT benchmark's;
    GAT: per head). ``layers``: their default depth. ``heads``: attention heads (1: no attention)."""

    name: str
    self_loops: bool
    csc_only: bool
    hidden: int
    layers: int = 3
    heads: int = 1


#: the trainer's models (:data:`~dgl_exact.training.models.MODELS`) by name
MODEL_TRAITS: Dict[str, ModelTraits] = {t.name: t for t in (
    ModelTraits("gcn", self_loops=True, csc_only=True, hidden=256),
    ModelTraits("sage", self_loops=False, csc_only=True, hidden=128),
    ModelTraits("gat", self_loops=True, csc_only=False, hidden=128, heads=3),
    ModelTraits("gcn2", self_loops=True, csc_only=True, hidden=256),
)}
#: the PyG models of ``dgl-exact bench`` and ``dgl-exact plan`` (:mod:`~dgl_exact.training.pyg_models`' architectures
#: on PyG's layers, ``pyg-<model>``): no self loops added to the graph (PyG's GCNConv, GATConv and GCN2Conv add
#: their own); widths and depths those of the DGL models (GCNII's depth: ``--layers 16`` gives the EXACT benchmark's)
PYG_MODEL_TRAITS: Dict[str, ModelTraits] = {t.name: t for t in (
    ModelTraits("pyg-gcn", self_loops=False, csc_only=False, hidden=256),
    ModelTraits("pyg-sage", self_loops=False, csc_only=False, hidden=128),
    ModelTraits("pyg-gat", self_loops=False, csc_only=False, hidden=128, heads=PYG_GAT_HEADS),
    ModelTraits("pyg-gcn2", self_loops=False, csc_only=False, hidden=256),
    ModelTraits("pyg-gatv2", self_loops=False, csc_only=False, hidden=128, heads=PYG_GAT_HEADS),
)}
PYG_MODELS = tuple(PYG_MODEL_TRAITS)
#: the models trained with one self loop per node
SELF_LOOP_MODELS = tuple(name for name, t in MODEL_TRAITS.items() if t.self_loops)
#: the models that train from the CSC alone on a symmetric full graph
CSC_ONLY_MODELS = tuple(name for name, t in MODEL_TRAITS.items() if t.csc_only)
#: the graph layouts :func:`prepare_graph` makes
LAYOUTS = ("training", "sampled", "as_given")


def model_traits(model: Union[str, ModelTraits]) -> ModelTraits:
    """The :class:`ModelTraits` of a model name (``ValueError`` naming the known ones), or ``model`` itself. A
    network the trainer builds of PyG's layers alone (``gatv2``, ``--framework pyg``) has its ``pyg-`` row's."""
    if isinstance(model, ModelTraits):
        return model
    traits = MODEL_TRAITS.get(model) or PYG_MODEL_TRAITS.get(model)
    if traits is None and model in PYG_ONLY_NETWORKS:
        traits = PYG_MODEL_TRAITS[f"pyg-{model}"]
    if traits is None:
        raise ValueError(f"unknown model {model!r}; use one of {', '.join([*MODEL_TRAITS, *PYG_MODEL_TRAITS])}")
    return traits


def prepare_graph(graph, model: Union[str, ModelTraits], *, layout: str = "training", has_self_loops: bool = False,
                  csc_only: bool = True):
    """``graph`` prepared for ``model`` (a name of :data:`MODEL_TRAITS` or a :class:`ModelTraits`), in
    ``layout`` (see the module's docstring). ``has_self_loops``: ``graph`` holds exactly one self loop per
    node already (the loader's ``self_loop=True``): kept as it is. ``csc_only=False`` keeps the CSR too where
    the model alone would allow the CSC only (edge dropping and the inductive subgraph read more than the
    CSC). ``graph`` itself is not changed; node and edge data are shared."""
    traits = model_traits(model)
    if layout not in LAYOUTS:
        raise ValueError(f"unknown graph layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    g = graph if layout == "as_given" else compact_graph(graph)  # int32 first: the loop edits copy 32-bit lists
    if traits.self_loops and not has_self_loops:
        dgl = import_dgl()  # here, not at import: the planner imports this module where DGL is not installed
        g = dgl.add_self_loop(dgl.remove_self_loop(g))
    if layout == "training":
        return training_graph(g, csc_only=traits.csc_only and csc_only)
    return g if layout == "as_given" else compact_graph(g)
