// Host-side declarations and argument handling shared by the CPU and CUDA implementations.
//
// The dispatchers (schemas in dgl_exact.cpp, CPU kernels in *_cpu.cpp, CUDA kernels in *_cuda.cu)
// all normalise their inputs the same way here, so both backends see contiguous tensors of the
// types they expect and raise the same errors.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>

#include "common.h"

namespace dgl_exact {

// A decoded fp32 value as the output type: clamped to that type's finite range first (a level past fp16's or
// bf16's largest value, in a group near it, decodes to that value instead of inf; reference.unpack_dequantize).
// NaN passes. fp32 and fp64 outputs: fp32's range (decode_value keeps decodes inside it already).
template <typename T>
DE_HD float output_finite_max() { return 3.4028234663852886e38f; }
template <>
DE_HD float output_finite_max<c10::Half>() { return 65504.0f; }
template <>
DE_HD float output_finite_max<c10::BFloat16>() { return 3.3895313892515355e38f; }
template <typename T>
DE_HD T to_output(float v) {
  const float m = output_finite_max<T>();
  return static_cast<T>(v > m ? m : (v < -m ? -m : v));
}

using OptTensor = c10::optional<at::Tensor>;

inline void check_bits(int64_t bits) {
  TORCH_CHECK(bits == 1 || bits == 2 || bits == 4 || bits == 8, "dgl_exact: bits must be 1, 2, 4 or 8, got ", bits);
}

// Calls f(integral_constant<int, BITS>, bool_constant<has_levels>) for the runtime bits / level choice, so
// that kernels and loops are instantiated per bit width (the CPU and the CUDA codec share this dispatch).
template <int BITS, typename F>
void with_levels(bool has_levels, F&& f) {
  if (has_levels) {
    f(std::integral_constant<int, BITS>{}, std::true_type{});
  } else {
    f(std::integral_constant<int, BITS>{}, std::false_type{});
  }
}

template <typename F>
void dispatch_bits(int64_t bits, bool has_levels, F&& f) {
  switch (bits) {
    case 1: with_levels<1>(has_levels, f); break;
    case 2: with_levels<2>(has_levels, f); break;
    case 4: with_levels<4>(has_levels, f); break;
    case 8: with_levels<8>(has_levels, f); break;
    default: TORCH_CHECK(false, "dgl_exact: bits must be 1, 2, 4 or 8, got ", bits);
  }
}

inline bool is_float_type(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

// fp32, contiguous, on `device` (the caller's lo/step/levels are normally already that).
inline at::Tensor as_f32(const at::Tensor& t, const at::Device& device) {
  return t.to(device, at::kFloat).contiguous();
}

struct CodecArgs {
  at::Tensor lo, step, levels;  // fp32 contiguous (lo, step: bf16 when meta_bf16); levels undefined for uniform levels
  bool has_levels = false;
  bool meta_bf16 = false;  // lo and step both bf16 (as compression keeps them): the kernels read their bits
};

// f(const M* lo, const M* step) with M = float, or uint16_t (the bits of bf16 metadata).
template <typename F>
void with_meta(const CodecArgs& c, F&& f) {
  if (c.meta_bf16) {
    f(reinterpret_cast<const uint16_t*>(c.lo.data_ptr<at::BFloat16>()),
      reinterpret_cast<const uint16_t*>(c.step.data_ptr<at::BFloat16>()));
  } else {
    f(c.lo.data_ptr<float>(), c.step.data_ptr<float>());
  }
}

inline CodecArgs prepare_codec(const at::Tensor& lo, const at::Tensor& step, const OptTensor& levels, int64_t bits,
                               int64_t block_rows, int64_t n_rows, const at::Device& device) {
  check_bits(bits);
  TORCH_CHECK(block_rows >= 1, "dgl_exact: block_rows must be >= 1, got ", block_rows);
  const int64_t n_groups = (n_rows + block_rows - 1) / block_rows;
  CodecArgs a;
  a.meta_bf16 = lo.scalar_type() == at::kBFloat16 && step.scalar_type() == at::kBFloat16;
  if (a.meta_bf16) {
    a.lo = lo.to(device).contiguous().reshape({-1});
    a.step = step.to(device).contiguous().reshape({-1});
  } else {
    a.lo = as_f32(lo, device).reshape({-1});
    a.step = as_f32(step, device).reshape({-1});
  }
  TORCH_CHECK(a.lo.numel() >= n_groups && a.step.numel() >= n_groups, "dgl_exact: lo/step hold ", a.lo.numel(), "/",
              a.step.numel(), " groups, need ", n_groups, " (", n_rows, " rows, block_rows ", block_rows, ")");
  if (levels.has_value() && levels->defined()) {
    a.levels = as_f32(*levels, device).reshape({-1});
    TORCH_CHECK(a.levels.numel() == (int64_t(1) << bits), "dgl_exact: a level table for ", bits, " bits has ",
                (int64_t(1) << bits), " entries, got ", a.levels.numel());
    a.has_levels = true;
  }
  return a;
}

// group_meta's per-group minima and maxima: fp32, contiguous, 1-D, the same length.
inline std::tuple<at::Tensor, at::Tensor> prepare_minmax(const at::Tensor& mn, const at::Tensor& mx) {
  TORCH_CHECK(mn.numel() == mx.numel(), "dgl_exact.group_meta: mn and mx differ in length (", mn.numel(), " vs ",
              mx.numel(), ")");
  TORCH_CHECK(mn.device() == mx.device(), "dgl_exact.group_meta: mn and mx are on different devices");
  TORCH_CHECK(is_float_type(mn.scalar_type()) && is_float_type(mx.scalar_type()),
              "dgl_exact.group_meta: mn and mx must be floating");
  return {as_f32(mn, mn.device()).reshape({-1}), as_f32(mx, mx.device()).reshape({-1})};
}

inline at::Tensor prepare_quantize_input(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, "dgl_exact.quantize_pack: x must be [N, k], got ", x.dim(), " dims");
  TORCH_CHECK(is_float_type(x.scalar_type()), "dgl_exact.quantize_pack: x must be floating, got ", x.scalar_type());
  return x.contiguous();
}

// compress_rows: the level table (fp32, 2^bits entries, or undefined) and the [2, G] bf16 metadata output.
inline CodecArgs prepare_compress(const at::Tensor& x, const OptTensor& levels, int64_t bits, int64_t block_rows) {
  check_bits(bits);
  TORCH_CHECK(block_rows >= 1, "dgl_exact: block_rows must be >= 1, got ", block_rows);
  CodecArgs a;
  if (levels.has_value() && levels->defined()) {
    a.levels = as_f32(*levels, x.device()).reshape({-1});
    TORCH_CHECK(a.levels.numel() == (int64_t(1) << bits), "dgl_exact: a level table for ", bits, " bits has ",
                (int64_t(1) << bits), " entries, got ", a.levels.numel());
    a.has_levels = true;
  }
  return a;
}

inline at::Tensor prepare_packed(const at::Tensor& packed, int64_t nbytes, const char* op) {
  TORCH_CHECK(packed.scalar_type() == at::kByte, op, ": packed must be uint8, got ", packed.scalar_type());
  auto p = packed.contiguous().reshape({-1});
  TORCH_CHECK(p.numel() >= nbytes, op, ": packed holds ", p.numel(), " bytes, need ", nbytes);
  return p;
}

// Graph in CSR over destinations; every index tensor converted to the dtype of `indices`.
struct GraphArgs {
  at::Tensor indptr, indices, eids;  // eids undefined for identity edge ids
  bool has_eids = false;
  int64_t n_dst = 0, nnz = 0;
};

inline GraphArgs prepare_graph(const at::Tensor& indptr, const at::Tensor& indices, const OptTensor& eids,
                               int64_t n_dst, const at::Device& device, const char* op) {
  const auto it = indices.scalar_type();
  TORCH_CHECK(it == at::kInt || it == at::kLong, op, ": indices must be int32 or int64, got ", it);
  GraphArgs g;
  g.indices = indices.to(device).contiguous().reshape({-1});
  g.indptr = indptr.to(device, it).contiguous().reshape({-1});
  TORCH_CHECK(g.indptr.numel() == n_dst + 1, op, ": indptr has ", g.indptr.numel(), " entries, expected n_dst + 1 = ",
              n_dst + 1);
  if (eids.has_value() && eids->defined()) {
    g.eids = eids->to(device, it).contiguous().reshape({-1});
    TORCH_CHECK(g.eids.numel() == g.indices.numel(), op, ": eids and indices differ in length");
    g.has_eids = true;
  }
  g.n_dst = n_dst;
  g.nnz = g.indices.numel();
  return g;
}

inline at::Tensor prepare_features(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.dim() == 3, op, ": features must be [n, H, D], got ", x.dim(), " dims");
  TORCH_CHECK(is_float_type(x.scalar_type()), op, ": features must be floating, got ", x.scalar_type());
  return x.contiguous();
}

// Per-edge values [E, H] (or [E] when H == 1), converted to the feature dtype as the reference does.
inline at::Tensor prepare_edge_values(const at::Tensor& w, const at::Tensor& x, const char* op) {
  const int64_t heads = x.size(1);
  at::Tensor v = w.to(x.device(), x.scalar_type()).contiguous();
  if (v.dim() == 1) {
    TORCH_CHECK(heads == 1, op, ": 1-D edge values need H == 1, features have H = ", heads);
    v = v.reshape({-1, 1});
  }
  TORCH_CHECK(v.dim() == 2 && v.size(1) == heads, op, ": edge values must be [E, H] with H = ", heads);
  return v;
}

// ---------------------------------------------------------------------------------------------------
// Implementations (CPU in *_cpu.cpp, CUDA in *_cuda.cu). Same signatures as the schemas.
// ---------------------------------------------------------------------------------------------------
#define DGL_EXACT_DECLARE_OPS(SUFFIX)                                                                              \
  at::Tensor group_meta_##SUFFIX(const at::Tensor& mn, const at::Tensor& mx, int64_t bits);                        \
  at::Tensor quantize_pack_##SUFFIX(const at::Tensor& x, const at::Tensor& lo, const at::Tensor& step,             \
                                    const OptTensor& levels, int64_t bits, int64_t block_rows, int64_t seed,       \
                                    bool stochastic);                                                              \
  std::tuple<at::Tensor, at::Tensor> compress_rows_##SUFFIX(const at::Tensor& x, const OptTensor& levels,          \
                                                            int64_t bits, int64_t block_rows, int64_t seed,         \
                                                            bool stochastic);                                       \
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> relu_dropout_compress_##SUFFIX(                       \
      const at::Tensor& x, double p, int64_t seed, const OptTensor& levels, int64_t bits, int64_t block_rows,      \
      int64_t code_seed, bool stochastic);                                                                         \
  at::Tensor unpack_dequantize_##SUFFIX(const at::Tensor& packed, const at::Tensor& lo, const at::Tensor& step,    \
                                        const OptTensor& levels, int64_t bits, int64_t block_rows, int64_t n_rows, \
                                        int64_t k, at::ScalarType dtype);                                          \
  at::Tensor pack_mask_##SUFFIX(const at::Tensor& mask);                                                           \
  at::Tensor unpack_mask_##SUFFIX(const at::Tensor& packed, int64_t numel);                                        \
  at::Tensor dropout_##SUFFIX(const at::Tensor& x, double p, int64_t seed);                                        \
  std::tuple<at::Tensor, at::Tensor> relu_dropout_##SUFFIX(const at::Tensor& x, double p, int64_t seed);           \
  at::Tensor masked_scale_##SUFFIX(const at::Tensor& g, const at::Tensor& packed, double on, double off);          \
  void rademacher_##SUFFIX(const at::Tensor& out, int64_t seed);                                                   \
  at::Tensor spmm_sum_##SUFFIX(const at::Tensor& indptr, const at::Tensor& indices, const OptTensor& eids,         \
                               const at::Tensor& x, const OptTensor& w, int64_t n_dst);                            \
  std::tuple<at::Tensor, at::Tensor> spmm_minmax_##SUFFIX(const at::Tensor& indptr, const at::Tensor& indices,     \
                                                          const OptTensor& eids, const at::Tensor& x,              \
                                                          c10::string_view reduce, int64_t n_dst);                 \
  at::Tensor sddmm_dot_##SUFFIX(const at::Tensor& indptr, const at::Tensor& indices, const OptTensor& eids,        \
                                const at::Tensor& a, const at::Tensor& b);

DGL_EXACT_DECLARE_OPS(cpu)
DGL_EXACT_DECLARE_OPS(cuda)

inline bool parse_reduce(c10::string_view reduce, const char* op) {
  const std::string r(reduce.data(), reduce.size());  // c10::string_view differs across torch versions
  TORCH_CHECK(r == "max" || r == "min", op, ": reduce must be 'max' or 'min', got '", r, "'");
  return r == "max";
}

// Scalars of the elementwise ops (see common.h), converted the way torch converts the reference's scalars.
template <typename scalar_t, typename acc_t>
ElementwiseParams<acc_t> make_elementwise_params(int op, uint64_t seed, double p, double on, double off) {
  ElementwiseParams<acc_t> prm;
  prm.seed = seed;
  prm.p = static_cast<float>(p);
  prm.drop = op == kDropout || p > 0;
  prm.scale = static_cast<acc_t>(prm.drop ? 1.0 / (1.0 - p) : 1.0);
  prm.zero_off = off == 0.0;
  prm.scale_on = on != 1.0;
  prm.on_s = static_cast<acc_t>(on);
  prm.on_t = static_cast<acc_t>(static_cast<scalar_t>(static_cast<acc_t>(on)));
  prm.off_t = static_cast<acc_t>(static_cast<scalar_t>(static_cast<acc_t>(off)));
  return prm;
}

inline CodecShape make_codec_shape(int64_t n_rows, int64_t k, int64_t block_rows) {
  constexpr int64_t kU32Max = 0xFFFFFFFFll;
  CodecShape sh;
  sh.n = n_rows * k;
  sh.k = k;
  sh.block_rows = block_rows;
  sh.small_e = sh.n <= kU32Max;
  sh.small_r = n_rows <= kU32Max && block_rows <= kU32Max;
  return sh;
}

// rademacher_: out must be a contiguous [d, k] float tensor; returns fp32(1 / sqrt(k)) (the value Python's
// 1.0 / math.sqrt(k) rounds to: both are correctly rounded double operations).
inline float prepare_rademacher(const at::Tensor& out) {
  TORCH_CHECK(out.dim() == 2, "dgl_exact.rademacher_: out must be [d, k], got ", out.dim(), " dims");
  TORCH_CHECK(out.is_contiguous(), "dgl_exact.rademacher_: out must be contiguous");
  TORCH_CHECK(is_float_type(out.scalar_type()), "dgl_exact.rademacher_: out must be floating, got ",
              out.scalar_type());
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(out.size(1))));
}

// Output shapes and dtype of sddmm_dot: [nnz, H] in the promoted dtype of a and b.
inline std::tuple<at::Tensor, at::Tensor> prepare_sddmm_operands(const at::Tensor& a, const at::Tensor& b,
                                                                 const char* op) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3, op, ": a and b must be [n, H, D]");
  TORCH_CHECK(a.size(1) == b.size(1) && a.size(2) == b.size(2), op, ": a and b differ in H or D");
  const auto t = at::result_type(a, b);
  TORCH_CHECK(is_float_type(t), op, ": features must be floating, got ", t);
  return {a.to(t).contiguous(), b.to(b.device(), t).contiguous()};
}

}  // namespace dgl_exact
