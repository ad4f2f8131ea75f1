// CUDA graph kernels over a CSR of destination nodes: spmm_sum, spmm_minmax, sddmm_dot (reference.py).
// One thread per output element (destination, column) with grid-stride loops, so any feature width works
// and consecutive threads read consecutive feature columns; sums accumulate in fp32 (fp64 for fp64).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <cmath>

#include "cuda_utils.cuh"
#include "dgl_exact.h"

namespace dgl_exact {
namespace {

template <typename scalar_t, typename acc_t, typename index_t>
__global__ void __launch_bounds__(kThreads)
    spmm_sum_kernel(const index_t* __restrict__ indptr, const index_t* __restrict__ indices,
                    const index_t* __restrict__ eids, const scalar_t* __restrict__ x, const scalar_t* __restrict__ w,
                    scalar_t* __restrict__ out, int64_t n_dst, int64_t heads, int64_t dim, bool small) {
  const int64_t width = heads * dim;
  const int64_t total = n_dst * width;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t v = div_fast(idx, width, small);
    const int64_t c = idx - v * width;
    const int64_t h = w ? div_fast(c, dim, small) : 0;
    const int64_t beg = indptr[v], end = indptr[v + 1];
    acc_t acc = 0;
    for (int64_t i = beg; i < end; ++i) {
      const acc_t xv = static_cast<acc_t>(x[static_cast<int64_t>(indices[i]) * width + c]);
      if (w) {
        const int64_t eid = eids ? static_cast<int64_t>(eids[i]) : i;
        acc += static_cast<acc_t>(w[eid * heads + h]) * xv;
      } else {
        acc += xv;
      }
    }
    out[idx] = static_cast<scalar_t>(acc);
  }
}

template <typename scalar_t, typename acc_t, typename index_t, bool IS_MAX>
__global__ void __launch_bounds__(kThreads)
    spmm_minmax_kernel(const index_t* __restrict__ indptr, const index_t* __restrict__ indices,
                       const scalar_t* __restrict__ x, scalar_t* __restrict__ out, int64_t* __restrict__ arg,
                       int64_t n_dst, int64_t width, bool small) {
  constexpr int64_t kNone = 0x7fffffffffffffffll;  // no edge attains the extremum (yet)
  const int64_t total = n_dst * width;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t v = div_fast(idx, width, small);
    const int64_t c = idx - v * width;
    const int64_t beg = indptr[v], end = indptr[v + 1];
    acc_t best = IS_MAX ? static_cast<acc_t>(-INFINITY) : static_cast<acc_t>(INFINITY);
    int64_t who = kNone;
    bool nan = false;
    for (int64_t i = beg; i < end; ++i) {
      const int64_t u = indices[i];
      const acc_t val = static_cast<acc_t>(x[u * width + c]);
      if (val != val) {
        nan = true;  // NaN propagates (torch's amax/amin) and matches no edge: arg -1
      } else if (IS_MAX ? val > best : val < best) {
        best = val;
        who = u;
      } else if (val == best && u < who) {
        who = u;  // ties: the smallest source index
      }
    }
    if (beg == end) {
      best = acc_t(0);
      who = -1;
    } else if (nan) {
      best = static_cast<acc_t>(NAN);
      who = -1;
    }
    out[idx] = static_cast<scalar_t>(best);
    arg[idx] = who == kNone ? -1 : who;
  }
}

// Destination of stored edge i: the last v with indptr[v] <= i (skips empty rows).
template <typename index_t>
__device__ __forceinline__ int64_t edge_row(const index_t* __restrict__ indptr, int64_t n_dst, int64_t i) {
  int64_t lo = 0, hi = n_dst - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) >> 1;
    if (static_cast<int64_t>(indptr[mid]) <= i) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// `group` lanes (a power of two <= 32) cooperate on one (edge, head) dot product.
template <typename scalar_t, typename acc_t, typename index_t>
__global__ void __launch_bounds__(kThreads)
    sddmm_dot_kernel(const index_t* __restrict__ indptr, const index_t* __restrict__ indices,
                     const index_t* __restrict__ eids, const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                     scalar_t* __restrict__ out, int64_t n_dst, int64_t nnz, int64_t heads, int64_t dim, int group) {
  const int64_t total = nnz * heads;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int lane = threadIdx.x & (group - 1);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x / group;
  const int64_t width = heads * dim;
  for (int64_t pair = tid / group;; pair += stride) {
    const bool active = pair < total;
    if (!__any_sync(0xffffffffu, active)) break;
    acc_t s = 0;
    int64_t i = 0, h = 0;
    if (active) {
      i = pair / heads;
      h = pair - i * heads;
      const int64_t v = edge_row(indptr, n_dst, i);
      const scalar_t* au = a + static_cast<int64_t>(indices[i]) * width + h * dim;
      const scalar_t* bv = b + v * width + h * dim;
      for (int64_t d = lane; d < dim; d += group) s += static_cast<acc_t>(au[d]) * static_cast<acc_t>(bv[d]);
    }
    for (int off = group >> 1; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off, group);
    if (active && lane == 0) {
      const int64_t eid = eids ? static_cast<int64_t>(eids[i]) : i;
      out[eid * heads + h] = static_cast<scalar_t>(s);
    }
  }
}

constexpr int64_t kU32Max = 0xFFFFFFFFll;

}  // namespace

at::Tensor spmm_sum_cuda(const at::Tensor& indptr, const at::Tensor& indices, const OptTensor& eids,
                         const at::Tensor& x_in, const OptTensor& w_in, int64_t n_dst) {
  const char* op = "dgl_exact.spmm_sum";
  TORCH_CHECK(x_in.is_cuda(), op, ": x must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = prepare_features(x_in, op);
  const GraphArgs g = prepare_graph(indptr, indices, eids, n_dst, x.device(), op);
  const int64_t heads = x.size(1), dim = x.size(2);
  const bool has_w = w_in.has_value() && w_in->defined();
  const at::Tensor w = has_w ? prepare_edge_values(*w_in, x, op) : at::Tensor();
  at::Tensor out = at::empty({n_dst, heads, dim}, x.options());
  const int64_t total = out.numel();
  if (total == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dgl_exact_spmm_sum_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(g.indices.scalar_type(), "dgl_exact_spmm_sum_cuda_idx", [&] {
      spmm_sum_kernel<scalar_t, acc_t, index_t><<<grid_for(total), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
          g.indptr.data_ptr<index_t>(), g.indices.data_ptr<index_t>(),
          g.has_eids ? g.eids.data_ptr<index_t>() : nullptr, x.data_ptr<scalar_t>(),
          has_w ? w.data_ptr<scalar_t>() : nullptr, out.data_ptr<scalar_t>(), n_dst, heads, dim, total <= kU32Max);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> spmm_minmax_cuda(const at::Tensor& indptr, const at::Tensor& indices,
                                                    const OptTensor& eids, const at::Tensor& x_in,
                                                    c10::string_view reduce, int64_t n_dst) {
  const char* op = "dgl_exact.spmm_minmax";
  TORCH_CHECK(x_in.is_cuda(), op, ": x must be a CUDA tensor");
  const bool is_max = parse_reduce(reduce, op);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = prepare_features(x_in, op);
  const GraphArgs g = prepare_graph(indptr, indices, eids, n_dst, x.device(), op);
  const int64_t heads = x.size(1), dim = x.size(2), width = heads * dim;
  at::Tensor out = at::empty({n_dst, heads, dim}, x.options());
  at::Tensor arg = at::empty({n_dst, heads, dim}, x.options().dtype(at::kLong));
  const int64_t total = out.numel();
  if (total == 0) return {out, arg};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dgl_exact_spmm_minmax_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(g.indices.scalar_type(), "dgl_exact_spmm_minmax_cuda_idx", [&] {
      const auto stream = c10::cuda::getCurrentCUDAStream();
      if (is_max) {
        spmm_minmax_kernel<scalar_t, acc_t, index_t, true><<<grid_for(total), kThreads, 0, stream>>>(
            g.indptr.data_ptr<index_t>(), g.indices.data_ptr<index_t>(), x.data_ptr<scalar_t>(),
            out.data_ptr<scalar_t>(), arg.data_ptr<int64_t>(), n_dst, width, total <= kU32Max);
      } else {
        spmm_minmax_kernel<scalar_t, acc_t, index_t, false><<<grid_for(total), kThreads, 0, stream>>>(
            g.indptr.data_ptr<index_t>(), g.indices.data_ptr<index_t>(), x.data_ptr<scalar_t>(),
            out.data_ptr<scalar_t>(), arg.data_ptr<int64_t>(), n_dst, width, total <= kU32Max);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {out, arg};
}

at::Tensor sddmm_dot_cuda(const at::Tensor& indptr, const at::Tensor& indices, const OptTensor& eids,
                          const at::Tensor& a_in, const at::Tensor& b_in) {
  const char* op = "dgl_exact.sddmm_dot";
  TORCH_CHECK(a_in.is_cuda() && b_in.is_cuda(), op, ": a and b must be CUDA tensors");
  const c10::cuda::CUDAGuard guard(a_in.device());
  at::Tensor a, b;
  std::tie(a, b) = prepare_sddmm_operands(a_in, b_in, op);
  const int64_t n_dst = indptr.numel() - 1;
  const GraphArgs g = prepare_graph(indptr, indices, eids, n_dst, a.device(), op);
  const int64_t heads = a.size(1), dim = a.size(2);
  at::Tensor out = g.has_eids ? at::zeros({g.nnz, heads}, a.options()) : at::empty({g.nnz, heads}, a.options());
  const int64_t total = out.numel();
  if (total == 0) return out;
  int group = 1;
  while (group < 32 && group < dim) group <<= 1;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "dgl_exact_sddmm_dot_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(g.indices.scalar_type(), "dgl_exact_sddmm_dot_cuda_idx", [&] {
      sddmm_dot_kernel<scalar_t, acc_t, index_t>
          <<<grid_for(total * group), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
              g.indptr.data_ptr<index_t>(), g.indices.data_ptr<index_t>(),
              g.has_eids ? g.eids.data_ptr<index_t>() : nullptr, a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
              out.data_ptr<scalar_t>(), n_dst, g.nnz, heads, dim, group);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return out;
}

}  // namespace dgl_exact

TORCH_LIBRARY_IMPL(dgl_exact, CUDA, m) {
  m.impl("spmm_sum", &dgl_exact::spmm_sum_cuda);
  m.impl("spmm_minmax", &dgl_exact::spmm_minmax_cuda);
  m.impl("sddmm_dot", &dgl_exact::sddmm_dot_cuda);
}
