// CUDA kernels of the compression codec: quantize_pack / unpack_dequantize. Bit-exact with reference.py
// (codes; decoded values are the same fp32 operations, issued with explicit round-to-nearest intrinsics).
//
// Layout for bandwidth. Quantize: every thread owns 16 consecutive elements: one 32-bit word of packed
// output for INT2 (two for INT4, four for INT8, written with one 8- or 16-byte store; INT1: one word of 32
// elements), read with 16-byte vector loads; the group's lo / 1/step are loaded once per word (twice when
// the word crosses into the next group) and the uniforms come from the counter-based hash in registers (no
// noise tensor). compress_rows (the whole compression of a tensor from its values: group ranges, bf16
// metadata, codes) reads each chunk of whole groups once into shared memory (see compress_rows_kernel).
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

// Code words per thread: INT8 and INT4 words hold only 4 and 8 elements, so a thread takes 4 and 2 of them
// (16 elements, as an INT2 thread does) and writes them with one 16- or 8-byte store.
template <int BITS>
constexpr int words_per_thread() {
  return BITS == 8 ? 4 : (BITS == 4 ? 2 : 1);
}

// WPT = words_per_thread consecutive 32-bit words of codes per thread (grid-stride over word runs).
template <int BITS, bool LEVELS, typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    quantize_pack_kernel(const scalar_t* __restrict__ x, const float* __restrict__ lo, const float* __restrict__ step,
                         const float* __restrict__ levels, uint8_t* __restrict__ out, CodecShape sh, uint64_t seed,
                         bool stochastic, bool vec) {
  constexpr int EPW = 32 / BITS;
  constexpr int WPT = words_per_thread<BITS>();
  constexpr int NL = LEVELS ? (1 << BITS) : 1;
  __shared__ float s_levels[NL];
  const float* L = stage_levels<LEVELS, NL>(levels, s_levels);
  const CudaSrc<scalar_t, EPW> src{x};
  const int64_t n_words = (sh.n + EPW - 1) / EPW;
  const int64_t n_full = sh.n / EPW;
  const int64_t n_runs = (n_words + WPT - 1) / WPT;
  const int64_t nbytes = packed_nbytes(sh.n, BITS);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < n_runs; r += stride) {
    const int64_t w0 = r * WPT;
    if (w0 + WPT <= n_full) {  // whole words: one store of WPT words (out is 16-byte aligned, w0 * 4 a multiple)
      uint32_t words[WPT];
#pragma unroll
      for (int j = 0; j < WPT; ++j) words[j] = quantize_word<BITS, LEVELS>(src, w0 + j, sh, lo, step, L, seed, stochastic, vec);
      store_vec<uint32_t, WPT>(reinterpret_cast<uint32_t*>(out) + w0, words);
      continue;
    }
    for (int64_t w = w0; w < w0 + WPT && w < n_words; ++w) {
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
}

// One thread per chunk of V = 16 / sizeof(out_t) output elements (grid-stride): one 16-byte store each,
// consecutive threads writing consecutive chunks.
template <int BITS, bool LEVELS, typename out_t, typename M>
__global__ void __launch_bounds__(kThreads)
    unpack_dequantize_kernel(const uint8_t* __restrict__ packed, const M* __restrict__ lo,
                             const M* __restrict__ step, const float* __restrict__ levels, out_t* __restrict__ out,
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
      for (int i = 0; i < V; ++i) o[i] = to_output<out_t>(v[i]);
      store_vec<out_t, V>(out + c * V, o);
    } else {
      for (int i = 0; i < count; ++i) out[c * V + i] = to_output<out_t>(v[i]);
    }
  }
}

// ----------------------------------------------------------------------------------------------------
// compress_rows: the group ranges, their metadata and the codes in one launch that reads the input once.
// A block takes a chunk of whole groups ending on whole code words (word_aligned_groups) that fits in
// shared memory (kChunkFloats values, padded by one float per 32 so that threads reading consecutive code
// words hit distinct banks), loads it with coalesced reads, reduces each group's range (one warp per group,
// then shuffles), writes its metadata, and quantises the chunk's words from shared memory. Groups too large
// for such a chunk take two launches: compress_ranges_kernel (one block per group) and quantize_pack_kernel
// (the input is then read twice).
// ----------------------------------------------------------------------------------------------------
constexpr int kChunkFloats = 8192;  // 32 KiB of values (+1 KiB padding)
constexpr int kChunkPadded = kChunkFloats + kChunkFloats / 32;

__device__ __forceinline__ int64_t padded(int64_t i) { return i + (i >> 5); }

// Element access from the chunk in shared memory (element e of the input at s[padded(e - e0)]).
template <int EPW>
struct SmemSrc {
  const float* s;
  int64_t e0;
  __device__ __forceinline__ void block(int64_t e, float (&v)[EPW]) const {
#pragma unroll
    for (int i = 0; i < EPW; ++i) v[i] = s[padded(e - e0 + i)];
  }
  __device__ __forceinline__ float one(int64_t e) const { return s[padded(e - e0)]; }
};

__device__ __forceinline__ void warp_merge(GroupRange& r) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float mn = __shfl_xor_sync(0xFFFFFFFFu, r.mn, off);
    const float mx = __shfl_xor_sync(0xFFFFFFFFu, r.mx, off);
    const int bad = __shfl_xor_sync(0xFFFFFFFFu, static_cast<int>(r.bad), off);
    r.merge(mn, mx, bad != 0);
  }
}

__device__ __forceinline__ void write_meta(GroupRange& r, int64_t g, int64_t n_groups, float factor, float top,
                                           float* lo, float* step, uint16_t* meta) {
  float l, st;
  r.meta(factor, top, l, st);
  lo[g] = l;
  step[g] = st;
  meta[g] = bf16_bits(l);
  meta[n_groups + g] = bf16_bits(st);
}

// RD (relu_dropout_compress): the chunk's values are relu_dropout of the input, computed while loading it
// (bytes of 8 elements: the mask bits; chunks are multiples of 8 elements) and also written to y.
template <int BITS, bool LEVELS, bool RD, typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kThreads)
    compress_rows_kernel(const scalar_t* __restrict__ x, const float* __restrict__ levels, float* __restrict__ lo,
                         float* __restrict__ step, uint16_t* __restrict__ meta, uint8_t* __restrict__ out, CodecShape sh,
                         int64_t n_groups, int64_t per_chunk, float factor, float top, uint64_t seed, bool stochastic,
                         scalar_t* __restrict__ y, uint8_t* __restrict__ mask, ElementwiseParams<acc_t> prm) {
  constexpr int EPW = 32 / BITS;
  constexpr int NL = LEVELS ? (1 << BITS) : 1;
  __shared__ float s_levels[NL];
  __shared__ float s_x[kChunkPadded];
  const float* L = stage_levels<LEVELS, NL>(levels, s_levels);
  const int64_t ge = sh.block_rows * sh.k;
  const int64_t n_chunks = (n_groups + per_chunk - 1) / per_chunk;
  const int64_t n_words = (sh.n + EPW - 1) / EPW;
  const int64_t n_full = sh.n / EPW;
  const int64_t nbytes = packed_nbytes(sh.n, BITS);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
  for (int64_t ci = blockIdx.x; ci < n_chunks; ci += gridDim.x) {
    const int64_t g0 = ci * per_chunk;
    const int64_t g1 = g0 + per_chunk < n_groups ? g0 + per_chunk : n_groups;
    const int64_t e0 = g0 * ge;
    const int64_t e1 = g1 * ge < sh.n ? g1 * ge : sh.n;
    if constexpr (RD) {
      const int64_t nb = (e1 - e0 + 7) / 8;
      for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
        uint32_t byte = 0;
        for (int i = 0; i < 8 && e0 + 8 * b + i < e1; ++i) {
          const int64_t e = e0 + 8 * b + i;
          bool bit = false;
          const scalar_t v =
              static_cast<scalar_t>(apply_elementwise<kReluDropout>(static_cast<acc_t>(x[e]), e, false, bit, prm));
          y[e] = v;
          s_x[padded(8 * b + i)] = static_cast<float>(v);
          byte |= static_cast<uint32_t>(bit) << i;
        }
        mask[e0 / 8 + b] = static_cast<uint8_t>(byte);
      }
    } else {
      for (int64_t i = threadIdx.x; i < e1 - e0; i += blockDim.x) s_x[padded(i)] = static_cast<float>(x[e0 + i]);
    }
    __syncthreads();
    for (int64_t g = g0 + warp; g < g1; g += n_warps) {  // warp-uniform: every lane takes part in the shuffles
      GroupRange r;
      const int64_t a = g * ge - e0;
      const int64_t b = ((g + 1) * ge < sh.n ? (g + 1) * ge : sh.n) - e0;
      for (int64_t i = a + lane; i < b; i += 32) r.add(s_x[padded(i)]);
      warp_merge(r);
      if (lane == 0) write_meta(r, g, n_groups, factor, top, lo, step, meta);
    }
    __syncthreads();  // the chunk's lo / step (global) are visible to the whole block
    const SmemSrc<EPW> src{s_x, e0};
    const int64_t w0 = e0 / EPW;  // a multiple of EPW: the chunk's words hold only its own groups' codes
    const int64_t w1 = g1 == n_groups ? n_words : e1 / EPW;
    for (int64_t w = w0 + threadIdx.x; w < w1; w += blockDim.x) {
      const uint32_t word = quantize_word<BITS, LEVELS>(src, w, sh, lo, step, L, seed, stochastic, true);
      if (w < n_full) {
        reinterpret_cast<uint32_t*>(out)[w] = word;
      } else {
#pragma unroll
        for (int b = 0; b < 4; ++b)
          if (4 * w + b < nbytes) out[4 * w + b] = static_cast<uint8_t>(word >> (8 * b));
      }
    }
    __syncthreads();  // s_x is reused by the next chunk
  }
}

// Groups too large for a shared-memory chunk: one block per group (grid-stride) reduces its range from
// global memory and writes its metadata; quantize_pack_kernel then writes the codes.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    compress_ranges_kernel(const scalar_t* __restrict__ x, float* __restrict__ lo, float* __restrict__ step,
                           uint16_t* __restrict__ meta, CodecShape sh, int64_t n_groups, float factor, float top) {
  __shared__ float s_mn[kThreads / 32], s_mx[kThreads / 32];
  __shared__ int s_bad[kThreads / 32];
  const int64_t ge = sh.block_rows * sh.k;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
  for (int64_t g = blockIdx.x; g < n_groups; g += gridDim.x) {
    GroupRange r;
    const int64_t end = (g + 1) * ge < sh.n ? (g + 1) * ge : sh.n;
    for (int64_t e = g * ge + threadIdx.x; e < end; e += blockDim.x) r.add(static_cast<float>(x[e]));
    warp_merge(r);
    if (lane == 0) {
      s_mn[warp] = r.mn;
      s_mx[warp] = r.mx;
      s_bad[warp] = r.bad;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      GroupRange t;
      for (int i = 0; i < n_warps; ++i) t.merge(s_mn[i], s_mx[i], s_bad[i] != 0);
      write_meta(t, g, n_groups, factor, top, lo, step, meta);
    }
    __syncthreads();
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
      const int64_t runs = (words + words_per_thread<B>() - 1) / words_per_thread<B>();
      quantize_pack_kernel<B, LV, scalar_t><<<grid_for(runs), kThreads, 0, stream>>>(
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
      with_meta(c, [&](auto lo_p, auto step_p) {
        using M = std::remove_const_t<std::remove_pointer_t<decltype(lo_p)>>;
        unpack_dequantize_kernel<B, LV, scalar_t, M><<<grid_for((n + V - 1) / V), kThreads, 0, stream>>>(
            packed.data_ptr<uint8_t>(), lo_p, step_p, L, out.data_ptr<scalar_t>(), sh,
            (reinterpret_cast<uintptr_t>(packed.data_ptr()) & 7) == 0, aligned16(out.data_ptr()));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
  return kernel_dtype == dtype ? out : out.to(dtype);
}

std::tuple<at::Tensor, at::Tensor> compress_rows_cuda(const at::Tensor& x_in, const OptTensor& levels, int64_t bits,
                                                      int64_t block_rows, int64_t seed, bool stochastic) {
  TORCH_CHECK(x_in.is_cuda(), "dgl_exact.compress_rows: x must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(x_in.device());
  at::Tensor x = prepare_quantize_input(x_in);
  if (x.scalar_type() == at::kDouble) x = x.to(at::kFloat);  // the reference quantises x.float()
  const CodecArgs c = prepare_compress(x, levels, bits, block_rows);
  const int64_t n_rows = x.size(0), k = x.size(1), n = x.numel();
  const int64_t n_groups = (n_rows + block_rows - 1) / block_rows;
  at::Tensor out = at::empty({packed_nbytes(n, bits)}, x.options().dtype(at::kByte));
  at::Tensor meta = at::empty({2, n_groups}, x.options().dtype(at::kBFloat16));
  if (n == 0) return {out, meta.zero_()};
  at::Tensor scratch = at::empty({2, n_groups}, x.options().dtype(at::kFloat));  // fp32 lo, step for the codes
  float* lo = scratch.data_ptr<float>();
  float* step = lo + n_groups;
  uint16_t* meta_p = reinterpret_cast<uint16_t*>(meta.data_ptr<at::BFloat16>());
  const float* L = c.has_levels ? c.levels.data_ptr<float>() : nullptr;
  const CodecShape sh = make_codec_shape(n_rows, k, block_rows);
  const float factor = meta_factor(bits);
  const float top = static_cast<float>((int64_t(1) << bits) - 1);
  const int64_t ge = block_rows * k;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  DGL_EXACT_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "dgl_exact_compress_rows_cuda", [&] {
    dispatch_bits(bits, c.has_levels, [&](auto bits_c, auto levels_c) {
      constexpr int B = decltype(bits_c)::value;
      constexpr bool LV = decltype(levels_c)::value;
      constexpr int EPW = 32 / B;
      const int64_t c0 = word_aligned_groups(ge, EPW);
      const int64_t per_chunk = c0 * (kChunkFloats / (c0 * ge));  // 0: a chunk does not fit
      if (per_chunk > 0) {  // one block per chunk (grid_for counts threads), grid-stride beyond the cap
        using acc_t = at::opmath_type<scalar_t>;
        compress_rows_kernel<B, LV, false, scalar_t, acc_t>
            <<<grid_for((n_groups + per_chunk - 1) / per_chunk * kThreads), kThreads, 0, stream>>>(
                x.data_ptr<scalar_t>(), L, lo, step, meta_p, out.data_ptr<uint8_t>(), sh, n_groups, per_chunk, factor,
                top, static_cast<uint64_t>(seed), stochastic, nullptr, nullptr, ElementwiseParams<acc_t>{});
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        return;
      }
      compress_ranges_kernel<scalar_t><<<grid_for(n_groups * kThreads), kThreads, 0, stream>>>(
          x.data_ptr<scalar_t>(), lo, step, meta_p, sh, n_groups, factor, top);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      const int64_t words = (n + EPW - 1) / EPW;
      const int64_t runs = (words + words_per_thread<B>() - 1) / words_per_thread<B>();
      quantize_pack_kernel<B, LV, scalar_t><<<grid_for(runs), kThreads, 0, stream>>>(
          x.data_ptr<scalar_t>(), lo, step, L, out.data_ptr<uint8_t>(), sh, static_cast<uint64_t>(seed), stochastic,
          aligned16(x.data_ptr()));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {out, meta};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> relu_dropout_compress_cuda(
    const at::Tensor& x_in, double p, int64_t seed, const OptTensor& levels, int64_t bits, int64_t block_rows,
    int64_t code_seed, bool stochastic) {
  TORCH_CHECK(x_in.is_cuda(), "dgl_exact.relu_dropout_compress: x must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = prepare_quantize_input(x_in);
  const CodecArgs c = prepare_compress(x, levels, bits, block_rows);
  const int64_t n_rows = x.size(0), k = x.size(1), n = x.numel();
  const int64_t n_groups = (n_rows + block_rows - 1) / block_rows;
  const int64_t ge = block_rows * k;
  const int epw = 32 / static_cast<int>(bits);
  const int64_t c0 = word_aligned_groups(ge, epw > 8 ? epw : 8);
  const int64_t per_chunk = n > 0 ? c0 * (kChunkFloats / (c0 * ge)) : 0;
  if (per_chunk == 0 || x.scalar_type() == at::kDouble) {  // groups too large for a chunk, fp64, or empty
    auto [y, mask] = relu_dropout_cuda(x, p, seed);
    auto [out, meta] = compress_rows_cuda(y, levels, bits, block_rows, code_seed, stochastic);
    return {y, mask, out, meta};
  }
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::Tensor mask = at::empty({packed_nbytes(n, 1)}, x.options().dtype(at::kByte));
  at::Tensor out = at::empty({packed_nbytes(n, bits)}, x.options().dtype(at::kByte));
  at::Tensor meta = at::empty({2, n_groups}, x.options().dtype(at::kBFloat16));
  at::Tensor scratch = at::empty({2, n_groups}, x.options().dtype(at::kFloat));
  float* lo = scratch.data_ptr<float>();
  const float* L = c.has_levels ? c.levels.data_ptr<float>() : nullptr;
  const CodecShape sh = make_codec_shape(n_rows, k, block_rows);
  const float factor = meta_factor(bits);
  const float top = static_cast<float>((int64_t(1) << bits) - 1);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  DGL_EXACT_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "dgl_exact_relu_dropout_compress_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto prm = make_elementwise_params<scalar_t, acc_t>(kReluDropout, static_cast<uint64_t>(seed), p, 1.0, 0.0);
    dispatch_bits(bits, c.has_levels, [&](auto bits_c, auto levels_c) {
      constexpr int B = decltype(bits_c)::value;
      constexpr bool LV = decltype(levels_c)::value;
      compress_rows_kernel<B, LV, true, scalar_t, acc_t>
          <<<grid_for((n_groups + per_chunk - 1) / per_chunk * kThreads), kThreads, 0, stream>>>(
              x.data_ptr<scalar_t>(), L, lo, lo + n_groups, reinterpret_cast<uint16_t*>(meta.data_ptr<at::BFloat16>()),
              out.data_ptr<uint8_t>(), sh, n_groups, per_chunk, factor, top, static_cast<uint64_t>(code_seed),
              stochastic, y.data_ptr<scalar_t>(), mask.data_ptr<uint8_t>(), prm);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {y, mask, out, meta};
}

}  // namespace dgl_exact

TORCH_LIBRARY_IMPL(dgl_exact, CUDA, m) {
  m.impl("relu_dropout_compress", &dgl_exact::relu_dropout_compress_cuda);
  m.impl("compress_rows", &dgl_exact::compress_rows_cuda);
  m.impl("group_meta", &dgl_exact::group_meta_cuda);
  m.impl("quantize_pack", &dgl_exact::quantize_pack_cuda);
  m.impl("unpack_dequantize", &dgl_exact::unpack_dequantize_cuda);
}
