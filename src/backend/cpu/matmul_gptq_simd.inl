// The native GPTQ kernel (matmul_gptq.h) on 256-bit vectors of 8 outputs, compiled twice: by
// matmul_gptq_avx2.cpp (maddubs + madd) and matmul_gptq_avx512.cpp (VNNI dpbusd, 32 registers). Include
// only from those files; internal linkage, no standard-library templates (see matmul_simd.inl).
//
// A qweight u32 holds inputs 8p..8p+7 of one output; its low nibbles (mask 0x0F0F0F0F) are the even
// inputs and its high nibbles the odd ones, so against X reordered even-odd per 8 each u32 lane makes
// two u8 x s8 dot products of 4: a vector of 8 lanes is 8 outputs x 8 inputs in two instructions.
// Loop order: per group, the tiles of the column range in turn, so each qweight row is read as one
// contiguous run per group (16 rows streamed at group 128) rather than one tile down all of k.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/matmul_gptq.h"

#ifndef XP_GPTQ_KERNEL_NAME
#error "define XP_GPTQ_KERNEL_NAME before including matmul_gptq_simd.inl"
#endif

namespace xpert::cpu {
namespace {

#define XP_INLINE inline __attribute__((always_inline))

XP_INLINE __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

XP_INLINE int32_t load_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// C vectors (8C outputs from j) x T X rows (from i), one group g: y += scale * (sum - zero * sx).
// first: y = instead of +=.
template <int C, int T>
XP_INLINE void tile(const GptqArgs& a, int64_t j, int64_t i, int64_t g, bool first) {
  const __m256i mask = _mm256_set1_epi32(0x0F0F0F0F);
  __m256 gacc[T][C];
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) gacc[t][c] = _mm256_setzero_ps();
  const uint8_t* xr[T];
  for (int t = 0; t < T; ++t) xr[t] = a.x + (size_t)(i + t) * a.x_row_bytes;
  for (int64_t b = g * a.group / 32; b < (g + 1) * a.group / 32; ++b) {
    __m256i iacc[T][C];
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) iacc[t][c] = _mm256_setzero_si256();
    for (int64_t p = 4 * b; p < 4 * b + 4; ++p) {
      const uint8_t* wrow = a.qweight + 4 * (p * a.n + j);
      __m256i lo[C], hi[C];
      for (int c = 0; c < C; ++c) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wrow + 32 * c));
        lo[c] = _mm256_and_si256(w, mask);
        hi[c] = _mm256_and_si256(_mm256_srli_epi32(w, 4), mask);
      }
      for (int t = 0; t < T; ++t) {
        const __m256i xe = _mm256_set1_epi32(load_i32(xr[t] + 8 * p));
        const __m256i xo = _mm256_set1_epi32(load_i32(xr[t] + 8 * p + 4));
        for (int c = 0; c < C; ++c) iacc[t][c] = dot_u8s8(dot_u8s8(iacc[t][c], lo[c], xe), hi[c], xo);
      }
    }
    for (int t = 0; t < T; ++t) {
      const __m256 d = _mm256_set1_ps(reinterpret_cast<const float*>(xr[t] + a.d_offset)[b]);
      for (int c = 0; c < C; ++c) gacc[t][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[t][c]), d, gacc[t][c]);
    }
  }
  for (int c = 0; c < C; ++c) {
    const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.scales + 2 * (g * a.n + j + 8 * c))));
    const __m256 z =
        a.zeros ? _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.zeros + g * a.n + j + 8 * c))))
                : _mm256_set1_ps(8.0f);
    for (int t = 0; t < T; ++t) {
      const __m256 sx = _mm256_set1_ps(reinterpret_cast<const float*>(xr[t] + a.sx_offset)[g]);
      float* y = a.y + (i + t) * a.ldy + j + 8 * c;
      const __m256 v = _mm256_mul_ps(s, _mm256_fnmadd_ps(z, sx, gacc[t][c]));
      _mm256_storeu_ps(y, first ? v : _mm256_add_ps(_mm256_loadu_ps(y), v));
    }
  }
}

// Columns [j0, j1) (a multiple of 8 wide) for T rows from i.
template <int T>
XP_INLINE void rows(const GptqArgs& a, int64_t j0, int64_t j1, int64_t i) {
  for (int64_t g = 0; g < a.k / a.group; ++g) {
    int64_t j = j0;
    for (; j + 8 * XP_GPTQ_C <= j1; j += 8 * XP_GPTQ_C) tile<XP_GPTQ_C, T>(a, j, i, g, g == 0);
    for (; j < j1; j += 8) tile<1, T>(a, j, i, g, g == 0);
  }
}

void kernel(const GptqArgs& a, int64_t j0, int64_t j1, int64_t i0, int64_t i1) {
  const int64_t j_simd = j0 + (j1 - j0) / 8 * 8;
  if (j_simd < j1) gptq_kernel_scalar()(a, j_simd, j1, i0, i1);
  if (j_simd == j0) return;
  int64_t i = i0;
  if (i1 - i0 == 1) {
    // Decode: more columns per tile (the T = 1 registers leave room), same sums.
    for (int64_t g = 0; g < a.k / a.group; ++g) {
      int64_t j = j0;
      for (; j + 8 * XP_GPTQ_C1 <= j_simd; j += 8 * XP_GPTQ_C1) tile<XP_GPTQ_C1, 1>(a, j, i, g, g == 0);
      for (; j < j_simd; j += 8) tile<1, 1>(a, j, i, g, g == 0);
    }
    return;
  }
  for (; i + XP_GPTQ_T <= i1; i += XP_GPTQ_T) rows<XP_GPTQ_T>(a, j0, j_simd, i);
  for (; i < i1; ++i) rows<1>(a, j0, j_simd, i);
}

}  // namespace

GptqKernel XP_GPTQ_KERNEL_NAME() { return kernel; }

}  // namespace xpert::cpu
