// The native GPTQ kernel (matmul_gptq.h) on vectors of 8 outputs (256-bit) or 16 (512-bit), compiled twice:
// by matmul_gptq_avx2.cpp (maddubs + madd) and matmul_gptq_avx512.cpp (512-bit, VNNI dpbusd). Include
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

// Vectors of kLanes outputs: 512-bit where XP_GPTQ_512 (AVX-512F/BW + VNNI), else 256-bit.
#if defined(XP_GPTQ_512)
constexpr int kLanes = 16;
using VI = __m512i;
using VF = __m512;
XP_INLINE VI vload(const uint8_t* p) { return _mm512_loadu_si512(p); }
XP_INLINE VI vand(VI a, VI b) { return _mm512_and_si512(a, b); }
XP_INLINE VI vsrl4(VI a) { return _mm512_srli_epi32(a, 4); }
XP_INLINE VI vset1(int32_t v) { return _mm512_set1_epi32(v); }
XP_INLINE VI vzeroi() { return _mm512_setzero_si512(); }
XP_INLINE VI dot_u8s8(VI acc, VI u, VI s) { return _mm512_dpbusd_epi32(acc, u, s); }
XP_INLINE VF vzerof() { return _mm512_setzero_ps(); }
XP_INLINE VF vset1f(float v) { return _mm512_set1_ps(v); }
XP_INLINE VF vcvt(VI a) { return _mm512_cvtepi32_ps(a); }
XP_INLINE VF vfmadd(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
XP_INLINE VF vfnmadd(VF a, VF b, VF c) { return _mm512_fnmadd_ps(a, b, c); }
XP_INLINE VF vloadf(const float* p) { return _mm512_loadu_ps(p); }
XP_INLINE void vstoref(float* p, VF v) { _mm512_storeu_ps(p, v); }
XP_INLINE VF vhalves(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
XP_INLINE VF vbytes(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#else
constexpr int kLanes = 8;
using VI = __m256i;
using VF = __m256;
XP_INLINE VI vload(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
XP_INLINE VI vand(VI a, VI b) { return _mm256_and_si256(a, b); }
XP_INLINE VI vsrl4(VI a) { return _mm256_srli_epi32(a, 4); }
XP_INLINE VI vset1(int32_t v) { return _mm256_set1_epi32(v); }
XP_INLINE VI vzeroi() { return _mm256_setzero_si256(); }
XP_INLINE VI dot_u8s8(VI acc, VI u, VI s) {
#if defined(__AVX512VNNI__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}
XP_INLINE VF vzerof() { return _mm256_setzero_ps(); }
XP_INLINE VF vset1f(float v) { return _mm256_set1_ps(v); }
XP_INLINE VF vcvt(VI a) { return _mm256_cvtepi32_ps(a); }
XP_INLINE VF vfmadd(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
XP_INLINE VF vfnmadd(VF a, VF b, VF c) { return _mm256_fnmadd_ps(a, b, c); }
XP_INLINE VF vloadf(const float* p) { return _mm256_loadu_ps(p); }
XP_INLINE void vstoref(float* p, VF v) { _mm256_storeu_ps(p, v); }
XP_INLINE VF vhalves(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
XP_INLINE VF vbytes(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
#endif

XP_INLINE int32_t load_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// C vectors (kLanes * C outputs from j) x T X rows (from i), one group g: y += scale * (sum - zero * sx).
// first: y = instead of +=.
template <int C, int T>
XP_INLINE void tile(const GptqArgs& a, int64_t j, int64_t i, int64_t g, bool first) {
  const VI mask = vset1(0x0F0F0F0F);
  VF gacc[T][C];
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) gacc[t][c] = vzerof();
  const uint8_t* xr[T];
  for (int t = 0; t < T; ++t) xr[t] = a.x + (size_t)(i + t) * a.x_row_bytes;
  for (int64_t b = g * a.group / 32; b < (g + 1) * a.group / 32; ++b) {
    VI iacc[T][C];
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) iacc[t][c] = vzeroi();
    for (int64_t p = 4 * b; p < 4 * b + 4; ++p) {
      const uint8_t* wrow = a.qweight + 4 * (p * a.n + j);
      VI lo[C], hi[C];
      for (int c = 0; c < C; ++c) {
        const VI w = vload(wrow + 4 * kLanes * c);
        lo[c] = vand(w, mask);
        hi[c] = vand(vsrl4(w), mask);
      }
      for (int t = 0; t < T; ++t) {
        const VI xe = vset1(load_i32(xr[t] + 8 * p));
        const VI xo = vset1(load_i32(xr[t] + 8 * p + 4));
        for (int c = 0; c < C; ++c) iacc[t][c] = dot_u8s8(dot_u8s8(iacc[t][c], lo[c], xe), hi[c], xo);
      }
    }
    for (int t = 0; t < T; ++t) {
      const VF d = vset1f(reinterpret_cast<const float*>(xr[t] + a.d_offset)[b]);
      for (int c = 0; c < C; ++c) gacc[t][c] = vfmadd(vcvt(iacc[t][c]), d, gacc[t][c]);
    }
  }
  for (int c = 0; c < C; ++c) {
    const int64_t jc = j + kLanes * c;
    const VF s = vhalves(a.scales + 2 * (g * a.n + jc));
    const VF z = a.zeros ? vbytes(a.zeros + g * a.n + jc) : vset1f(8.0f);
    for (int t = 0; t < T; ++t) {
      const VF sx = vset1f(reinterpret_cast<const float*>(xr[t] + a.sx_offset)[g]);
      float* y = a.y + (i + t) * a.ldy + jc;
      // Only explicit FMAs: GCC may contract a mul + add of vectors, differently per instantiation, and
      // then a row's bits would depend on how many rows share the call (serve's batch invariance).
      vstoref(y, vfmadd(s, vfnmadd(z, sx, gacc[t][c]), first ? vzerof() : vloadf(y)));
    }
  }
}

// Columns [j0, j1) (a multiple of kLanes wide) for T rows from i.
template <int T>
XP_INLINE void rows(const GptqArgs& a, int64_t j0, int64_t j1, int64_t i) {
  for (int64_t g = 0; g < a.k / a.group; ++g) {
    int64_t j = j0;
    for (; j + kLanes * XP_GPTQ_C <= j1; j += kLanes * XP_GPTQ_C) tile<XP_GPTQ_C, T>(a, j, i, g, g == 0);
    for (; j < j1; j += kLanes) tile<1, T>(a, j, i, g, g == 0);
  }
}

void kernel(const GptqArgs& a, int64_t j0, int64_t j1, int64_t i0, int64_t i1) {
  const int64_t j_simd = j0 + (j1 - j0) / kLanes * kLanes;
  if (j_simd < j1) gptq_kernel_scalar()(a, j_simd, j1, i0, i1);
  if (j_simd == j0) return;
  int64_t i = i0;
  if (i1 - i0 == 1) {
    // Decode: more columns per tile (the T = 1 registers leave room), same sums.
    for (int64_t g = 0; g < a.k / a.group; ++g) {
      int64_t j = j0;
      for (; j + kLanes * XP_GPTQ_C1 <= j_simd; j += kLanes * XP_GPTQ_C1) tile<XP_GPTQ_C1, 1>(a, j, i, g, g == 0);
      for (; j < j_simd; j += kLanes) tile<1, 1>(a, j, i, g, g == 0);
    }
    return;
  }
  for (; i + XP_GPTQ_T <= i1; i += XP_GPTQ_T) rows<XP_GPTQ_T>(a, j0, j_simd, i);
  for (; i < i1; ++i) rows<1>(a, j0, j_simd, i);
}

}  // namespace

GptqKernel XP_GPTQ_KERNEL_NAME() { return kernel; }

}  // namespace xpert::cpu
