// CUDA kernels of the compression codec: quantize_pack / unpack_dequantize. Bit-exact with reference.py
// (codes; decoded values are the same fp32 operations, issued with explicit round-to-nearest intrinsics).
//
// Layout for bandwidth. Quantize: every thread owns one 32-bit word of packed output, i.e. 32 / bits
// consecutive elements (16 for INT2), read with 16-byte vector loads; the group's lo / 1/step are loaded
// once per word (twice when the word crosses into the next group), the uniforms come from the
// counter-based hash in registers (no noise tensor), and the word is written with one 32-bit store.
// Decode: every thread owns one 16-byte chunk of output (4 fp32 or 8 fp16/bf16 values), so a warp's
// stores are contiguous for every code width. Grid-stride loops, any shape: rows narrower than a word or
// chunk and the tail take a scalar path. group_meta: one thread per group.
// fp64 tensors go through fp32 (the reference quantises x.float() and decodes in fp32 too).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "cuda_utils.cuh"
#include "dgl_exact.h"

// fp32, fp16, bf16 (fp64 goes through fp32 in the dispatchers: fewer kernels to compile).
#define DGL_EXACT_DISPATCH_FLOAT_HALF_BF16(TYPE, NAME, ...)   \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::ScalarType::Float, __VA_ARGS__) \
                                     AT_DISPATCH_CASE(at::ScalarType::Half, __VA_ARGS__)  \
                                     AT_DISPATCH_CASE(at::ScalarType::BFloat16, __VA_ARGS__))

namespace dgl_exact {
namespace {

// Element access for the word templates of common.h: vector loads / stores on the fast path.
template <typename scalar_t, int EPW>
struct CudaSrc {
  const scalar_t* x;
  __device__ __forceinline__ void block(int64_t e0, float (&v)[EPW]) const {
    scalar_t raw[EPW];
    load_vec<scalar_t, EPW>(x + e0, raw);
#pragma unroll
    for (int i = 0; i < EPW; ++i) v[i] = static_cast<float>(raw[i]);
  }
  __device__ __forceinline__ float one(int64_t e) const { return static_cast<float>(x[e]); }
};

// The level table (2^bits fp32) goes to shared memory.
template <bool LEVELS, int NL>
__device__ __forceinline__ const float* stage_levels(const float* __restrict__ levels, float* s_levels) {
  if (LEVELS) {
    for (int i = threadIdx.x; i < NL; i += blockDim.x) s_levels[i] = levels[i];
    __syncthreads();
  }
  return s_levels;
}

// One thread per 32-bit word of codes (grid-stride).
template <int BITS, bool LEVELS, typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    quantize_pack_kernel(const scalar_t* __restrict__ x, const float* __restrict__ lo, const float* __restrict__ step,
                         const float* __restrict__ levels, uint8_t* __restrict__ out, CodecShape sh, uint64_t seed,
                         bool stochastic, bool vec) {
  constexpr int EPW = 32 / BITS;
  constexpr int NL = LEVELS ? (1 << BITS) : 1;
  __shared__ float s_levels[NL];
  const float* L = stage_levels<LEVELS, NL>(levels, s_levels);
  const CudaSrc<scalar_t, EPW> src{x};
  const int64_t n_words = (sh.n + EPW - 1) / EPW;
  const int64_t n_full = sh.n / EPW;
  const int64_t nbytes = packed_nbytes(sh.n, BITS);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < n_words; w += stride) {
    const uint32_t word = quantize_word<BITS, LEVELS>(src, w, sh, lo, step, L, seed, stochastic, vec);
    if (w < n_full) {
      reinterpret_cast<uint32_t*>(out)[w] = word;
    } else {
#pragma unroll
      for (int b = 0; b < 4; ++b)
        if (4 * w + b < nbytes) out[4 * w + b] = static_cast<uint8_t>(word >> (8 * b));
    }
  }
}

// One thread per chunk of V = 16 / sizeof(out_t) output elements (grid-stride): one 16-byte store each,
// consecutive threads writing consecutive chunks.
template <int BITS, bool LEVELS, typename out_t>
__global__ void __launch_bounds__(kThreads)
    unpack_dequantize_kernel(const uint8_t* __restrict__ packed, const float* __restrict__ lo,
                             const float* __restrict__ step, const float* __restrict__ levels, out_t* __restrict__ out,
                             CodecShape sh, bool aligned_in, bool vec_out) {
  constexpr int V = 16 / static_cast<int>(sizeof(out_t));
  constexpr int NL = LEVELS ? (1 << BITS) : 1;
  __shared__ float s_levels[NL];
  const float* L = stage_levels<LEVELS, NL>(levels, s_levels);
  const int64_t n_chunks = (sh.n + V - 1) / V;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < n_chunks; c += stride) {
    const int64_t left = sh.n - c * V;
    const int count = left < V ? static_cast<int>(left) : V;
    float v[V];
    dequantize_chunk<BITS, LEVELS, V>(packed, c, count, sh, lo, step, L, aligned_in, v);
    if (count == V && vec_out) {
      out_t o[V];
#pragma unroll
      for (int i = 0; i < V; ++i) o[i] = static_cast<out_t>(v[i]);
      store_vec<out_t, V>(out + c * V, o);
    } else {
      for (int i = 0; i < count; ++i) out[c * V + i] = static_cast<out_t>(v[i]);
    }
  }
}

// One thread per group (grid-stride): the metadata of all G groups in one launch.
__global__ void __launch_bounds__(kThreads)
    group_meta_kernel(const float* __restrict__ mn, const float* __restrict__ mx, float* __restrict__ out, int64_t g,
                      float factor, float top) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < g; i += stride) {
    float lo, step;
    group_meta_one(mn[i], mx[i], factor, top, lo, step);
    out[i] = lo;
    out[g + i] = step;
  }
}

}  // namespace

at::Tensor group_meta_cuda(const at::Tensor& mn_in, const at::Tensor& mx_in, int64_t bits) {
  TORCH_CHECK(mn_in.is_cuda(), "dgl_exact.group_meta: mn must be a CUDA tensor");
  check_bits(bits);
  const c10::cuda::CUDAGuard guard(mn_in.device());
  const auto [mn, mx] = prepare_minmax(mn_in, mx_in);
  const int64_t g = mn.numel();
  at::Tensor out = at::empty({2, g}, mn.options());
  if (g == 0) return out;
  group_meta_kernel<<<grid_for(g), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      mn.data_ptr<float>(), mx.data_ptr<float>(), out.data_ptr<float>(), g, meta_factor(bits),
      static_cast<float>((int64_t(1) << bits) - 1));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor quantize_pack_cuda(const at::Tensor& x_in, const at::Tensor& lo, const at::Tensor& step,
                              const OptTensor& levels, int64_t bits, int64_t block_rows, int64_t seed,
                              bool stochastic) {
  TORCH_CHECK(x_in.is_cuda(), "dgl_exact.quantize_pack: x must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(x_in.device());
  at::Tensor x = prepare_quantize_input(x_in);
  if (x.scalar_type() == at::kDouble) x = x.to(at::kFloat);  // the reference quantises x.float()
  const int64_t n_rows = x.size(0), k = x.size(1), n = x.numel();
  const CodecArgs c = prepare_codec(lo, step, levels, bits, block_rows, n_rows, x.device());
  at::Tensor out = at::empty({packed_nbytes(n, bits)}, x.options().dtype(at::kByte));
  if (n == 0) return out;
  const float* L = c.has_levels ? c.levels.data_ptr<float>() : nullptr;
  const CodecShape sh = make_codec_shape(n_rows, k, block_rows);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  DGL_EXACT_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "dgl_exact_quantize_pack_cuda", [&] {
    dispatch_bits(bits, c.has_levels, [&](auto bits_c, auto levels_c) {
      constexpr int B = decltype(bits_c)::value;
      constexpr bool LV = decltype(levels_c)::value;
      const int64_t words = (n + 32 / B - 1) / (32 / B);
      quantize_pack_kernel<B, LV, scalar_t><<<grid_for(words), kThreads, 0, stream>>>(
          x.data_ptr<scalar_t>(), c.lo.data_ptr<float>(), c.step.data_ptr<float>(), L, out.data_ptr<uint8_t>(), sh,
          static_cast<uint64_t>(seed), stochastic, aligned16(x.data_ptr()));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return out;
}

at::Tensor unpack_dequantize_cuda(const at::Tensor& packed_in, const at::Tensor& lo, const at::Tensor& step,
                                  const OptTensor& levels, int64_t bits, int64_t block_rows, int64_t n_rows, int64_t k,
                                  at::ScalarType dtype) {
  TORCH_CHECK(packed_in.is_cuda(), "dgl_exact.unpack_dequantize: packed must be a CUDA tensor");
  check_bits(bits);
  TORCH_CHECK(n_rows >= 0 && k >= 0, "dgl_exact.unpack_dequantize: negative shape");
  TORCH_CHECK(is_float_type(dtype), "dgl_exact.unpack_dequantize: dtype must be floating, got ", dtype);
  const c10::cuda::CUDAGuard guard(packed_in.device());
  const int64_t n = n_rows * k;
  const at::Tensor packed = prepare_packed(packed_in, packed_nbytes(n, bits), "dgl_exact.unpack_dequantize");
  const CodecArgs c = prepare_codec(lo, step, levels, bits, block_rows, n_rows, packed.device());
  // fp64 output: decode in fp32 (as the reference does) and widen; exact.
  const at::ScalarType kernel_dtype = dtype == at::kDouble ? at::kFloat : dtype;
  at::Tensor out = at::empty({n_rows, k}, packed.options().dtype(kernel_dtype));
  if (n == 0) return out.to(dtype);
  const float* L = c.has_levels ? c.levels.data_ptr<float>() : nullptr;
  const CodecShape sh = make_codec_shape(n_rows, k, block_rows);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  DGL_EXACT_DISPATCH_FLOAT_HALF_BF16(kernel_dtype, "dgl_exact_unpack_dequantize_cuda", [&] {
    dispatch_bits(bits, c.has_levels, [&](auto bits_c, auto levels_c) {
      constexpr int B = decltype(bits_c)::value;
      constexpr bool LV = decltype(levels_c)::value;
      constexpr int V = 16 / static_cast<int>(sizeof(scalar_t));
      unpack_dequantize_kernel<B, LV, scalar_t><<<grid_for((n + V - 1) / V), kThreads, 0, stream>>>(
          packed.data_ptr<uint8_t>(), c.lo.data_ptr<float>(), c.step.data_ptr<float>(), L, out.data_ptr<scalar_t>(),
          sh, (reinterpret_cast<uintptr_t>(packed.data_ptr()) & 7) == 0, aligned16(out.data_ptr()));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return kernel_dtype == dtype ? out : out.to(dtype);
}

}  // namespace dgl_exact

TORCH_LIBRARY_IMPL(dgl_exact, CUDA, m) {
  m.impl("group_meta", &dgl_exact::group_meta_cuda);
  m.impl("quantize_pack", &dgl_exact::quantize_pack_cuda);
  m.impl("unpack_dequantize", &dgl_exact::unpack_dequantize_cuda);
}
