// CPU graph kernels over a CSR of destination nodes: spmm_sum, spmm_minmax, sddmm_dot (reference.py).
// Sums accumulate in fp32 (fp64 for fp64 features); max/min and their arguments are exact.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <limits>
#include <vector>

#include "dgl_exact.h"

namespace dgl_exact {
namespace {

template <typename index_t>
int64_t grain_rows(int64_t nnz, int64_t n_dst, int64_t width) {
  const int64_t per_row = std::max<int64_t>(1, (nnz / std::max<int64_t>(n_dst, 1) + 1) * std::max<int64_t>(width, 1));
  return std::max<int64_t>(1, (1 << 15) / per_row);
}

}  // namespace

at::Tensor spmm_sum_cpu(const at::Tensor& indptr, const at::Tensor& indices, const OptTensor& eids,
                        const at::Tensor& x_in, const OptTensor& w_in, int64_t n_dst) {
  const char* op = "dgl_exact.spmm_sum";
  const at::Tensor x = prepare_features(x_in, op);
  const GraphArgs g = prepare_graph(indptr, indices, eids, n_dst, x.device(), op);
  const int64_t heads = x.size(1), dim = x.size(2), width = heads * dim;
  const bool has_w = w_in.has_value() && w_in->defined();
  const at::Tensor w = has_w ? prepare_edge_values(*w_in, x, op) : at::Tensor();
  at::Tensor out = at::empty({n_dst, heads, dim}, x.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dgl_exact_spmm_sum_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(g.indices.scalar_type(), "dgl_exact_spmm_sum_cpu_idx", [&] {
      const index_t* ip = g.indptr.data_ptr<index_t>();
      const index_t* ix = g.indices.data_ptr<index_t>();
      const index_t* ie = g.has_eids ? g.eids.data_ptr<index_t>() : nullptr;
      const scalar_t* xp = x.data_ptr<scalar_t>();
      const scalar_t* wp = has_w ? w.data_ptr<scalar_t>() : nullptr;
      scalar_t* op_ = out.data_ptr<scalar_t>();
      at::parallel_for(0, n_dst, grain_rows<index_t>(g.nnz, n_dst, width), [&](int64_t v0, int64_t v1) {
        std::vector<acc_t> acc(width);
        for (int64_t v = v0; v < v1; ++v) {
          std::fill(acc.begin(), acc.end(), acc_t(0));
          for (int64_t i = ip[v]; i < ip[v + 1]; ++i) {
            const int64_t u = ix[i];
            const int64_t eid = ie ? static_cast<int64_t>(ie[i]) : i;
            const scalar_t* xu = xp + u * width;
            for (int64_t h = 0; h < heads; ++h) {
              const acc_t wv = wp ? static_cast<acc_t>(wp[eid * heads + h]) : acc_t(1);
              for (int64_t d = 0; d < dim; ++d) acc[h * dim + d] += wv * static_cast<acc_t>(xu[h * dim + d]);
            }
          }
          for (int64_t c = 0; c < width; ++c) op_[v * width + c] = static_cast<scalar_t>(acc[c]);
        }
      });
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> spmm_minmax_cpu(const at::Tensor& indptr, const at::Tensor& indices,
                                                   const OptTensor& eids, const at::Tensor& x_in,
                                                   c10::string_view reduce, int64_t n_dst) {
  const char* op = "dgl_exact.spmm_minmax";
  const bool is_max = parse_reduce(reduce, op);
  const at::Tensor x = prepare_features(x_in, op);
  const GraphArgs g = prepare_graph(indptr, indices, eids, n_dst, x.device(), op);
  const int64_t heads = x.size(1), dim = x.size(2), width = heads * dim;
  at::Tensor out = at::empty({n_dst, heads, dim}, x.options());
  at::Tensor arg = at::empty({n_dst, heads, dim}, x.options().dtype(at::kLong));
  if (out.numel() == 0) return {out, arg};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dgl_exact_spmm_minmax_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(g.indices.scalar_type(), "dgl_exact_spmm_minmax_cpu_idx", [&] {
      const index_t* ip = g.indptr.data_ptr<index_t>();
      const index_t* ix = g.indices.data_ptr<index_t>();
      const scalar_t* xp = x.data_ptr<scalar_t>();
      scalar_t* op_ = out.data_ptr<scalar_t>();
      int64_t* ap = arg.data_ptr<int64_t>();
      constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
      const acc_t fill = is_max ? -std::numeric_limits<acc_t>::infinity() : std::numeric_limits<acc_t>::infinity();
      at::parallel_for(0, n_dst, grain_rows<index_t>(g.nnz, n_dst, width), [&](int64_t v0, int64_t v1) {
        std::vector<acc_t> best(width);
        std::vector<int64_t> who(width);
        std::vector<char> nan(width);
        for (int64_t v = v0; v < v1; ++v) {
          std::fill(best.begin(), best.end(), fill);
          std::fill(who.begin(), who.end(), kNone);
          std::fill(nan.begin(), nan.end(), 0);
          for (int64_t i = ip[v]; i < ip[v + 1]; ++i) {
            const int64_t u = ix[i];
            const scalar_t* xu = xp + u * width;
            for (int64_t c = 0; c < width; ++c) {
              const acc_t val = static_cast<acc_t>(xu[c]);
              if (val != val) {
                nan[c] = 1;  // NaN propagates (torch's amax/amin) and matches no edge: arg -1
              } else if (is_max ? val > best[c] : val < best[c]) {
                best[c] = val;
                who[c] = u;
              } else if (val == best[c] && u < who[c]) {
                who[c] = u;  // ties: the smallest source index
              }
            }
          }
          const bool empty = ip[v + 1] == ip[v];
          for (int64_t c = 0; c < width; ++c) {
            acc_t r = best[c];
            int64_t a = who[c];
            if (empty) {
              r = acc_t(0);
              a = -1;
            } else if (nan[c]) {
              r = std::numeric_limits<acc_t>::quiet_NaN();
              a = -1;
            }
            op_[v * width + c] = static_cast<scalar_t>(r);
            ap[v * width + c] = a == kNone ? -1 : a;
          }
        }
      });
    });
  });
  return {out, arg};
}

at::Tensor sddmm_dot_cpu(const at::Tensor& indptr, const at::Tensor& indices, const OptTensor& eids,
                         const at::Tensor& a_in, const at::Tensor& b_in) {
  const char* op = "dgl_exact.sddmm_dot";
  at::Tensor a, b;
  std::tie(a, b) = prepare_sddmm_operands(a_in, b_in, op);
  const int64_t n_dst = indptr.numel() - 1;
  const GraphArgs g = prepare_graph(indptr, indices, eids, n_dst, a.device(), op);
  const int64_t heads = a.size(1), dim = a.size(2);
  at::Tensor out = g.has_eids ? at::zeros({g.nnz, heads}, a.options()) : at::empty({g.nnz, heads}, a.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "dgl_exact_sddmm_dot_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(g.indices.scalar_type(), "dgl_exact_sddmm_dot_cpu_idx", [&] {
      const index_t* ip = g.indptr.data_ptr<index_t>();
      const index_t* ix = g.indices.data_ptr<index_t>();
      const index_t* ie = g.has_eids ? g.eids.data_ptr<index_t>() : nullptr;
      const scalar_t* ap = a.data_ptr<scalar_t>();
      const scalar_t* bp = b.data_ptr<scalar_t>();
      scalar_t* op_ = out.data_ptr<scalar_t>();
      const int64_t width = heads * dim;
      at::parallel_for(0, n_dst, grain_rows<index_t>(g.nnz, n_dst, width), [&](int64_t v0, int64_t v1) {
        for (int64_t v = v0; v < v1; ++v) {
          const scalar_t* bv = bp + v * width;
          for (int64_t i = ip[v]; i < ip[v + 1]; ++i) {
            const scalar_t* au = ap + static_cast<int64_t>(ix[i]) * width;
            const int64_t eid = ie ? static_cast<int64_t>(ie[i]) : i;
            for (int64_t h = 0; h < heads; ++h) {
              acc_t s = 0;
              for (int64_t d = 0; d < dim; ++d) s += static_cast<acc_t>(au[h * dim + d]) * static_cast<acc_t>(bv[h * dim + d]);
              op_[eid * heads + h] = static_cast<scalar_t>(s);
            }
          }
        }
      });
    });
  });
  return out;
}

}  // namespace dgl_exact

TORCH_LIBRARY_IMPL(dgl_exact, CPU, m) {
  m.impl("spmm_sum", &dgl_exact::spmm_sum_cpu);
  m.impl("spmm_minmax", &dgl_exact::spmm_minmax_cpu);
  m.impl("sddmm_dot", &dgl_exact::sddmm_dot_cpu);
}
