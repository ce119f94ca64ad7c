// Compiled with -mavx2 -mfma -mf16c; called only when best_isa() >= avx2. No inline functions from shared
// headers here: the linker could keep this file's AVX2 copy of one for baseline callers (SIGILL on old CPUs).
#include <immintrin.h>

#include "backend/cpu/ops_f16.h"

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
  for (; i < n; ++i) r += a[i] * _cvtsh_ss(b[i]);
  return r;
}

void axpy_f16_avx2(float w, const uint16_t* x, float* acc, int64_t n) {
  const __m256 vw = _mm256_set1_ps(w);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(x + i)));
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vw, xv, _mm256_loadu_ps(acc + i)));
  }
  for (; i < n; ++i) acc[i] += w * _cvtsh_ss(x[i]);
}

}  // namespace xpert::cpu

namespace xpert::cpu {

void round_f16_avx2(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
  for (; i < n; ++i) x[i] = _cvtsh_ss(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
}

namespace {

// exp(x) for x <= 0 (softmax after subtracting the max): 2^(x log2 e) split into 2^k * 2^f, f in
// [-0.5, 0.5], 2^f by a degree-6 polynomial (relative error < 2e-7). Below -87 the result is 0.
inline __m256 exp_neg(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  const __m256 k = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // f = x - k ln2 with ln2 split in two (Cody-Waite) so large |x| keeps full relative precision.
  __m256 f = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145751953125f), x);
  f = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.428606765330187045e-6f), f);
  // e^f for |f| <= ln2/2, Taylor to f^6.
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  const __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(tiny, r);
}

}  // namespace

double exp_sum_avx2(const float* x, float max, float* y, int64_t n) {
  const __m256 vmax = _mm256_set1_ps(max);
  __m256d acc = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
    _mm256_storeu_ps(y + i, v);
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  }
  alignas(32) double parts[4];
  _mm256_store_pd(parts, acc);
  double sum = parts[0] + parts[1] + parts[2] + parts[3];
  for (; i < n; ++i) {
    alignas(32) float in[8] = {x[i] - max}, out[8];
    _mm256_store_ps(out, exp_neg(_mm256_load_ps(in)));
    sum += (y[i] = out[0]);
  }
  return sum;
}

void geglu_avx2(const float* gate, const float* up, float* y, int64_t n, const uint16_t* t) {
  int64_t i = 0;
  alignas(16) uint16_t h[8], g16[8];
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    _mm_store_si128((__m128i*)h, _mm256_cvtps_ph(g, _MM_FROUND_TO_NEAREST_INT));
    for (int j = 0; j < 8; ++j) g16[j] = t[h[j]];
    __m256 gl = _mm256_cvtph_ps(_mm_load_si128((const __m128i*)g16));
    // llama.cpp's clamps: 0 at or below -10, the identity at or above 10.
    gl = _mm256_blendv_ps(gl, _mm256_setzero_ps(), _mm256_cmp_ps(g, _mm256_set1_ps(-10.0f), _CMP_LE_OQ));
    gl = _mm256_blendv_ps(gl, g, _mm256_cmp_ps(g, _mm256_set1_ps(10.0f), _CMP_GE_OQ));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(gl, _mm256_loadu_ps(up + i)));
  }
  geglu_scalar(gate + i, up + i, y + i, n - i, t);
}

}  // namespace xpert::cpu
