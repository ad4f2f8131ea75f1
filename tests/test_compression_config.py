"""CompressionConfig validation and immutability; get_config / set_config / config() scoping."""
import asyncio
import dataclasses
import importlib
import math
import threading

import numpy as np
import pytest
import torch

import dgl_exact

# the module holding the configuration (``dgl_exact.config`` is its context-manager function)
config_mod = importlib.import_module("dgl_exact.compression_config")
from dgl_exact.compression_config import (VALID_BITS, VALID_LEVELS, CompressionConfig, config, get_config,  # noqa: E402
                                          resolve_config, set_config)


@pytest.fixture(autouse=True)
def _restore_global_config():
    """Every test starts from the documented default and leaves the process-wide default as it found it."""
    previous = set_config(CompressionConfig())
    yield
    set_config(previous)


# ------------------------------------------------------------------------------------------------
# Construction and validation
# ------------------------------------------------------------------------------------------------

def test_defaults():
    cfg = CompressionConfig()
    assert (cfg.bits, cfg.kept_frac, cfg.block_rows, cfg.levels, cfg.stochastic, cfg.enabled, cfg.nonfinite) == \
        (8, 1.0, 1, "uniform", True, True, "propagate")
    assert VALID_BITS == (1, 2, 4, 8)
    assert VALID_LEVELS == ("uniform", "optimal")


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("levels", ["uniform", "optimal"])
def test_valid_values_accepted(bits, levels):
    cfg = CompressionConfig(bits=bits, kept_frac=0.125, block_rows=64, levels=levels, stochastic=False,
                            enabled=False, nonfinite="raise")
    assert cfg.bits == bits and cfg.levels == levels and cfg.block_rows == 64


@pytest.mark.parametrize("bad", [0, 3, 5, 16, -2, 2.0, "2", None, True, False])
def test_bad_bits(bad):
    with pytest.raises(ValueError, match=r"bits must be one of \(1, 2, 4, 8\)"):
        CompressionConfig(bits=bad)


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.0000001, 2, float("nan"), float("inf"), -float("inf"),
                                 "0.5", b"0.5", True, False, None, [0.5]])
def test_bad_kept_frac(bad):
    with pytest.raises(ValueError, match=r"kept_frac must be .*\(0, 1\]"):
        CompressionConfig(kept_frac=bad)


@pytest.mark.parametrize("good", [1, 1.0, 0.5, 0.125, 1e-9, np.float32(0.25), np.float64(0.5)])
def test_kept_frac_normalised_to_float(good):
    cfg = CompressionConfig(kept_frac=good)
    assert type(cfg.kept_frac) is float and cfg.kept_frac == pytest.approx(float(good))


@pytest.mark.parametrize("bad", [0, -1, 1.0, 64.0, "64", None, True, 2 ** 31, 10 ** 30, -10 ** 30])
def test_bad_block_rows(bad):
    with pytest.raises(ValueError, match=r"block_rows must be an integer from 1 to 2147483647 \(2\*\*31 - 1"):
        CompressionConfig(block_rows=bad)


@pytest.mark.parametrize("backend", ["numba", "dgl", "torch", "ext"])
def test_largest_block_rows_compresses_as_one_group(backend):
    """The bound is one every kernel handles: ``MAX_BLOCK_ROWS`` rows per block is one group for a small
    tensor, the same codes as a block of exactly its rows."""
    import dgl_exact.kernels as kernels
    from dgl_exact.compression import core
    from dgl_exact.compression_config import MAX_BLOCK_ROWS

    x = torch.randn(37, 5, generator=torch.Generator().manual_seed(0))
    with kernels.use_backend(backend):
        huge = core.compress(x, CompressionConfig(bits=4, block_rows=MAX_BLOCK_ROWS), seed=3)
        exact = core.compress(x, CompressionConfig(bits=4, block_rows=37), seed=3)
        assert torch.equal(core.decompress(huge), core.decompress(exact))


@pytest.mark.parametrize("bad", ["Uniform", "nonuniform", "", None, 2])
def test_bad_levels(bad):
    with pytest.raises(ValueError, match=r"levels must be one of \('uniform', 'optimal'\)"):
        CompressionConfig(levels=bad)


@pytest.mark.parametrize("field", ["stochastic", "enabled"])
@pytest.mark.parametrize("bad", [1, 0, "yes", None, np.bool_(True)])
def test_bad_bool_fields(field, bad):
    with pytest.raises(ValueError, match=rf"{field} must be True or False"):
        CompressionConfig(**{field: bad})


@pytest.mark.parametrize("bad", ["ignore", "Raise", None, True])
def test_bad_nonfinite(bad):
    with pytest.raises(ValueError, match=r"nonfinite must be 'propagate' or 'raise'"):
        CompressionConfig(nonfinite=bad)


def test_unknown_field_is_type_error():
    with pytest.raises(TypeError):
        CompressionConfig(bitz=2)


def test_immutable_and_hashable():
    cfg = CompressionConfig(bits=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.bits = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.kept_frac = 0.5
    assert cfg.bits == 2
    assert cfg == CompressionConfig(bits=2) and hash(cfg) == hash(CompressionConfig(bits=2))
    assert cfg != CompressionConfig(bits=4)
    assert len({cfg, CompressionConfig(bits=2), CompressionConfig()}) == 2


def test_replace_validates_and_copies():
    cfg = CompressionConfig(bits=2, kept_frac=0.5)
    other = cfg.replace(block_rows=64)
    assert other is not cfg and other.block_rows == 64 and other.bits == 2 and cfg.block_rows == 1
    with pytest.raises(ValueError, match="bits"):
        cfg.replace(bits=3)
    with pytest.raises(TypeError):
        cfg.replace(nonsense=1)


@pytest.mark.parametrize("kept_frac, width, expected", [
    (1.0, 128, 128), (0.125, 128, 16), (0.25, 64, 16), (0.125, 1, 1), (1e-6, 3, 1),
    (0.3, 10, 3), (0.07, 100, 7), (0.7, 10, 7), (0.5, 7, 4), (0.999, 1000, 999), (1.0, 0, 0),
])
def test_projected_width(kept_frac, width, expected):
    """``ceil(kept_frac * width)``, at least 1, computed without binary floating-point overshoot."""
    assert CompressionConfig(kept_frac=kept_frac).projected_width(width) == expected


def test_projected_width_never_above_width_nor_off_by_float_noise():
    for pct in range(1, 101):
        cfg = CompressionConfig(kept_frac=pct / 100)
        for width in range(1, 400):
            k = cfg.projected_width(width)
            assert 1 <= k <= width
            assert k == max(1, -(-pct * width // 100))  # exact integer ceil(pct * width / 100)


def test_describe():
    assert CompressionConfig().describe() == "INT8"
    assert CompressionConfig(bits=2, kept_frac=0.125, block_rows=64, levels="optimal").describe() == \
        "INT2 kf=0.125 blocks=64 optimal"
    assert CompressionConfig(bits=4, stochastic=False).describe() == "INT4 nearest"
    assert CompressionConfig(enabled=False).describe() == "fp (uncompressed)"


# ------------------------------------------------------------------------------------------------
# Global default and scoped overrides
# ------------------------------------------------------------------------------------------------

def test_top_level_exports_are_the_same_objects():
    assert dgl_exact.CompressionConfig is CompressionConfig
    assert dgl_exact.config is config and dgl_exact.get_config is get_config and dgl_exact.set_config is set_config


def test_set_config_returns_previous_and_accepts_changes():
    assert get_config() == CompressionConfig()
    prev = set_config(bits=2)
    assert prev == CompressionConfig()
    assert get_config().bits == 2
    prev2 = set_config(kept_frac=0.5)  # changes apply on top of the current default
    assert prev2.bits == 2 and get_config() == CompressionConfig(bits=2, kept_frac=0.5)
    mine = CompressionConfig(bits=4, block_rows=8)
    set_config(mine)
    assert get_config() is mine
    set_config(mine, levels="optimal")  # a base config plus changes
    assert get_config() == CompressionConfig(bits=4, block_rows=8, levels="optimal")


@pytest.mark.parametrize("bad", ["bits=2", 2, {"bits": 2}, object()])
def test_set_config_rejects_non_config(bad):
    with pytest.raises(TypeError, match="CompressionConfig"):
        set_config(bad)
    assert get_config() == CompressionConfig()


def test_set_config_bad_values_leave_default_unchanged():
    set_config(bits=4)
    with pytest.raises(ValueError, match="bits"):
        set_config(bits=3)
    with pytest.raises(TypeError):
        set_config(not_a_field=1)
    assert get_config() == CompressionConfig(bits=4)


def test_scopes_nest_and_restore():
    base = get_config()
    with config(bits=2) as outer:
        assert outer == base.replace(bits=2) and get_config() is outer
        with config(kept_frac=0.125, block_rows=64) as inner:  # changes apply on top of the enclosing scope
            assert inner == CompressionConfig(bits=2, kept_frac=0.125, block_rows=64)
            assert get_config() is inner
            explicit = CompressionConfig(bits=1)
            with config(explicit) as third:  # a whole config replaces, it does not merge
                assert third is explicit and get_config() is explicit
            assert get_config() is inner
        assert get_config() is outer
    assert get_config() is base


def test_scope_is_layered_over_set_config():
    with config(bits=2):
        set_config(block_rows=16)  # the global default changes, but the scope still wins inside it
        assert get_config().bits == 2 and get_config().block_rows == 1
    assert get_config() == CompressionConfig(block_rows=16)


def test_scope_restored_after_exception():
    base = get_config()
    with pytest.raises(RuntimeError, match="boom"):
        with config(bits=2):
            with config(bits=4):
                raise RuntimeError("boom")
    assert get_config() is base
    assert config_mod._stack() == []


@pytest.mark.parametrize("kwargs, exc", [({"bits": 3}, ValueError), ({"kept_frac": 0}, ValueError),
                                         ({"block_rows": 0}, ValueError), ({"levels": "x"}, ValueError),
                                         ({"nonsense": 1}, TypeError)])
def test_scope_bad_kwargs(kwargs, exc):
    with pytest.raises(exc):
        with config(**kwargs):
            pytest.fail("the body must not run")  # pragma: no cover
    assert get_config() == CompressionConfig() and config_mod._stack() == []


@pytest.mark.parametrize("bad", ["bits=2", 8, {"bits": 2}])
def test_scope_rejects_non_config(bad):
    with pytest.raises(TypeError, match="CompressionConfig"):
        with config(bad):
            pass  # pragma: no cover
    assert config_mod._stack() == []


def test_resolve_config():
    cfg = CompressionConfig(bits=1)
    assert resolve_config(cfg) is cfg
    assert resolve_config(None) is get_config()
    with config(bits=2) as scoped:
        assert resolve_config() is scoped
    with pytest.raises(TypeError, match="CompressionConfig"):
        resolve_config("bits=2")


def test_compress_uses_the_config_in_force():
    x = torch.randn(8, 16)
    with config(bits=2, block_rows=4):
        c = dgl_exact.compress(x, seed=1)
    assert (c.bits, c.block_rows) == (2, 4)
    assert dgl_exact.compress(x, seed=1).bits == 8
    assert dgl_exact.compress(x, CompressionConfig(bits=1), seed=1).bits == 1  # explicit beats the default


def test_scopes_are_thread_local():
    """An override entered in one thread is invisible in another; the global default is shared."""
    entered, checked, failures = threading.Event(), threading.Event(), []

    def worker():
        try:
            with config(bits=2, kept_frac=0.5):
                entered.set()
                checked.wait(10)
                if get_config().bits != 2:
                    failures.append("worker lost its own scope")
            if get_config() != CompressionConfig(bits=4):  # global default set by the main thread meanwhile
                failures.append(f"worker sees {get_config()} after its scope")
        except Exception as exc:  # pragma: no cover
            failures.append(repr(exc))

    t = threading.Thread(target=worker)
    t.start()
    assert entered.wait(10)
    assert get_config() == CompressionConfig()  # the worker's scope is not visible here
    set_config(bits=4)
    checked.set()
    t.join(10)
    assert not t.is_alive() and failures == []


def test_scopes_thread_safe_under_contention():
    """Many threads nest and unwind their own scopes concurrently; each always sees exactly its own."""
    n_threads, n_iter, errors = 8, 300, []
    barrier = threading.Barrier(n_threads)

    def worker(i):
        try:
            barrier.wait(10)
            bits = VALID_BITS[i % 4]
            for j in range(n_iter):
                with config(bits=bits, block_rows=i + 1) as a:
                    with config(kept_frac=1.0 / (1 + j % 7)) as b:
                        got = get_config()
                        if got is not b or got.bits != bits or got.block_rows != i + 1:
                            errors.append((i, j, got))
                    if get_config() is not a:
                        errors.append((i, j, "outer"))
            if config_mod._stack():
                errors.append((i, "stack not empty"))
        except Exception as exc:  # pragma: no cover
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert get_config() == CompressionConfig()


def test_set_config_is_atomic_across_threads():
    """Concurrent ``set_config(field=...)`` updates never lose a field (read-modify-write under a lock)."""
    fields = [("bits", 2), ("block_rows", 7), ("levels", "optimal"), ("stochastic", False)]
    barrier = threading.Barrier(len(fields))

    def worker(name, value):
        barrier.wait(10)
        for _ in range(200):
            set_config(**{name: value})

    threads = [threading.Thread(target=worker, args=f) for f in fields]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert get_config() == CompressionConfig(bits=2, block_rows=7, levels="optimal", stochastic=False)
    assert math.isclose(get_config().kept_frac, 1.0)


# ------------------------------------------------------------------------------------------------
# Scopes and asyncio: each task has its own scopes (a contextvars.ContextVar, not thread-local state)
# ------------------------------------------------------------------------------------------------

def test_scopes_do_not_leak_between_interleaved_asyncio_tasks():
    """Two tasks on one thread enter scopes, then leave them in the opposite order: each one always sees its
    own scope, and after leaving it, the configuration it started with (with a thread-local stack, task a
    popped task b's scope and b then ran with a's)."""
    log = []

    async def body(name, bits, my_turn, next_turn):
        await my_turn.wait()
        my_turn.clear()
        with config(bits=bits):
            log.append((name, "in", get_config().bits))
            next_turn.set()
            await my_turn.wait()  # the other task enters (or leaves) its scope meanwhile
            my_turn.clear()
            log.append((name, "still", get_config().bits))
        log.append((name, "after", get_config()))
        next_turn.set()

    async def main():
        a, b = asyncio.Event(), asyncio.Event()
        a.set()
        # a enters, b enters, a leaves first (out of order on the thread), then b checks and leaves
        await asyncio.gather(body("a", 2, a, b), body("b", 4, b, a))

    asyncio.run(main())
    assert log == [("a", "in", 2), ("b", "in", 4), ("a", "still", 2), ("a", "after", CompressionConfig()),
                   ("b", "still", 4), ("b", "after", CompressionConfig())]
    assert get_config() == CompressionConfig() and config_mod._stack() == []


def test_asyncio_task_inherits_its_creators_scope_but_not_the_reverse():
    async def child():
        inherited = get_config().bits
        with config(block_rows=8):
            await asyncio.sleep(0)
            return inherited, get_config()

    async def main():
        with config(bits=1):
            task = asyncio.create_task(child())
            await asyncio.sleep(0)  # the child has entered its scope by now
            here = get_config()
            inherited, inside = await task
            return here, inherited, inside

    here, inherited, inside = asyncio.run(main())
    assert here == CompressionConfig(bits=1)  # the child's block_rows scope is not visible to its creator
    assert inherited == 1 and inside == CompressionConfig(bits=1, block_rows=8)


def test_scope_follows_work_sent_to_a_thread_with_asyncio_to_thread():
    """``asyncio.to_thread`` runs the function in the caller's context: the caller's scope applies there, and
    a scope the function enters stays in that call."""
    def work():
        seen = get_config().bits
        with config(bits=8):
            pass
        return seen, get_config().bits

    async def main():
        with config(bits=2):
            return await asyncio.to_thread(work), get_config().bits

    (seen, after), caller = asyncio.run(main())
    assert (seen, after, caller) == (2, 2, 2)
    assert get_config() == CompressionConfig()


def test_many_asyncio_tasks_with_random_interleaving():
    """Fifty tasks, each nesting two scopes across awaits with random sleeps: every read sees its own."""
    rng = np.random.default_rng(0)
    delays = rng.integers(0, 3, size=(50, 3)).tolist()

    async def body(i):
        bits, rows = VALID_BITS[i % 4], i + 1
        errors = []
        with config(bits=bits):
            for _ in range(delays[i][0]):
                await asyncio.sleep(0)
            with config(block_rows=rows) as inner:
                for _ in range(delays[i][1]):
                    await asyncio.sleep(0)
                if get_config() is not inner or inner.bits != bits:
                    errors.append((i, "inner", get_config()))
            for _ in range(delays[i][2]):
                await asyncio.sleep(0)
            if get_config() != CompressionConfig(bits=bits):
                errors.append((i, "outer", get_config()))
        if get_config() != CompressionConfig():
            errors.append((i, "after", get_config()))
        return errors

    async def main():
        return await asyncio.gather(*(body(i) for i in range(50)))

    assert [e for errors in asyncio.run(main()) for e in errors] == []
