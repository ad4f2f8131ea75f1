"""The one list of kernel ops (``dgl_exact.kernels.spec.OPS``) and the one selector (the registry).

Every op has every backend registered or a recorded reason; the registry refuses what the list does not
name; the chain per device, forcing, excluding and the deprecated backend name behave as documented.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from dgl_exact import kernels
from dgl_exact.kernels import extension, numba_kernels, reference
from dgl_exact.kernels.spec import BACKENDS, OPS


def test_every_op_has_every_backend_or_a_reason():
    status = kernels.available_backends()
    for name, op in OPS.items():
        assert set(op.backends) == set(BACKENDS), name
        for backend, v in op.backends.items():
            if isinstance(v, str):
                assert v.strip(), (name, backend)
                assert backend not in kernels._REGISTRY.get(name, {}), (name, backend)
                continue
            assert v and set(v) <= {"cpu", "cuda"}, (name, backend)
            if status[backend] != "available":
                continue  # the backend says why it is unavailable (status); nothing registered to check
            fn, devices = kernels._REGISTRY[name][backend]
            # a backend may serve fewer devices than the spec allows here (no GPU): never more
            assert devices and set(devices) <= set(v), (name, backend, devices)


def test_torch_reference_serves_every_op_on_every_device():
    kernels.available_backends()
    for name in OPS:
        fn, devices = kernels._REGISTRY[name]["torch"]
        assert set(devices) == {"cpu", "cuda"} and fn is getattr(reference, name), name


def test_backends_derive_their_op_lists_from_the_spec():
    assert set(extension.OPS) == {n for n, op in OPS.items() if op.devices("ext")}
    assert set(numba_kernels.OPS) == {n for n, op in OPS.items() if op.devices("numba")}
    for op in extension.OPS:
        assert extension.wrapper(op) is getattr(extension, op)


def test_register_refuses_what_the_spec_does_not_list():
    with pytest.raises(KeyError, match="spec"):
        kernels.register("no_such_op", "torch")(lambda: None)
    with pytest.raises(ValueError, match="does not list"):
        kernels.register("quantize_pack", "dgl", devices=("cpu",))(lambda: None)
    with pytest.raises(ValueError, match="unknown backend"):
        kernels.register("quantize_pack", "cuda")(lambda: None)


def test_fast_path_per_device():
    report = kernels.backend("cpu")
    status = kernels.available_backends()
    if status["dgl"] == "available":
        for op in ("spmm_sum", "spmm_minmax", "sddmm_dot", "edge_softmax"):
            assert report.ops[op] == "dgl", op
    if status["numba"] == "available":
        assert report.ops["quantize_pack"] == "numba" and report.ops["rademacher"] == "numba"
        assert report.ops["spmm_weighted_sum"] == "numba"  # DGL's broadcasts the weights: not on the chain
    assert kernels._CHAIN["cuda"][0] == "ext" and kernels._CHAIN["cpu"][0] == "dgl"


def test_exclude_is_the_gpu_code_path_on_cpu():
    from dgl_exact.ops.structure import device_kernels_only

    kernels.available_backends()
    with device_kernels_only():
        assert kernels.chosen("spmm_sum", "cpu") != "dgl"
        assert kernels.chosen("edge_softmax", "cpu") == "torch"
        with kernels.use_backend("dgl"):  # excluded wins over forced
            assert kernels.chosen("spmm_sum", "cpu") != "dgl"
    if kernels.available_backends()["dgl"] == "available":
        assert kernels.chosen("spmm_sum", "cpu") == "dgl"


def test_forcing_applies_to_the_ops_the_backend_implements():
    kernels.available_backends()
    with kernels.use_backend("torch"):
        assert all(kernels.chosen(op, "cpu") == "torch" for op in OPS)
    if kernels.available_backends()["numba"] == "available":
        with kernels.use_backend("numba"):
            assert kernels.chosen("quantize_pack", "cpu") == "numba"
            # numba has no unweighted sum (a recorded reason, no warning): the chain serves it
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert kernels.chosen("spmm_sum", "cpu") in ("dgl", "torch")


def test_old_backend_name_cuda_means_ext_with_a_deprecation_warning(monkeypatch):
    kernels.available_backends()
    with pytest.warns(DeprecationWarning, match="'ext'"):
        with kernels.use_backend("cuda"):
            assert kernels._forced() == "ext"
    monkeypatch.setenv(kernels.ENV_VAR, "cuda")
    monkeypatch.setattr(kernels, "_env_seen", {})
    with pytest.warns(DeprecationWarning, match="DGL_EXACT_BACKEND='cuda'"):
        assert kernels._forced() == "ext"
    monkeypatch.setenv(kernels.ENV_VAR, "nonsense")
    with pytest.raises(ValueError, match="DGL_EXACT_BACKEND='nonsense': expected one of ext, numba, dgl, torch"):
        kernels._forced()


def test_projection_matrix_is_one_registry_op():
    """Random projection regenerates its matrix with one op call (one launch on a GPU)."""
    from dgl_exact.bench.opcount import count_step
    from dgl_exact.compression.projection import rademacher

    counts = count_step(lambda: rademacher(128, 16, 5, "cpu"))
    assert counts.ops == 1 and dict(counts.per_op) == {"dgl_exact::rademacher": 1}
    assert torch.equal(rademacher(128, 16, 5, "cpu"), reference.rademacher(128, 16, 5, "cpu"))
