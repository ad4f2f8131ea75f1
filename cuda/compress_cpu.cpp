// CPU kernels: compression (quantize_pack / unpack_dequantize), 1-bit masks, dropout, fused ReLU+dropout,
// masked_scale; bit-exact with reference.py. The codec walks whole 32-bit code words and the elementwise
// ops call the per-element function through the same templates (common.h) as the CUDA kernels, so the
// CPU tests also check the CUDA kernels' logic. Parallelised with at::parallel_for.
#include <algorithm>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "dgl_exact.h"

namespace dgl_exact {
namespace {

constexpr int64_t kGrainWords = 1 << 10;

// Element access for the word templates of common.h (the same code the CUDA kernels run).
template <typename scalar_t, int EPW>
struct CpuSrc {
  const scalar_t* x;
  void block(int64_t e0, float (&v)[EPW]) const {
    for (int i = 0; i < EPW; ++i) v[i] = static_cast<float>(x[e0 + i]);
  }
  float one(int64_t e) const { return static_cast<float>(x[e]); }
};

template <int BITS, bool LEVELS, typename scalar_t>
void quantize_pack_loop(const scalar_t* x, const float* lo, const float* step, const float* L, uint8_t* out,
                        const CodecShape& sh, uint64_t seed, bool stochastic) {
  constexpr int EPW = 32 / BITS;
  const int64_t n_words = (sh.n + EPW - 1) / EPW;
  const int64_t nbytes = packed_nbytes(sh.n, BITS);
  const CpuSrc<scalar_t, EPW> src{x};
  at::parallel_for(0, n_words, kGrainWords, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const uint32_t word = quantize_word<BITS, LEVELS>(src, w, sh, lo, step, L, seed, stochastic, true);
      for (int b = 0; b < 4 && 4 * w + b < nbytes; ++b) out[4 * w + b] = static_cast<uint8_t>(word >> (8 * b));
    }
  });
}

// compress_rows: chunks of whole groups that end on whole code words (word_aligned_groups), in parallel; per
// chunk, each group's range and metadata, then the chunk's codes while its values are still in cache.
// `prepare(e0, e1)` first writes the values of elements [e0, e1) to `x` (relu_dropout_compress: the fused
// activation's output and mask; ALIGN = 8 then keeps every mask byte inside one chunk).
template <int BITS, bool LEVELS, int ALIGN, typename scalar_t, typename Prepare>
void compress_rows_loop(const scalar_t* x, const float* L, float* lo, float* step, uint16_t* meta, uint8_t* out,
                        const CodecShape& sh, int64_t n_groups, uint64_t seed, bool stochastic, Prepare&& prepare) {
  constexpr int EPW = 32 / BITS;
  const int64_t ge = sh.block_rows * sh.k;  // elements of a full group
  const int64_t c0 = word_aligned_groups(ge, EPW > ALIGN ? EPW : ALIGN);
  const int64_t per_chunk = c0 * std::max<int64_t>(1, (int64_t(1) << 14) / (c0 * ge));  // groups per chunk
  const int64_t n_chunks = (n_groups + per_chunk - 1) / per_chunk;
  const int64_t n_words = (sh.n + EPW - 1) / EPW;
  const int64_t nbytes = packed_nbytes(sh.n, BITS);
  const float factor = meta_factor(BITS);
  const float top = static_cast<float>((1 << BITS) - 1);
  const CpuSrc<scalar_t, EPW> src{x};
  at::parallel_for(0, n_chunks, 1, [&](int64_t c_begin, int64_t c_end) {
    for (int64_t ci = c_begin; ci < c_end; ++ci) {
      const int64_t g0 = ci * per_chunk, g1 = std::min(n_groups, g0 + per_chunk);
      prepare(g0 * ge, std::min(sh.n, g1 * ge));
      for (int64_t g = g0; g < g1; ++g) {
        GroupRange r;
        const int64_t e_end = std::min(sh.n, (g + 1) * ge);
        for (int64_t e = g * ge; e < e_end; ++e) r.add(static_cast<float>(x[e]));
        r.meta(factor, top, lo[g], step[g]);
        meta[g] = bf16_bits(lo[g]);
        meta[n_groups + g] = bf16_bits(step[g]);
      }
      // g0 * ge is a multiple of EPW: no word of this chunk holds codes of another chunk's groups
      const int64_t w0 = g0 * ge / EPW;
      const int64_t w1 = g1 == n_groups ? n_words : g1 * ge / EPW;
      for (int64_t w = w0; w < w1; ++w) {
        const uint32_t word = quantize_word<BITS, LEVELS>(src, w, sh, lo, step, L, seed, stochastic, true);
        for (int b = 0; b < 4 && 4 * w + b < nbytes; ++b) out[4 * w + b] = static_cast<uint8_t>(word >> (8 * b));
      }
    }
  });
}

struct NoPrepare {
  void operator()(int64_t, int64_t) const {}
};

// By chunks of V = 16 / sizeof(out_t) elements, through the CUDA kernel's per-chunk function (common.h).
template <int BITS, bool LEVELS, typename out_t, typename M>
void unpack_dequantize_loop(const uint8_t* packed, const M* lo, const M* step, const float* L, out_t* out,
                            const CodecShape& sh) {
  constexpr int V = 16 / static_cast<int>(sizeof(out_t));
  const int64_t n_chunks = (sh.n + V - 1) / V;
  at::parallel_for(0, n_chunks, kGrainWords * 4, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int count = static_cast<int>(std::min<int64_t>(V, sh.n - c * V));
      float v[V];
      dequantize_chunk<BITS, LEVELS, V>(packed, c, count, sh, lo, step, L, false, v);
      for (int i = 0; i < count; ++i) out[c * V + i] = to_output<out_t>(v[i]);
    }
  });
}

// dropout / relu_dropout / masked_scale over bytes of 8 elements (one byte of mask bits in or out).
template <int OP>
void elementwise_cpu(const at::Tensor& x, const at::Tensor& y, const uint8_t* mask_in, uint8_t* mask_out,
                     uint64_t seed, double p, double on, double off) {
  const int64_t n = x.numel();
  const int64_t nbytes = packed_nbytes(n, 1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dgl_exact_elementwise_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto prm = make_elementwise_params<scalar_t, acc_t>(OP, seed, p, on, off);
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    at::parallel_for(0, nbytes, kGrainWords * 4, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const uint32_t in = mask_in ? mask_in[b] : 0u;
        uint32_t bits = 0;
        for (int i = 0; i < 8 && b * 8 + i < n; ++i) {
          const int64_t e = b * 8 + i;
          bool bit = false;
          yp[e] = static_cast<scalar_t>(apply_elementwise<OP>(static_cast<acc_t>(xp[e]), e, (in >> i) & 1u, bit, prm));
          bits |= static_cast<uint32_t>(bit) << i;
        }
        if (mask_out) mask_out[b] = static_cast<uint8_t>(bits);
      }
    });
  });
}

}  // namespace

at::Tensor group_meta_cpu(const at::Tensor& mn_in, const at::Tensor& mx_in, int64_t bits) {
  check_bits(bits);
  const auto [mn, mx] = prepare_minmax(mn_in, mx_in);
  const int64_t g = mn.numel();
  at::Tensor out = at::empty({2, g}, mn.options());
  const float factor = meta_factor(bits);
  const float top = static_cast<float>((int64_t(1) << bits) - 1);
  const float* a = mn.data_ptr<float>();
  const float* b = mx.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, g, kGrainWords * 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) group_meta_one(a[i], b[i], factor, top, o[i], o[g + i]);
  });
  return out;
}

at::Tensor quantize_pack_cpu(const at::Tensor& x_in, const at::Tensor& lo, const at::Tensor& step,
                             const OptTensor& levels, int64_t bits, int64_t block_rows, int64_t seed,
                             bool stochastic) {
  const at::Tensor x = prepare_quantize_input(x_in);
  const int64_t n_rows = x.size(0), k = x.size(1), n = x.numel();
  const CodecArgs c = prepare_codec(lo, step, levels, bits, block_rows, n_rows, x.device());
  at::Tensor out = at::empty({packed_nbytes(n, bits)}, x.options().dtype(at::kByte));
  if (n == 0) return out;
  const float* L = c.has_levels ? c.levels.data_ptr<float>() : nullptr;
  const CodecShape sh = make_codec_shape(n_rows, k, block_rows);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dgl_exact_quantize_pack_cpu", [&] {
    dispatch_bits(bits, c.has_levels, [&](auto bits_c, auto levels_c) {
      quantize_pack_loop<decltype(bits_c)::value, decltype(levels_c)::value, scalar_t>(
          x.data_ptr<scalar_t>(), c.lo.data_ptr<float>(), c.step.data_ptr<float>(), L, out.data_ptr<uint8_t>(), sh,
          static_cast<uint64_t>(seed), stochastic);
    });
  });
  return out;
}

at::Tensor unpack_dequantize_cpu(const at::Tensor& packed_in, const at::Tensor& lo, const at::Tensor& step,
                                 const OptTensor& levels, int64_t bits, int64_t block_rows, int64_t n_rows, int64_t k,
                                 at::ScalarType dtype) {
  check_bits(bits);
  TORCH_CHECK(n_rows >= 0 && k >= 0, "dgl_exact.unpack_dequantize: negative shape");
  TORCH_CHECK(is_float_type(dtype), "dgl_exact.unpack_dequantize: dtype must be floating, got ", dtype);
  const int64_t n = n_rows * k;
  const at::Tensor packed = prepare_packed(packed_in, packed_nbytes(n, bits), "dgl_exact.unpack_dequantize");
  const CodecArgs c = prepare_codec(lo, step, levels, bits, block_rows, n_rows, packed.device());
  at::Tensor out = at::empty({n_rows, k}, packed.options().dtype(dtype));
  if (n == 0) return out;
  const float* L = c.has_levels ? c.levels.data_ptr<float>() : nullptr;
  const CodecShape sh = make_codec_shape(n_rows, k, block_rows);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "dgl_exact_unpack_dequantize_cpu", [&] {
    dispatch_bits(bits, c.has_levels, [&](auto bits_c, auto levels_c) {
      with_meta(c, [&](auto lo_p, auto step_p) {
        unpack_dequantize_loop<decltype(bits_c)::value, decltype(levels_c)::value, scalar_t>(
            packed.data_ptr<uint8_t>(), lo_p, step_p, L, out.data_ptr<scalar_t>(), sh);
      });
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> compress_rows_cpu(const at::Tensor& x_in, const OptTensor& levels, int64_t bits,
                                                     int64_t block_rows, int64_t seed, bool stochastic) {
  const at::Tensor x = prepare_quantize_input(x_in);
  const CodecArgs c = prepare_compress(x, levels, bits, block_rows);
  const int64_t n_rows = x.size(0), k = x.size(1), n = x.numel();
  const int64_t n_groups = (n_rows + block_rows - 1) / block_rows;
  at::Tensor out = at::empty({packed_nbytes(n, bits)}, x.options().dtype(at::kByte));
  at::Tensor meta = at::zeros({2, n_groups}, x.options().dtype(at::kBFloat16));
  if (n == 0) return {out, meta};
  at::Tensor scratch = at::empty({2, n_groups}, x.options().dtype(at::kFloat));  // fp32 lo, step for the codes
  const float* L = c.has_levels ? c.levels.data_ptr<float>() : nullptr;
  const CodecShape sh = make_codec_shape(n_rows, k, block_rows);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dgl_exact_compress_rows_cpu", [&] {
    dispatch_bits(bits, c.has_levels, [&](auto bits_c, auto levels_c) {
      compress_rows_loop<decltype(bits_c)::value, decltype(levels_c)::value, 1, scalar_t>(
          x.data_ptr<scalar_t>(), L, scratch.data_ptr<float>(), scratch.data_ptr<float>() + n_groups,
          reinterpret_cast<uint16_t*>(meta.data_ptr<at::BFloat16>()), out.data_ptr<uint8_t>(), sh, n_groups,
          static_cast<uint64_t>(seed), stochastic, NoPrepare{});
    });
  });
  return {out, meta};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> relu_dropout_compress_cpu(
    const at::Tensor& x_in, double p, int64_t seed, const OptTensor& levels, int64_t bits, int64_t block_rows,
    int64_t code_seed, bool stochastic) {
  const at::Tensor x = prepare_quantize_input(x_in);
  const CodecArgs c = prepare_compress(x, levels, bits, block_rows);
  const int64_t n_rows = x.size(0), k = x.size(1), n = x.numel();
  const int64_t n_groups = (n_rows + block_rows - 1) / block_rows;
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::Tensor mask = at::empty({packed_nbytes(n, 1)}, x.options().dtype(at::kByte));
  at::Tensor out = at::empty({packed_nbytes(n, bits)}, x.options().dtype(at::kByte));
  at::Tensor meta = at::zeros({2, n_groups}, x.options().dtype(at::kBFloat16));
  if (n == 0) return {y, mask, out, meta};
  at::Tensor scratch = at::empty({2, n_groups}, x.options().dtype(at::kFloat));
  const float* L = c.has_levels ? c.levels.data_ptr<float>() : nullptr;
  const CodecShape sh = make_codec_shape(n_rows, k, block_rows);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dgl_exact_relu_dropout_compress_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto prm = make_elementwise_params<scalar_t, acc_t>(kReluDropout, static_cast<uint64_t>(seed), p, 1.0, 0.0);
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    uint8_t* mp = mask.data_ptr<uint8_t>();
    // the activation of elements [e0, e1) (e0 a multiple of 8: whole mask bytes), as relu_dropout_cpu computes it
    auto activation = [&](int64_t e0, int64_t e1) {
      for (int64_t b = e0 / 8; b * 8 < e1; ++b) {
        uint32_t byte = 0;
        for (int i = 0; i < 8 && b * 8 + i < e1; ++i) {
          const int64_t e = b * 8 + i;
          bool bit = false;
          yp[e] = static_cast<scalar_t>(apply_elementwise<kReluDropout>(static_cast<acc_t>(xp[e]), e, false, bit, prm));
          byte |= static_cast<uint32_t>(bit) << i;
        }
        mp[b] = static_cast<uint8_t>(byte);
      }
    };
    dispatch_bits(bits, c.has_levels, [&](auto bits_c, auto levels_c) {
      compress_rows_loop<decltype(bits_c)::value, decltype(levels_c)::value, 8, scalar_t>(
          yp, L, scratch.data_ptr<float>(), scratch.data_ptr<float>() + n_groups,
          reinterpret_cast<uint16_t*>(meta.data_ptr<at::BFloat16>()), out.data_ptr<uint8_t>(), sh, n_groups,
          static_cast<uint64_t>(code_seed), stochastic, activation);
    });
  });
  return {y, mask, out, meta};
}

at::Tensor pack_mask_cpu(const at::Tensor& mask_in) {
  const at::Tensor mask = mask_in.to(at::kBool).contiguous().reshape({-1});
  const int64_t n = mask.numel();
  const int64_t nbytes = packed_nbytes(n, 1);
  at::Tensor out = at::empty({nbytes}, mask.options().dtype(at::kByte));
  const bool* m = mask.data_ptr<bool>();
  uint8_t* o = out.data_ptr<uint8_t>();
  at::parallel_for(0, nbytes, kGrainWords * 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      uint32_t byte = 0;
      const int64_t e0 = b * 8;
      for (int i = 0; i < 8 && e0 + i < n; ++i) byte |= static_cast<uint32_t>(m[e0 + i] ? 1 : 0) << i;
      o[b] = static_cast<uint8_t>(byte);
    }
  });
  return out;
}

at::Tensor unpack_mask_cpu(const at::Tensor& packed_in, int64_t numel) {
  TORCH_CHECK(numel >= 0, "dgl_exact.unpack_mask: negative numel");
  const at::Tensor packed = prepare_packed(packed_in, packed_nbytes(numel, 1), "dgl_exact.unpack_mask");
  at::Tensor out = at::empty({numel}, packed.options().dtype(at::kBool));
  const uint8_t* p = packed.data_ptr<uint8_t>();
  bool* o = out.data_ptr<bool>();
  at::parallel_for(0, numel, kGrainWords * 32, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) o[e] = (p[e >> 3] >> (e & 7)) & 1;
  });
  return out;
}

at::Tensor dropout_cpu(const at::Tensor& x_in, double p, int64_t seed) {
  const at::Tensor x = x_in.contiguous();
  TORCH_CHECK(is_float_type(x.scalar_type()), "dgl_exact.dropout: x must be floating, got ", x.scalar_type());
  at::Tensor y = at::empty(x.sizes(), x.options());
  elementwise_cpu<kDropout>(x, y, nullptr, nullptr, static_cast<uint64_t>(seed), p, 1.0, 0.0);
  return y;
}

std::tuple<at::Tensor, at::Tensor> relu_dropout_cpu(const at::Tensor& x_in, double p, int64_t seed) {
  const at::Tensor x = x_in.contiguous();
  TORCH_CHECK(is_float_type(x.scalar_type()), "dgl_exact.relu_dropout: x must be floating, got ", x.scalar_type());
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::Tensor packed = at::empty({packed_nbytes(x.numel(), 1)}, x.options().dtype(at::kByte));
  elementwise_cpu<kReluDropout>(x, y, nullptr, packed.data_ptr<uint8_t>(), static_cast<uint64_t>(seed), p, 1.0, 0.0);
  return {y, packed};
}

at::Tensor masked_scale_cpu(const at::Tensor& g_in, const at::Tensor& packed_in, double on, double off) {
  const at::Tensor g = g_in.contiguous();
  TORCH_CHECK(is_float_type(g.scalar_type()), "dgl_exact.masked_scale: g must be floating, got ", g.scalar_type());
  const at::Tensor packed = prepare_packed(packed_in, packed_nbytes(g.numel(), 1), "dgl_exact.masked_scale");
  at::Tensor y = at::empty(g.sizes(), g.options());
  elementwise_cpu<kMaskedScale>(g, y, packed.data_ptr<uint8_t>(), nullptr, 0, 0.0, on, off);
  return y;
}

void rademacher_cpu(const at::Tensor& out, int64_t seed) {
  const float v = prepare_rademacher(out);
  const int64_t n = out.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "dgl_exact_rademacher_cpu", [&] {
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, kGrainWords * 32, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e) {
        o[e] = static_cast<scalar_t>(rademacher_entry(static_cast<uint64_t>(seed), static_cast<uint64_t>(e), v));
      }
    });
  });
}

}  // namespace dgl_exact

TORCH_LIBRARY_IMPL(dgl_exact, CPU, m) {
  m.impl("group_meta", &dgl_exact::group_meta_cpu);
  m.impl("quantize_pack", &dgl_exact::quantize_pack_cpu);
  m.impl("unpack_dequantize", &dgl_exact::unpack_dequantize_cpu);
  m.impl("compress_rows", &dgl_exact::compress_rows_cpu);
  m.impl("relu_dropout_compress", &dgl_exact::relu_dropout_compress_cpu);
  m.impl("pack_mask", &dgl_exact::pack_mask_cpu);
  m.impl("unpack_mask", &dgl_exact::unpack_mask_cpu);
  m.impl("dropout", &dgl_exact::dropout_cpu);
  m.impl("relu_dropout", &dgl_exact::relu_dropout_cpu);
  m.impl("masked_scale", &dgl_exact::masked_scale_cpu);
  m.impl("rademacher_", &dgl_exact::rademacher_cpu);
}
