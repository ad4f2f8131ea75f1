// CUDA helpers: launch sizing, vectorised loads/stores of N consecutive elements, fp32 conversions.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace dgl_exact {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over `work` items (enough to fill the GPU, no more).
inline int64_t grid_for(int64_t work, int threads = kThreads) {
  static int sms[64] = {0};
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  int& n_sm = sms[dev & 63];
  if (n_sm == 0) {
    int v = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    n_sm = std::max(v, 1);
  }
  const int64_t needed = (work + threads - 1) / threads;
  return std::max<int64_t>(1, std::min<int64_t>(needed, int64_t(n_sm) * (2048 / threads) * 4));
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Load N consecutive T from p (16-byte aligned base, offset a multiple of N * sizeof(T)) with the widest
// vector loads the size allows.
template <typename T, int N>
__device__ __forceinline__ void load_vec(const T* __restrict__ p, T (&out)[N]) {
  constexpr int B = N * static_cast<int>(sizeof(T));
  if constexpr (B % 16 == 0) {
#pragma unroll
    for (int c = 0; c < B / 16; ++c) {
      const uint4 r = __ldg(reinterpret_cast<const uint4*>(p) + c);
      memcpy(&out[c * (16 / sizeof(T))], &r, 16);
    }
  } else if constexpr (B % 8 == 0) {
#pragma unroll
    for (int c = 0; c < B / 8; ++c) {
      const uint2 r = __ldg(reinterpret_cast<const uint2*>(p) + c);
      memcpy(&out[c * (8 / sizeof(T))], &r, 8);
    }
  } else if constexpr (B % 4 == 0 && sizeof(T) <= 4) {
#pragma unroll
    for (int c = 0; c < B / 4; ++c) {
      const unsigned int r = __ldg(reinterpret_cast<const unsigned int*>(p) + c);
      memcpy(&out[c * (4 / sizeof(T))], &r, 4);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = p[i];
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* __restrict__ p, const T (&in)[N]) {
  constexpr int B = N * static_cast<int>(sizeof(T));
  if constexpr (B % 16 == 0) {
#pragma unroll
    for (int c = 0; c < B / 16; ++c) {
      uint4 r;
      memcpy(&r, &in[c * (16 / sizeof(T))], 16);
      reinterpret_cast<uint4*>(p)[c] = r;
    }
  } else if constexpr (B % 8 == 0) {
#pragma unroll
    for (int c = 0; c < B / 8; ++c) {
      uint2 r;
      memcpy(&r, &in[c * (8 / sizeof(T))], 8);
      reinterpret_cast<uint2*>(p)[c] = r;
    }
  } else if constexpr (B % 4 == 0 && sizeof(T) <= 4) {
#pragma unroll
    for (int c = 0; c < B / 4; ++c) {
      unsigned int r;
      memcpy(&r, &in[c * (4 / sizeof(T))], 4);
      reinterpret_cast<unsigned int*>(p)[c] = r;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = in[i];
  }
}

}  // namespace dgl_exact
