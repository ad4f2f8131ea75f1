"""The compression math: quantization levels, random projection, compress/decompress."""
from .core import (CompressedTensor, compress, compressed_nbytes, decompress, draw_seed, fuses_with_activation,
                   relu_dropout_compress, seed_stream)
from .levels import expected_variance, model_sigma, optimal_levels, uniform_levels

__all__ = ["CompressedTensor", "compress", "decompress", "compressed_nbytes", "draw_seed", "optimal_levels",
           "uniform_levels", "expected_variance", "model_sigma", "relu_dropout_compress", "fuses_with_activation",
           "seed_stream"]
