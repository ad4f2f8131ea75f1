"""Tests of dgl_exact/_environment.py: every environment variable the package reads, checked in one place."""
import re
from pathlib import Path

import pytest

from dgl_exact import _environment
from dgl_exact._environment import VARIABLES, EnvironmentVariableError, check, read

PACKAGE = Path(_environment.__file__).parent


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_every_variable_the_package_reads_is_declared():
    """A grep of the package: any ``os.environ.get("NAME")`` or ``*_ENV = "NAME"`` must be declared here."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        names |= set(re.findall(r"environ\.get\(\s*[\"']([A-Z_][A-Z0-9_]*)[\"']", text))
        names |= set(re.findall(r"^\s*[A-Z_]*ENV[A-Z_]*\s*=\s*[\"']([A-Z_][A-Z0-9_]*)[\"']", text, re.M))
        names |= set(re.findall(r"envvar=[\"']([A-Z_][A-Z0-9_]*)[\"']", text))
        names |= set(re.findall(r"^ENV_VAR\s*=\s*[\"']([A-Z_][A-Z0-9_]*)[\"']", text, re.M))
    names -= {"NUMBA_ENABLE_CUDASIM"}  # numba's own
    assert names, "the grep found nothing"
    assert names <= set(VARIABLES), sorted(names - set(VARIABLES))


def test_backend_names_match_the_kernels():
    from dgl_exact import kernels
    from dgl_exact.kernels import _ALIASES

    assert set(_environment.KERNEL_BACKEND_NAMES) == set(kernels.BACKENDS) | set(_ALIASES)


def test_unset_and_empty_give_the_default(monkeypatch):
    assert read("WORLD_SIZE") == 1 and read("RANK", 7) == 7
    monkeypatch.setenv("WORLD_SIZE", "")
    assert read("WORLD_SIZE") == 1
    monkeypatch.setenv("WORLD_SIZE", " 4 ")
    assert read("WORLD_SIZE") == 4
    monkeypatch.setenv("DGL_EXACT_OVERSUBSCRIBE", "Yes")
    assert read("DGL_EXACT_OVERSUBSCRIBE") is True
    monkeypatch.setenv("DGL_EXACT_DIST_TIMEOUT", "2.5")
    assert read("DGL_EXACT_DIST_TIMEOUT") == 2.5


@pytest.mark.parametrize("name,value,expected", [
    ("WORLD_SIZE", "abc", "an integer from 1 to 2147483647"),
    ("WORLD_SIZE", "0", "an integer from 1 to"),
    ("WORLD_SIZE", "1" + "0" * 30, "an integer from 1 to"),
    ("RANK", "-1", "an integer >= 0 below WORLD_SIZE"),
    ("LOCAL_RANK", "1.5", "an integer >= 0 below LOCAL_WORLD_SIZE"),
    ("LOCAL_WORLD_SIZE", "x", "an integer from 1"),
    ("MASTER_PORT", "70000", "a TCP port from 1 to 65535"),
    ("MASTER_PORT", "http", "a TCP port"),
    ("MASTER_ADDR", "  ", "a host name or address"),
    ("DGL_EXACT_BACKEND", "bogus", "one of ext, numba, dgl, torch"),
    ("DGL_EXACT_BACKEND", "Numba", "one of ext, numba, dgl, torch"),
    ("DGL_EXACT_DIST_TIMEOUT", "-1", "a number of seconds > 0"),
    ("DGL_EXACT_DIST_SETUP_TIMEOUT", "nan", "a number of seconds > 0"),
    ("DGL_EXACT_DIST_TIMEOUT", "inf", "a number of seconds > 0"),
    ("DGL_EXACT_DIST_TIMEOUT", "1e300", "a number of seconds > 0 and at most 8.64e+13"),
    ("DGL_EXACT_OVERSUBSCRIBE", "2", "1, true, yes, on, 0, false, no or off"),
    ("DGL_EXACT_BUILD_CPU_EXT", "maybe", "1, true"),
    ("DGL_EXACT_NPROC_CHILD", "yes", "0 or 1"),
    ("DGL_REPO", "data.dgl.ai", "a URL such as https://data.dgl.ai/"),
])
def test_a_bad_value_is_one_line_naming_variable_value_and_what_is_expected(monkeypatch, name, value, expected):
    monkeypatch.setenv(name, value)
    with pytest.raises(EnvironmentVariableError) as info:
        check()
    message = str(info.value.format_message())
    assert message == f"environment variable {name}={value!r}: expected {expected}" or \
        message.startswith(f"environment variable {name}={value!r}: expected {expected}")
    assert "\n" not in message
    assert isinstance(info.value, ValueError) and info.value.exit_code == 2


@pytest.mark.parametrize("env,name,expected", [
    ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK", "an integer below WORLD_SIZE=2"),
    ({"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "3"}, "LOCAL_RANK", "an integer below LOCAL_WORLD_SIZE=2"),
    ({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "4"}, "LOCAL_WORLD_SIZE", "at most WORLD_SIZE=2"),
])
def test_ranks_must_fall_below_their_sizes(monkeypatch, env, name, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(EnvironmentVariableError, match=f"environment variable {name}=.*: expected {expected}$"):
        check()


def test_a_consistent_job_passes(monkeypatch):
    for key, value in {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "DGL_EXACT_BACKEND": "torch"}.items():
        monkeypatch.setenv(key, value)
    check()


def test_the_readers_give_the_same_line(monkeypatch):
    from dgl_exact.training.distributed import environment

    monkeypatch.setenv("WORLD_SIZE", "abc")
    with pytest.raises(ValueError, match=r"^environment variable WORLD_SIZE='abc': expected an integer"):
        environment.in_distributed_env()


def test_the_kernels_give_the_same_line(monkeypatch):
    import torch

    import dgl_exact.kernels as kernels

    monkeypatch.setenv("DGL_EXACT_BACKEND", "bogus")
    with pytest.raises(ValueError, match=r"^environment variable DGL_EXACT_BACKEND='bogus': expected one of ext"):
        kernels.get("compress_rows", torch.device("cpu"))
