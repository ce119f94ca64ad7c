// Compiled with -mavx2 -mfma -mf16c; called only when best_isa() >= avx2. Blocks are read by byte offset
// (Q8_0: f16 d + 32 int8, 34 bytes; Q4_0: f16 d + 16 bytes of nibbles, 18 bytes) rather than through
// quant/blocks.h, which has inline functions this file must not compile an AVX2 copy of.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/ops_kv.h"

namespace xpert::cpu {

namespace {

constexpr int kQ8Bytes = 34, kQ4Bytes = 18;

float block_d(const uint8_t* b) {
  uint16_t h;
  std::memcpy(&h, b, 2);
  return _cvtsh_ss(h);
}

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 int8 at p -> 8 floats.
__m256 load8_i8(const void* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p))); }

// A Q4_0 block's 32 values minus 8, as 4 x 8 floats (elements 0-7, 8-15, 16-23, 24-31).
void q4_values(const uint8_t* qs, __m256 out[4]) {
  const __m128i bytes = _mm_loadu_si128((const __m128i*)qs);
  const __m128i m = _mm_set1_epi8(0xF), eight = _mm_set1_epi8(8);
  const __m128i lo = _mm_sub_epi8(_mm_and_si128(bytes, m), eight);
  const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), m), eight);
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  out[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  out[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}

}  // namespace

float dot_q8_0_avx2(const float* q, const void* k, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(k);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t j = 0; j < n / 32; ++j, q += 32, b += kQ8Bytes) {
    const uint8_t* qs = b + 2;
    __m256 s = _mm256_mul_ps(_mm256_loadu_ps(q), load8_i8(qs));
    s = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8), load8_i8(qs + 8), s);
    s = _mm256_fmadd_ps(_mm256_loadu_ps(q + 16), load8_i8(qs + 16), s);
    s = _mm256_fmadd_ps(_mm256_loadu_ps(q + 24), load8_i8(qs + 24), s);
    acc = _mm256_fmadd_ps(s, _mm256_set1_ps(block_d(b)), acc);
  }
  return hsum(acc);
}

void axpy_q8_0_avx2(float w, const void* v, float* acc, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(v);
  for (int64_t j = 0; j < n / 32; ++j, acc += 32, b += kQ8Bytes) {
    const __m256 wd = _mm256_set1_ps(w * block_d(b));
    for (int i = 0; i < 32; i += 8)
      _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wd, load8_i8(b + 2 + i), _mm256_loadu_ps(acc + i)));
  }
}

float dot_q4_0_avx2(const float* q, const void* k, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(k);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t j = 0; j < n / 32; ++j, q += 32, b += kQ4Bytes) {
    __m256 x[4];
    q4_values(b + 2, x);
    __m256 s = _mm256_mul_ps(_mm256_loadu_ps(q), x[0]);
    s = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8), x[1], s);
    s = _mm256_fmadd_ps(_mm256_loadu_ps(q + 16), x[2], s);
    s = _mm256_fmadd_ps(_mm256_loadu_ps(q + 24), x[3], s);
    acc = _mm256_fmadd_ps(s, _mm256_set1_ps(block_d(b)), acc);
  }
  return hsum(acc);
}

void axpy_q4_0_avx2(float w, const void* v, float* acc, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(v);
  for (int64_t j = 0; j < n / 32; ++j, acc += 32, b += kQ4Bytes) {
    const __m256 wd = _mm256_set1_ps(w * block_d(b));
    __m256 x[4];
    q4_values(b + 2, x);
    for (int i = 0; i < 4; ++i)
      _mm256_storeu_ps(acc + 8 * i, _mm256_fmadd_ps(wd, x[i], _mm256_loadu_ps(acc + 8 * i)));
  }
}

}  // namespace xpert::cpu
