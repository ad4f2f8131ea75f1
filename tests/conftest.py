import os

import pytest
import torch

# Numba CUDA kernels run on the CPU through Numba's simulator when there is no GPU. The variable must
# be set before numba.cuda is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import dgl_exact  # noqa: E402  (installs the DGL compatibility shim before tests import dgl)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none visible to torch)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
