"""Autograd ops that keep compressed activations (used by :mod:`dgl_exact.nn`); also every public function of
``dgl.ops``, with DGL's signatures and results (:mod:`.dgl_ops`)."""
from .dense import batch_norm, linear, linear_reusing
from .norm_act import batch_norm_relu_dropout
from .blocks import gelu, layer_norm, log_softmax, prelu, silu, softmax
from .elementwise import dropout, elu, leaky_relu, relu, relu_dropout
from .graph import copy_u_mean, copy_u_sum, edge_softmax, normalize_edge_weight, src_norm_sum, u_add_v, u_mul_e_sum
from .gat import gat_attention
from .gatv2 import gatv2_attention
from .sage import graph_conv_plus_linear, sage_mean
from .sage_norm import sage_mean_bn_relu_dropout
from . import gcn2
from .loss import binary_cross_entropy_with_logits, cross_entropy
from .structure import GraphStructure, is_symmetric, mark_symmetric, structure_of
from .routing import message_passing
from .functional import functional_ops

__all__ = ["linear", "linear_reusing", "batch_norm", "batch_norm_relu_dropout", "relu", "leaky_relu", "elu", "dropout",
           "relu_dropout",
           "copy_u_sum", "src_norm_sum", "mark_symmetric", "is_symmetric",
           "copy_u_mean", "u_mul_e_sum", "copy_u_max", "copy_u_min", "u_add_v", "edge_softmax", "gat_attention",
           "gatv2_attention",
           "cross_entropy", "binary_cross_entropy_with_logits", "normalize_edge_weight",
           "sage_mean", "graph_conv_plus_linear", "sage_mean_bn_relu_dropout", "gcn2", "GraphStructure", "structure_of",
           "layer_norm",
           "gelu", "silu", "prelu",
           "softmax", "log_softmax", "message_passing", "functional_ops"]

from . import dgl_ops as _dgl_ops  # noqa: E402

globals().update({_name: getattr(_dgl_ops, _name) for _name in _dgl_ops.__all__})
__all__ += [_name for _name in _dgl_ops.__all__ if _name not in __all__]
