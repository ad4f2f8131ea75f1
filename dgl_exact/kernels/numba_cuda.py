"""Placeholder: Numba CUDA kernels (filled in by the kernels work)."""


def load():
    return "not implemented"
