"""dgl_exact.kernels.reference: what the reference kernels hold beyond their outputs (their results against the
other backends are tests/kernels/test_spec.py's)."""
import pytest

from dgl_exact.memory import vmhwm_available

MIB = 2**20


@pytest.mark.skipif(vmhwm_available() is not None, reason=f"no CPU peak: {vmhwm_available()}")
def test_spmm_sum_holds_no_second_output_on_the_cpu():
    """The CPU's sparse product (``adj @ x``) holds a second output-sized buffer inside the kernel, which no
    memory meter sees (the planner's timeline sees operator outputs only): the reference sum writes into its own
    output instead, so it holds the output, the edge values (all ones here) and little more, and the same sums."""
    from tests._fresh import run_forked

    out = run_forked("""
        import warnings
        from dgl_exact.kernels import reference
        prepare_cpu_peak()
        n, e, d = 60000, 600000, 64
        g = torch.Generator().manual_seed(0)
        dst = torch.randint(0, n, (e,), generator=g).sort().values
        src = torch.randint(0, n, (e,), generator=g)
        indptr = torch.zeros(n + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(dst, minlength=n), 0, out=indptr[1:])
        x = torch.randn(n, 1, d)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            adj = torch.sparse_csr_tensor(indptr, src, torch.ones(e), size=(n, n))
            want = adj @ x.view(n, d)
        del adj
        for _ in range(2):  # the first call also maps the kernels' code pages
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            before = dgl_exact.memory._status_bytes("VmRSS:")
            got = reference.spmm_sum(indptr, src, None, x, None, n)
            peak = dgl_exact.memory._status_bytes("VmHWM:") - before
            out.update(peak=peak, equal=bool(torch.equal(got.view(n, d), want)))
            del got
    """)
    output, values, indices32 = 60000 * 64 * 4, 600000 * 4, 600000 * 4
    assert out["equal"]
    # the output, the edge values and a 32-bit copy of the indices the sparse kernel makes; a page margin (it was
    # about 17 MiB more: a second output)
    assert out["peak"] <= output + values + indices32 + MIB, out["peak"] / MIB
