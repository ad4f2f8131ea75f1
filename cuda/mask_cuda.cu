// CUDA kernels on 1-bit masks and elementwise dropout: pack_mask / unpack_mask, dropout, relu_dropout,
// masked_scale, and the Rademacher projection matrix. Bit-exact with reference.py. Mask packing: one thread per 32-bit word of bits, vectorised
// loads/stores. Elementwise ops: a warp per run of words, one element per lane per word (coalesced; a
// word of bits is a warp ballot). Uniforms come from the counter-based hash in registers.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "cuda_utils.cuh"
#include "dgl_exact.h"

namespace dgl_exact {
namespace {

// ---------------------------------------------------------------------------------------------------
// 1-bit masks: one thread per 32 elements (one 32-bit word of bits).
// ---------------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads)
    pack_mask_kernel(const uint8_t* __restrict__ m, uint8_t* __restrict__ out, int64_t n, bool vec) {
  const int64_t n_words = (n + 31) / 32, n_full = n / 32, nbytes = packed_nbytes(n, 1);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < n_words; w += stride) {
    const int64_t e0 = w * 32;
    const bool full = w < n_full;
    uint8_t b[32];
    if (full && vec) {
      load_vec<uint8_t, 32>(m + e0, b);
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) b[i] = e0 + i < n ? m[e0 + i] : 0;
    }
    uint32_t word = 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) word |= static_cast<uint32_t>(b[i] != 0) << i;
    if (full) {
      reinterpret_cast<uint32_t*>(out)[w] = word;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (4 * w + j < nbytes) out[4 * w + j] = static_cast<uint8_t>(word >> (8 * j));
    }
  }
}

__device__ __forceinline__ uint32_t load_mask_word(const uint8_t* __restrict__ packed, int64_t w, bool full, bool vec,
                                                   int64_t nbytes) {
  if (full && vec) return __ldg(reinterpret_cast<const unsigned int*>(packed) + w);
  uint32_t word = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (4 * w + j < nbytes) word |= static_cast<uint32_t>(packed[4 * w + j]) << (8 * j);
  return word;
}

__device__ __forceinline__ void store_mask_word(uint8_t* __restrict__ out, int64_t w, uint32_t word, bool full,
                                                int64_t nbytes) {
  if (full) {
    reinterpret_cast<uint32_t*>(out)[w] = word;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (4 * w + j < nbytes) out[4 * w + j] = static_cast<uint8_t>(word >> (8 * j));
  }
}

__global__ void __launch_bounds__(kThreads)
    unpack_mask_kernel(const uint8_t* __restrict__ packed, uint8_t* __restrict__ out, int64_t n, bool vec_in,
                       bool vec_out) {
  const int64_t n_words = (n + 31) / 32, n_full = n / 32, nbytes = packed_nbytes(n, 1);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < n_words; w += stride) {
    const int64_t e0 = w * 32;
    const bool full = w < n_full;
    const uint32_t word = load_mask_word(packed, w, full, vec_in, nbytes);
    uint8_t b[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) b[i] = static_cast<uint8_t>((word >> i) & 1u);
    if (full && vec_out) {
      store_vec<uint8_t, 32>(out + e0, b);
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i)
        if (e0 + i < n) out[e0 + i] = b[i];
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Elementwise ops (dropout, relu_dropout, masked_scale): lane i of a warp owns element 32 w + i of every
// word w of mask bits the warp visits, so each load and store instruction of a warp covers 32 consecutive
// elements (coalesced for every dtype) and a word of output bits is one __ballot_sync.
// ---------------------------------------------------------------------------------------------------
constexpr int kWordsPerStep = 8;  // words per warp per step: 8 independent loads in flight per thread

template <int OP, typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kThreads)
    elementwise_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, const uint8_t* __restrict__ mask_in,
                       uint8_t* __restrict__ mask_out, int64_t n, ElementwiseParams<acc_t> prm, bool vec_mask) {
  const int64_t n_words = (n + 31) / 32, n_full = n / 32, nbytes = packed_nbytes(n, 1);
  const int64_t n_steps = (n_words + kWordsPerStep - 1) / kWordsPerStep;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  // warp-uniform loop (blockDim is a multiple of 32): every lane reaches every __ballot_sync
  for (int64_t s = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; s < n_steps; s += warps) {
    const int64_t w0 = s * kWordsPerStep;
    acc_t v[kWordsPerStep];
#pragma unroll
    for (int j = 0; j < kWordsPerStep; ++j) {
      const int64_t e = (w0 + j) * 32 + lane;
      v[j] = e < n ? static_cast<acc_t>(x[e]) : acc_t(0);
    }
#pragma unroll
    for (int j = 0; j < kWordsPerStep; ++j) {
      const int64_t w = w0 + j;
      const int64_t e = w * 32 + lane;
      const uint32_t word_in =
          OP == kMaskedScale && w < n_words ? load_mask_word(mask_in, w, w < n_full, vec_mask, nbytes) : 0u;
      bool bit = false;
      if (e < n) y[e] = static_cast<scalar_t>(apply_elementwise<OP>(v[j], e, (word_in >> lane) & 1u, bit, prm));
      if (OP == kReluDropout) {
        const uint32_t word = __ballot_sync(0xffffffffu, bit);  // bit i = lane i's element; 0 past the end
        if (lane == 0 && w < n_words) store_mask_word(mask_out, w, word, w < n_full, nbytes);
      }
    }
  }
}

template <int OP>
void launch_elementwise(const at::Tensor& x, const at::Tensor& y, const uint8_t* mask_in, uint8_t* mask_out,
                        uint64_t seed, double p, double on, double off) {
  const int64_t n = x.numel();
  const int64_t steps = ((n + 31) / 32 + kWordsPerStep - 1) / kWordsPerStep;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dgl_exact_elementwise_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto prm = make_elementwise_params<scalar_t, acc_t>(OP, seed, p, on, off);
    elementwise_kernel<OP, scalar_t, acc_t><<<grid_for(steps * 32), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), mask_in, mask_out, n, prm,
        mask_in != nullptr && (reinterpret_cast<uintptr_t>(mask_in) & 3) == 0);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
rademacher_kernel(scalar_t* __restrict__ out, int64_t n, uint64_t seed, float v) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[e] = static_cast<scalar_t>(rademacher_entry(seed, static_cast<uint64_t>(e), v));
  }
}

}  // namespace

at::Tensor pack_mask_cuda(const at::Tensor& mask_in) {
  TORCH_CHECK(mask_in.is_cuda(), "dgl_exact.pack_mask: mask must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(mask_in.device());
  const at::Tensor mask = mask_in.to(at::kBool).contiguous().reshape({-1});
  const int64_t n = mask.numel();
  at::Tensor out = at::empty({packed_nbytes(n, 1)}, mask.options().dtype(at::kByte));
  if (n == 0) return out;
  const uint8_t* m = reinterpret_cast<const uint8_t*>(mask.data_ptr<bool>());
  pack_mask_kernel<<<grid_for((n + 31) / 32), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      m, out.data_ptr<uint8_t>(), n, aligned16(m));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor unpack_mask_cuda(const at::Tensor& packed_in, int64_t numel) {
  TORCH_CHECK(packed_in.is_cuda(), "dgl_exact.unpack_mask: packed must be a CUDA tensor");
  TORCH_CHECK(numel >= 0, "dgl_exact.unpack_mask: negative numel");
  const c10::cuda::CUDAGuard guard(packed_in.device());
  const at::Tensor packed = prepare_packed(packed_in, packed_nbytes(numel, 1), "dgl_exact.unpack_mask");
  at::Tensor out = at::empty({numel}, packed.options().dtype(at::kBool));
  if (numel == 0) return out;
  uint8_t* o = reinterpret_cast<uint8_t*>(out.data_ptr<bool>());
  unpack_mask_kernel<<<grid_for((numel + 31) / 32), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      packed.data_ptr<uint8_t>(), o, numel, (reinterpret_cast<uintptr_t>(packed.data_ptr()) & 3) == 0, aligned16(o));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor dropout_cuda(const at::Tensor& x_in, double p, int64_t seed) {
  TORCH_CHECK(x_in.is_cuda(), "dgl_exact.dropout: x must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  TORCH_CHECK(is_float_type(x.scalar_type()), "dgl_exact.dropout: x must be floating, got ", x.scalar_type());
  at::Tensor y = at::empty(x.sizes(), x.options());
  if (x.numel() == 0) return y;
  launch_elementwise<kDropout>(x, y, nullptr, nullptr, static_cast<uint64_t>(seed), p, 1.0, 0.0);
  return y;
}

std::tuple<at::Tensor, at::Tensor> relu_dropout_cuda(const at::Tensor& x_in, double p, int64_t seed) {
  TORCH_CHECK(x_in.is_cuda(), "dgl_exact.relu_dropout: x must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  TORCH_CHECK(is_float_type(x.scalar_type()), "dgl_exact.relu_dropout: x must be floating, got ", x.scalar_type());
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::Tensor packed = at::empty({packed_nbytes(x.numel(), 1)}, x.options().dtype(at::kByte));
  if (x.numel() == 0) return {y, packed};
  launch_elementwise<kReluDropout>(x, y, nullptr, packed.data_ptr<uint8_t>(), static_cast<uint64_t>(seed), p, 1.0,
                                   0.0);
  return {y, packed};
}

at::Tensor masked_scale_cuda(const at::Tensor& g_in, const at::Tensor& packed_in, double on, double off) {
  TORCH_CHECK(g_in.is_cuda(), "dgl_exact.masked_scale: g must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(g_in.device());
  const at::Tensor g = g_in.contiguous();
  TORCH_CHECK(is_float_type(g.scalar_type()), "dgl_exact.masked_scale: g must be floating, got ", g.scalar_type());
  const at::Tensor packed = prepare_packed(packed_in, packed_nbytes(g.numel(), 1), "dgl_exact.masked_scale");
  at::Tensor y = at::empty(g.sizes(), g.options());
  if (g.numel() == 0) return y;
  launch_elementwise<kMaskedScale>(g, y, packed.data_ptr<uint8_t>(), nullptr, 0, 0.0, on, off);
  return y;
}

void rademacher_cuda(const at::Tensor& out, int64_t seed) {
  TORCH_CHECK(out.is_cuda(), "dgl_exact.rademacher_: out must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(out.device());
  const float v = prepare_rademacher(out);
  const int64_t n = out.numel();
  if (n == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "dgl_exact_rademacher_cuda", [&] {
    rademacher_kernel<scalar_t><<<grid_for(n), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        out.data_ptr<scalar_t>(), n, static_cast<uint64_t>(seed), v);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace dgl_exact

TORCH_LIBRARY_IMPL(dgl_exact, CUDA, m) {
  m.impl("pack_mask", &dgl_exact::pack_mask_cuda);
  m.impl("unpack_mask", &dgl_exact::unpack_mask_cuda);
  m.impl("dropout", &dgl_exact::dropout_cuda);
  m.impl("relu_dropout", &dgl_exact::relu_dropout_cuda);
  m.impl("masked_scale", &dgl_exact::masked_scale_cuda);
  m.impl("rademacher_", &dgl_exact::rademacher_cuda);
}
