// Math shared by the CPU (.cpp, host compiler) and CUDA (.cu, nvcc) kernels of dgl_exact.
//
// Everything here follows the contract in dgl_exact/kernels/reference.py bit for bit:
//   * hash_uniform: two rounds of MurmurHash3's fmix32 over (seed, element index), 24 random bits;
//   * quantize_code: t = clamp((x * pre - a) * inv, 0, M) (NaN -> 0; pre, a, inv: quant_group), j = floor / level
//     search, q = j + (u < frac);
//   * decode_value: lo + L[q] * step ((lo + L[q] * |step|) * 16, clamped finite, for a wide group: step < 0),
//     rounded once per operation (no FMA contraction).
// Device code uses the explicitly rounded intrinsics (__fmul_rn, ...), so nvcc cannot contract a
// multiply and an add into an FMA; host code is compiled with -ffp-contract=off for the same reason.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DE_HD __host__ __device__ __forceinline__
// The word-level templates below call the (device-only, in CUDA) loaders/stores they are instantiated with.
#define DE_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define DE_HD inline
#define DE_EXEC_CHECK_DISABLE
#endif

namespace dgl_exact {

// ---------------------------------------------------------------------------------------------------
// IEEE operations rounded to nearest, never fused.
// ---------------------------------------------------------------------------------------------------
DE_HD float f_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
DE_HD float f_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
DE_HD float f_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DE_HD float f_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
DE_HD double f_mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
DE_HD float f_max(float a, float b) { return fmaxf(a, b); }  // returns the non-NaN operand
DE_HD float f_min(float a, float b) { return fminf(a, b); }

// ---------------------------------------------------------------------------------------------------
// Counter-based random numbers (reference.hash_uniform).
// ---------------------------------------------------------------------------------------------------
DE_HD uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

// u(seed, e) in [0, 1): h = fmix32(fmix32(e_lo ^ s_lo) ^ (e_hi + s_hi)), u = (h >> 8) * 2^-24.
DE_HD float hash_uniform(uint64_t seed, uint64_t e) {
  const uint32_t s_lo = static_cast<uint32_t>(seed);
  const uint32_t s_hi = static_cast<uint32_t>(seed >> 32);
  const uint32_t e_lo = static_cast<uint32_t>(e);
  const uint32_t e_hi = static_cast<uint32_t>(e >> 32);
  const uint32_t h = fmix32(fmix32(e_lo ^ s_lo) ^ (e_hi + s_hi));
  return static_cast<float>(h >> 8) * (1.0f / 16777216.0f);  // exact: 24-bit integer times 2^-24
}

// Entry e of the Rademacher projection matrix (reference.rademacher): v = fp32(1 / sqrt(k)) where the
// element's uniform is below 1/2, else -v.
DE_HD float rademacher_entry(uint64_t seed, uint64_t e, float v) { return hash_uniform(seed, e) < 0.5f ? v : -v; }

// ---------------------------------------------------------------------------------------------------
// Quantization of one value.
// ---------------------------------------------------------------------------------------------------
// inv = 1 / step, 0 where step <= 0 (or NaN); the reciprocal is correctly rounded (torch's reciprocal).
DE_HD float inv_step(float s) { return s > 0.0f ? f_div(1.0f, s) : 0.0f; }

constexpr float kMinNormal = 1.1754943508222875e-38f;  // 2^-126 (reference.MIN_NORMAL)
constexpr float kTinyScale = 16777216.0f;              // 2^24 (reference.TINY_SCALE)
constexpr float kWideScale = 16.0f;                    // reference.WIDE_SCALE
constexpr float kFloatMax = 3.4028234663852886e38f;    // fp32's largest finite value

// A group's quantisation parameters (reference.quant_params): a value's code position is (x * pre - a) * inv.
// A tiny step (0 < step < 2^-126: 1 / step may overflow) works on values scaled by 2^24; a wide group's
// metadata (step < 0) is lo / 16, -step / 16, so its values are scaled by 1/16. Powers of two: exact.
struct QuantGroup {
  float pre, a, inv;
};
DE_HD QuantGroup quant_group(float lo, float step) {
  if (step < 0.0f) return {1.0f / kWideScale, lo, f_div(1.0f, -step)};
  if (step > 0.0f && step < kMinNormal) return {kTinyScale, f_mul(lo, kTinyScale), f_div(1.0f, f_mul(step, kTinyScale))};
  return {1.0f, lo, inv_step(step)};
}

// Code of x in its group: uniform levels (LEVELS = false) or the ascending table L[0..M] (LEVELS = true).
// u is the uniform of the element (0.5 for nearest rounding).
template <int BITS, bool LEVELS>
DE_HD uint32_t quantize_code(float x, const QuantGroup& qg, const float* L, float u) {
  constexpr int M = (1 << BITS) - 1;
  // nan_to_num then clamp: NaN -> 0, +inf -> M, -inf -> 0. fmaxf drops the NaN.
  float t = f_mul(f_sub(f_mul(x, qg.pre), qg.a), qg.inv);
  t = f_min(f_max(t, 0.0f), static_cast<float>(M));
  float frac;
  uint32_t j;
  if (LEVELS) {
    // searchsorted(L, t, right=True) - 1: the last index with L[j] <= t, clamped to [0, M - 1].
    int first = 0, count = M + 1;
    while (count > 0) {
      const int half = count >> 1;
      if (L[first + half] <= t) {
        first += half + 1;
        count -= half + 1;
      } else {
        count = half;
      }
    }
    int jj = first - 1;
    jj = jj < 0 ? 0 : (jj > M - 1 ? M - 1 : jj);
    const float a = L[jj], b = L[jj + 1];
    frac = f_div(f_sub(t, a), f_sub(b, a));
    j = static_cast<uint32_t>(jj);
  } else {
    float jf = floorf(t);
    jf = jf > static_cast<float>(M - 1) ? static_cast<float>(M - 1) : jf;
    frac = f_sub(t, jf);
    j = static_cast<uint32_t>(jf);
  }
  return j + (u < frac ? 1u : 0u);
}

// x_hat = lo + L[q] * step (L[q] = q for uniform levels), each operation rounded separately; a wide group
// (step < 0, reference.decode_params): (lo + L[q] * -step) * 16, clamped to fp32's finite range.
template <bool LEVELS>
DE_HD float decode_value(uint32_t q, float lo, float step, const float* L) {
  const float level = LEVELS ? L[q] : static_cast<float>(q);
  if (step < 0.0f) {
    const float v = f_mul(f_add(lo, f_mul(level, -step)), kWideScale);
    return v > kFloatMax ? kFloatMax : (v < -kFloatMax ? -kFloatMax : v);
  }
  return f_add(lo, f_mul(level, step));
}

// ---------------------------------------------------------------------------------------------------
// Group metadata (reference.group_meta): lo = mn rounded down to bf16, step = (mx - lo) * factor rounded
// up to bf16, both on the fp32 bit patterns; lo = NaN, step = 0 for a group with a NaN or an inf; a finite
// group that would not decode finite saturates (group_meta_one).
// ---------------------------------------------------------------------------------------------------
DE_HD uint32_t float_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u;
#endif
}
DE_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
#endif
}
// Group metadata as a kernel reads it: fp32, or bf16 stored as its 16 bits (an fp32 whose low 16 bits are
// zero), so that decoding needs no conversion kernel for the bf16 metadata compression keeps.
DE_HD float meta_at(const float* p, int64_t i) { return p[i]; }
DE_HD float meta_at(const uint16_t* p, int64_t i) { return bits_float(static_cast<uint32_t>(p[i]) << 16); }
// The bf16 bits of a value bf16 holds exactly (lo, step): its top 16 bits.
DE_HD uint16_t bf16_bits(float v) { return static_cast<uint16_t>(float_bits(v) >> 16); }

// The largest bf16 <= v: truncation rounds positive values down; a set sign bit first moves the magnitude up.
DE_HD float bf16_floor(float v) {
  uint32_t b = float_bits(v);
  if (b & 0x80000000u) b += 0xFFFFu;
  return bits_float(b & 0xFFFF0000u);
}
// The smallest bf16 >= v, for v >= 0 (inf stays inf).
DE_HD float bf16_ceil_pos(float v) { return bits_float((float_bits(v) + 0xFFFFu) & 0xFFFF0000u); }

// factor = fp32((1 + 2^-20) / M): step rounded up by a hair more than fp32 rounding can lose.
inline float meta_factor(int64_t bits) {
  return static_cast<float>((1.0 + 1.0 / 1048576.0) / static_cast<double>((int64_t(1) << bits) - 1));
}

// Wide groups (reference.group_meta): a finite group whose top code lo + M * step would not decode finite, or
// whose step's reciprocal would not be a normal fp32, is redone from its min and max divided by 16 and
// stores its step negated; decode_value multiplies back.
constexpr float kDecodeMax = 3.4028232635611926e38f;  // bits 0x7F7FFFFE: one ulp below fp32's largest
constexpr float kWideStep = 8.507059173023462e37f;    // 2^126

DE_HD bool finite_bits(float v) { return (float_bits(v) & 0x7F800000u) != 0x7F800000u; }  // not inf, not NaN

// lo = mn rounded down to bf16, step = (mx - lo) * factor rounded up to bf16 (0 for an empty span); a product
// below 2^-126 lost bits in fp32: it is taken exactly in fp64 and rounded up to bf16's denormal grid 2^-133.
DE_HD void meta_lo_step(float mn, float mx, float factor, float& lo, float& step) {
  lo = bf16_floor(mn);
  const float span = f_sub(mx, lo);
  const float p = f_mul(span, factor);
  if (!(span > 0.0f)) {
    step = 0.0f;
  } else if (p < kMinNormal) {
    const double exact = f_mul(static_cast<double>(span), static_cast<double>(factor));  // exact: 24 x 24 bits
    step = static_cast<float>(ceil(exact * 0x1p133) * 0x1p-133);
  } else {
    step = bf16_ceil_pos(p);
  }
}

DE_HD void group_meta_one(float mn, float mx, float factor, float top, float& lo, float& step) {
  if (!finite_bits(mn) || !finite_bits(mx)) {  // the group holds a NaN or an inf
    lo = bits_float(0x7FC00000u);  // NaN
    step = 0.0f;
    return;
  }
  meta_lo_step(mn, mx, factor, lo, step);
  // an overflowed span (inf) gives step = inf: wide
  const float p = f_mul(step, top);
  if (step <= kWideStep && p <= kDecodeMax && p <= f_sub(kDecodeMax, lo)) return;
  meta_lo_step(f_mul(mn, 1.0f / kWideScale), f_mul(mx, 1.0f / kWideScale), factor, lo, step);
  step = -step;
}

// Running minimum and maximum of one group, for group_meta_one (compress_rows: the range and the codes from
// one read of the input). A NaN or an inf makes the group non-finite, as the reference's fp32 aminmax then
// gives a non-finite minimum or maximum: its lo is NaN.
struct GroupRange {
  float mn, mx;
  bool bad;
  DE_HD GroupRange() : mn(bits_float(0x7F800000u)), mx(bits_float(0xFF800000u)), bad(false) {}
  DE_HD void add(float v) {
    if (!finite_bits(v)) {
      bad = true;
    } else {
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
    }
  }
  DE_HD void merge(float o_mn, float o_mx, bool o_bad) {
    mn = o_mn < mn ? o_mn : mn;
    mx = o_mx > mx ? o_mx : mx;
    bad = bad || o_bad;
  }
  DE_HD void meta(float factor, float top, float& lo, float& step) const {
    group_meta_one(bad ? bits_float(0x7FC00000u) : mn, mx, factor, top, lo, step);
  }
};

// compress_rows works on chunks of whole groups that also end on whole 32-bit words of codes: the least
// number of groups whose elements are a multiple of EPW = 32 / bits (EPW is a power of two).
DE_HD int64_t word_aligned_groups(int64_t group_elements, int epw) {
  int64_t g = group_elements & -group_elements;  // the largest power of two dividing it
  if (g > epw) g = epw;
  return epw / g;
}

// Bytes of `numel` packed codes of `bits` bits: ceil(numel * bits / 8).
DE_HD int64_t packed_nbytes(int64_t numel, int64_t bits) { return (numel * bits + 7) / 8; }

// a / b, in 32-bit arithmetic when the caller knows both fit (much cheaper on a GPU).
DE_HD int64_t div_fast(int64_t a, int64_t b, bool small) {
  return small ? static_cast<int64_t>(static_cast<uint32_t>(a) / static_cast<uint32_t>(b)) : a / b;
}

// ---------------------------------------------------------------------------------------------------
// Whole 32-bit words of codes: the unit of work of both the CPU and the CUDA codec kernels.
//
// Word w holds the EPW = 32 / bits codes of flat elements [w * EPW, w * EPW + EPW) of the [n_rows, k]
// input (element e = row * k + col), code i at bits [i * bits, i * bits + bits). The fast path (a full
// word, k >= EPW, the caller's vector access allowed) loads the word's values at once and is fully
// unrolled: a word then crosses at most one row boundary, so it needs at most two groups. Everything else
// (rows narrower than a word, the tail word, unaligned memory) walks element by element.
// ---------------------------------------------------------------------------------------------------
struct CodecShape {
  int64_t n;           // elements (n_rows * k)
  int64_t k;           // columns
  int64_t block_rows;  // rows per group
  bool small_e;        // n fits 32 bits (element / row arithmetic in 32 bits)
  bool small_r;        // n_rows and block_rows fit 32 bits
};

// src.block(e0, v): v[0..EPW) = values of elements e0.. (as float); src.one(e): one value.
DE_EXEC_CHECK_DISABLE
template <int BITS, bool LEVELS, typename Src>
DE_HD uint32_t quantize_word(const Src& src, int64_t w, const CodecShape& sh, const float* lo, const float* step,
                             const float* L, uint64_t seed, bool stochastic, bool fast_ok) {
  constexpr int EPW = 32 / BITS;
  const int64_t e0 = w * EPW;
  const int64_t row = div_fast(e0, sh.k, sh.small_e);
  const int64_t col = e0 - row * sh.k;
  const int64_t g = sh.block_rows == 1 ? row : div_fast(row, sh.block_rows, sh.small_r);
  const int64_t rb = row - g * sh.block_rows;
  const QuantGroup qg_a = quant_group(lo[g], step[g]);
  uint32_t word = 0;
  if (fast_ok && e0 + EPW <= sh.n && sh.k >= EPW) {
    // the word crosses a row boundary after `split` elements (EPW: it does not); the next row may
    // start the next group
    const int split = col + EPW <= sh.k ? EPW : static_cast<int>(sh.k - col);
    QuantGroup qg_b = qg_a;
    if (split < EPW && rb + 1 == sh.block_rows) qg_b = quant_group(lo[g + 1], step[g + 1]);
    float v[EPW];
    src.block(e0, v);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < EPW; ++i) {
      const bool second = i >= split;
      const float u = stochastic ? hash_uniform(seed, static_cast<uint64_t>(e0 + i)) : 0.5f;
      word |= quantize_code<BITS, LEVELS>(v[i], second ? qg_b : qg_a, L, u) << (i * BITS);
    }
    return word;
  }
  int64_t c = col, r = rb, gg = g;
  QuantGroup qg = qg_a;
#if defined(__CUDA_ARCH__)
#pragma unroll 1
#endif
  for (int i = 0; i < EPW && e0 + i < sh.n; ++i) {
    const float u = stochastic ? hash_uniform(seed, static_cast<uint64_t>(e0 + i)) : 0.5f;
    word |= quantize_code<BITS, LEVELS>(src.one(e0 + i), qg, L, u) << (i * BITS);
    if (++c == sh.k) {
      c = 0;
      if (++r == sh.block_rows) {
        r = 0;
        ++gg;
        if (e0 + i + 1 < sh.n) qg = quant_group(lo[gg], step[gg]);
      }
    }
  }
  return word;
}

// ---------------------------------------------------------------------------------------------------
// Decoding works on chunks of V consecutive output elements (V = 16 / sizeof(output): one 16-byte store
// on a GPU, consecutive threads storing consecutive chunks, so the stores coalesce whatever the code
// width). A full chunk's V * BITS
// code bits are whole bytes, or part of one byte when V * BITS < 8.
// ---------------------------------------------------------------------------------------------------
template <int BITS, int V>
DE_HD uint64_t chunk_code_bits(const uint8_t* packed, int64_t c, int count, bool aligned) {
  constexpr int CB = V * BITS;             // code bits of a full chunk
  constexpr int NB = CB < 8 ? 1 : CB / 8;  // bytes holding them
  const int64_t byte0 = CB < 8 ? (c * CB) >> 3 : c * NB;
  uint64_t bits = 0;
#if defined(__CUDA_ARCH__)
  if (NB > 1 && count == V && aligned) {  // one aligned load (the base is 8-byte aligned, byte0 % NB == 0)
    if constexpr (NB == 2) bits = __ldg(reinterpret_cast<const unsigned short*>(packed + byte0));
    if constexpr (NB == 4) bits = __ldg(reinterpret_cast<const unsigned int*>(packed + byte0));
    if constexpr (NB == 8) bits = __ldg(reinterpret_cast<const unsigned long long*>(packed + byte0));
    return bits;
  }
#endif
  (void)aligned;
  const int nb = count == V ? NB : (CB < 8 ? 1 : (count * BITS + 7) / 8);  // never past the buffer's end
  for (int b = 0; b < nb; ++b) bits |= static_cast<uint64_t>(packed[byte0 + b]) << (8 * b);
  if (CB < 8) bits >>= (c * CB) & 7;
  return bits;
}

// v[0..count) = the decoded elements [c * V, c * V + count) (count == V except for the last chunk).
template <int BITS, bool LEVELS, int V, typename M>
DE_HD void dequantize_chunk(const uint8_t* packed, int64_t c, int count, const CodecShape& sh, const M* lo,
                            const M* step, const float* L, bool aligned, float (&v)[V]) {
  constexpr uint64_t MASK = (uint64_t(1) << BITS) - 1;
  const uint64_t bits = chunk_code_bits<BITS, V>(packed, c, count, aligned);
  const int64_t e0 = c * V;
  const int64_t row = div_fast(e0, sh.k, sh.small_e);
  const int64_t col = e0 - row * sh.k;
  const int64_t g = sh.block_rows == 1 ? row : div_fast(row, sh.block_rows, sh.small_r);
  const int64_t rb = row - g * sh.block_rows;
  const float lo_a = meta_at(lo, g);
  const float step_a = meta_at(step, g);
  if (count == V && sh.k >= V) {
    // the chunk crosses a row boundary after `split` elements (V: it does not); the next row may start the
    // next group (it exists: the chunk is full)
    const int split = col + V <= sh.k ? V : static_cast<int>(sh.k - col);
    float lo_b = lo_a, step_b = step_a;
    if (split < V && rb + 1 == sh.block_rows) {
      lo_b = meta_at(lo, g + 1);
      step_b = meta_at(step, g + 1);
    }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < V; ++i) {
      const bool second = i >= split;
      v[i] = decode_value<LEVELS>(static_cast<uint32_t>((bits >> (i * BITS)) & MASK), second ? lo_b : lo_a,
                                  second ? step_b : step_a, L);
    }
    return;
  }
  // rows narrower than a chunk, or the last chunk: element by element
  int64_t cc = col, r = rb, gg = g;
  float lo_g = lo_a, step_g = step_a;
#if defined(__CUDA_ARCH__)
#pragma unroll 1
#endif
  for (int i = 0; i < count; ++i) {
    v[i] = decode_value<LEVELS>(static_cast<uint32_t>((bits >> (i * BITS)) & MASK), lo_g, step_g, L);
    if (++cc == sh.k) {
      cc = 0;
      if (++r == sh.block_rows) {
        r = 0;
        ++gg;
        if (i + 1 < count) {
          lo_g = meta_at(lo, gg);
          step_g = meta_at(step, gg);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Elementwise ops with 1-bit masks (dropout, relu_dropout, masked_scale), per element, in the op math
// type acc_t (fp32 for fp16/bf16/fp32 tensors, fp64 for fp64) exactly as torch evaluates the reference:
// Python scalars become acc_t; masked_scale's where(mask, on, off) rounds on/off to the tensor dtype.
// ---------------------------------------------------------------------------------------------------
enum ElementwiseOp { kDropout = 0, kReluDropout = 1, kMaskedScale = 2 };

template <typename acc_t>
struct ElementwiseParams {
  uint64_t seed;
  float p;        // dropout probability, compared with the fp32 uniforms in fp32 (as torch does)
  bool drop;      // relu_dropout: p > 0
  acc_t scale;    // 1 / (1 - p)
  bool zero_off;  // masked_scale: off == 0
  bool scale_on;  // masked_scale: on != 1
  acc_t on_s;     // on as an op-math scalar
  acc_t on_t;     // on rounded to the tensor dtype
  acc_t off_t;    // off rounded to the tensor dtype
};

// x: the element (as acc_t), e: its flat index, bit_in: its mask bit (masked_scale). Returns the output;
// relu_dropout sets bit_out (the single bit its backward needs).
template <int OP, typename acc_t>
DE_HD acc_t apply_elementwise(acc_t x, int64_t e, bool bit_in, bool& bit_out, const ElementwiseParams<acc_t>& prm) {
  if (OP == kDropout) {
    const acc_t keep = hash_uniform(prm.seed, static_cast<uint64_t>(e)) >= prm.p ? acc_t(1) : acc_t(0);
    return f_mul(f_mul(x, keep), prm.scale);  // x * keep (inf/NaN become NaN when dropped), then * 1/(1-p)
  } else if (OP == kReluDropout) {
    bool m = x > acc_t(0);
    if (prm.drop) m = m && hash_uniform(prm.seed, static_cast<uint64_t>(e)) >= prm.p;
    bit_out = m;
    const acc_t r = f_mul(x, m ? acc_t(1) : acc_t(0));
    return prm.drop ? f_mul(r, prm.scale) : r;
  } else {
    if (prm.zero_off) {
      const acc_t r = f_mul(x, bit_in ? acc_t(1) : acc_t(0));
      return prm.scale_on ? f_mul(r, prm.on_s) : r;
    }
    return f_mul(x, bit_in ? prm.on_t : prm.off_t);
  }
}

}  // namespace dgl_exact
