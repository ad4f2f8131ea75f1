import os

import pytest
import torch

# Numba CUDA kernels run on the CPU through Numba's simulator when there is no GPU. The variable must
# be set before numba.cuda is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import dgl_exact  # noqa: E402, F401


def _import_dgl() -> bool:
    """Import DGL through dgl_exact's shim (as the package's own modules do), before tests import dgl; False
    where it is not installed."""
    from dgl_exact._compat import import_dgl

    try:
        import_dgl()
    except ModuleNotFoundError as exc:
        if exc.name != "dgl":
            raise
        return False
    return True


#: whether DGL is installed: without it (the CI's no-DGL environment) the core and PyG tests run, and every
#: test file of the DGL front end skips at its top (``pytest.importorskip("dgl")``)
HAS_DGL = _import_dgl()


def pytest_addoption(parser):
    parser.addoption("--reverse", action="store_true", default=False,
                     help="run the collected tests in reverse order (a check that no test depends on another's "
                          "state; see tests/README.md)")


def pytest_collection_finish(session):
    """Every object alive once the tests are collected (torch's, DGL's, the test modules', the items: half a
    million) lives to the end of the session: ``gc.freeze()`` moves them out of the collector's reach, so each
    full collection (``gc.collect()`` in the memory meter and in tests, and Python's own) traverses only what the
    tests made since, not all of them again (about 1 s each in a worker)."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    if config.getoption("--reverse"):
        items.reverse()
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
    if not HAS_DGL:  # torch's pool alone
        previous = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(previous)
        return
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


#: the seed every test starts from, in every random generator a test may draw from unseeded
TEST_SEED = 0


def _package_state() -> dict:
    """What one test may change and the next would inherit: the ambient compression configuration and its
    scopes, every context variable of dgl_exact's modules (keep hooks, chunk policies, seed streams, edge
    chunks, ...), the kernel backend forced or excluded, torch's threads, default dtype and grad mode."""
    import contextvars
    import sys

    from dgl_exact import compression_config, kernels

    state = {"compression_config._global_config": compression_config._global_config,
             "kernels forced": getattr(kernels._local, "forced", None),
             "kernels excluded": getattr(kernels._local, "excluded", frozenset()),
             "torch threads": torch.get_num_threads(), "torch default dtype": torch.get_default_dtype(),
             "torch grad mode": torch.is_grad_enabled()}
    # dict copies, not iterators: a finalizer run by the collector mid-iteration may add a module or a global
    for name in _package_modules():
        module = sys.modules.get(name)
        if module is not None:
            for attr in _context_var_names(name, module):
                value = getattr(module, attr, None)
                if isinstance(value, contextvars.ContextVar):
                    try:
                        state[f"{name}.{attr}"] = (value, value.get())  # its value, or its default
                    except LookupError:  # no value and no default
                        state[f"{name}.{attr}"] = (value, _UNSET)
    return state


_UNSET = object()
_PACKAGE_MODULES = [-1, []]  # len(sys.modules) when dgl_exact's module names were listed, and those names


def _package_modules() -> list:
    """The names of dgl_exact's imported modules, listed again only when ``sys.modules`` grew or shrank (two
    scans of its thousands of names per test otherwise; a module first imported during a test has nothing to
    compare with anyway)."""
    import sys

    if len(sys.modules) != _PACKAGE_MODULES[0]:
        _PACKAGE_MODULES[:] = [len(sys.modules), [n for n in sys.modules.copy() if n.startswith("dgl_exact")]]
    return _PACKAGE_MODULES[1]
#: module name -> (the module, the names of its globals that held a ContextVar when it was first seen): each
#: module's globals are scanned once, not twice per test (they are made at import; a module imported again is
#: scanned again)
_CONTEXT_VAR_NAMES: dict = {}


def _context_var_names(name: str, module) -> list:
    import contextvars

    seen = _CONTEXT_VAR_NAMES.get(name)
    if seen is None or seen[0] is not module:
        seen = (module, [a for a, v in vars(module).copy().items() if isinstance(v, contextvars.ContextVar)])
        _CONTEXT_VAR_NAMES[name] = seen
    return seen[1]


def _restore(name: str, value) -> None:
    from dgl_exact import compression_config, kernels

    if name == "compression_config._global_config":
        compression_config._global_config = value
    elif name == "kernels forced":
        kernels._local.forced = value
    elif name == "kernels excluded":
        kernels._local.excluded = value
    elif name == "torch threads":
        torch.set_num_threads(value)
    elif name == "torch default dtype":
        torch.set_default_dtype(value)
    elif name == "torch grad mode":
        torch.set_grad_enabled(value)
    else:
        var, old = value
        if old is not _UNSET:  # (one without a default cannot be unset again: none of dgl_exact's)
            var.set(old)  # a variable first created during the test has no entry here and stays as it is


@pytest.fixture(autouse=True)
def _seed_and_isolate():
    """Every test starts from the same random state (torch, numpy, Python's ``random``, DGL's own generator,
    which ``dgl.rand_graph`` and DGL's samplers draw from) and leaves dgl_exact's global state as it found it:
    a test that changes it (a ``set_config`` or a scope left open, a context variable set and not reset, a
    backend forced) is restored and reported as an error, so no test depends on the order the suite runs in
    (``pytest --reverse`` runs it backwards)."""
    import random

    import numpy as np

    torch.manual_seed(TEST_SEED)
    np.random.seed(TEST_SEED)
    random.seed(TEST_SEED)
    if HAS_DGL:
        import dgl

        dgl.seed(TEST_SEED)
    before = _package_state()
    yield
    after = _package_state()
    leaked = []
    for name, value in before.items():
        now = after.get(name)
        same = (now[1] is value[1]) if isinstance(value, tuple) else (now == value or now is value)
        if not same:
            leaked.append(name)
            _restore(name, value)
    if leaked:
        pytest.fail(f"the test left global state changed (restored now): {', '.join(leaked)}; undo it in the test "
                    "(a with-block, monkeypatch or a fixture)", pytrace=False)


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
