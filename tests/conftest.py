import os

import pytest
import torch

# Numba CUDA kernels run on the CPU through Numba's simulator when there is no GPU. The variable must
# be set before numba.cuda is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import dgl_exact  # noqa: E402, F401  (installs the DGL compatibility shim before tests import dgl)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none visible to torch)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def one_thread():
    """One OpenMP thread for a module: on a small shared machine DGL's/torch's thread pools spin-wait for
    cores other processes hold (x15 slower on tiny graphs). Use with ``pytest.mark.usefixtures``."""
    from dgl.utils.internal import get_num_threads, set_num_threads

    previous = get_num_threads(), torch.get_num_threads()
    set_num_threads(1)
    torch.set_num_threads(1)
    yield
    set_num_threads(previous[0])
    torch.set_num_threads(previous[1])


@pytest.fixture(params=["dgl_kernels", "device_kernels"])
def kernel_path(request):
    """Run a test with DGL's CPU kernels, or with dgl_exact's torch kernels (the GPU code path)."""
    from dgl_exact.ops.structure import device_kernels_only

    if request.param == "device_kernels":
        with device_kernels_only():
            yield request.param
    else:
        yield request.param


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture
def meta_cases() -> tuple:
    """Per-group (min, max) pairs covering every branch of ``group_meta``: ordinary, constant (bf16-exact or
    not), signed zeros, denormals, huge values, NaN and infinities: 4000 ordinary groups, then 17 special
    ones (from index 4000), then 20000 random bit patterns."""
    g = torch.Generator().manual_seed(11)
    a = torch.randn(4000, generator=g) * torch.logspace(-30, 30, 4000)
    b = a + torch.rand(4000, generator=g) * a.abs()
    special = [(0.0, 0.0), (-0.0, 0.0), (1.0, 1.0), (3.14159, 3.14159), (-3.14159, -3.14159), (-1.0, 2.0),
               (1e-40, 1e-40), (-1e-40, 3e-40), (1e-45, 1e-45), (3e38, 3.4e38), (-3.4e38, 3.4e38),
               (-3.3e38, -3.3e38), (float("nan"), float("nan")), (float("-inf"), 1.0), (0.0, float("inf")),
               (float("-inf"), float("inf")), (5.0, 5.0000005)]
    # then every class of fp32 bit pattern (NaN payloads, denormals, both signs), ordered per pair
    r1 = torch.randint(-2**31, 2**31, (20000,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    r2 = torch.randint(-2**31, 2**31, (20000,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    mn = torch.cat([a, torch.tensor([p[0] for p in special]), torch.minimum(r1, r2)])
    mx = torch.cat([b, torch.tensor([p[1] for p in special]), torch.maximum(r1, r2)])
    return mn, mx


@pytest.fixture
def kept_compressed(monkeypatch):
    """The list of every compressed copy the ops keep from now on (``ops.keep.compress`` spied on), to
    rebuild expected gradients from the very same random rounding."""
    from dgl_exact.ops import keep as keeping

    kept = []
    real = keeping.compress

    def spy(x, cfg, seed=None):
        c = real(x, cfg, seed)
        kept.append(c)
        return c

    monkeypatch.setattr(keeping, "compress", spy)
    return kept


@pytest.fixture
def closed_stdin(monkeypatch):
    """Nothing may read stdin (a prompt would hang a terminal run and crash CI), and no DGL_REPO from the
    environment redirects DGL's downloads. Data tests use it for every test (``pytest.mark.usefixtures``)."""
    import io
    import sys

    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stdin", closed)
    monkeypatch.delenv("DGL_REPO", raising=False)


@pytest.fixture
def full_disk(monkeypatch):
    """Every file dgl_exact writes (all go through ``dgl_exact._files.atomic_write``) lands on a full disk: its
    temporary file ``.<name>.partial-*`` is opened on ``/dev/full``, whose writes fail with the kernel's own
    ENOSPC, so the writers' real error paths run (torch's zip writer, numpy, json, matplotlib). The file
    names stay real: what is left in the folder afterwards is what a full disk leaves."""
    import tempfile

    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        fd, path = real(*args, **kwargs)
        if ".partial-" in os.path.basename(path):
            os.close(fd)
            fd = os.open("/dev/full", os.O_WRONLY)
        return fd, path

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


# the benchmark commands refuse a checkout with uncommitted changes to the measured code unless told
# otherwise; tests run them on work in progress (their outputs then say "dirty tree")
os.environ.setdefault("DGL_EXACT_ALLOW_DIRTY", "1")
