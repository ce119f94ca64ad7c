// Compiled with -mavx2 -mfma -mf16c; called only when best_isa() >= avx2.
#include <immintrin.h>

#include "backend/cpu/ops_f16.h"
#include "base/half.h"

namespace xpert::cpu {

float dot_f16_avx2(const float* a, const uint16_t* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 b0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(b + i)));
    const __m256 b1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(b + i + 8)));
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), b0, acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), b1, acc1);
  }
  acc0 = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  float r = _mm_cvtss_f32(s);
  for (; i < n; ++i) r += a[i] * f16_to_f32(b[i]);
  return r;
}

void axpy_f16_avx2(float w, const uint16_t* x, float* acc, int64_t n) {
  const __m256 vw = _mm256_set1_ps(w);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(x + i)));
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vw, xv, _mm256_loadu_ps(acc + i)));
  }
  for (; i < n; ++i) acc[i] += w * f16_to_f32(x[i]);
}

}  // namespace xpert::cpu
