// X rows quantized straight into their packed planes on AVX-512: the same integers and scales as
// quantize_row_activation + pack_row in matmul.cpp (bit for bit: test_matmul checks), without the
// ggml-layout copy in between. At prefill this ran at ~1/5 of the panel kernels' time in scalar code.
// No standard-library templates here (see matmul_simd.inl).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace xpert::cpu {

namespace {

inline float max_abs(__m512 a, __m512 b) { return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b))); }

}  // namespace

// Q8_0: per 32, d = f16(amax / 127), q = round-to-even(x * 127 / amax) (llama.cpp's x86 quantize_row_q8_0).
void pack_row_q8_0_avx512(const float* x, int64_t k, const PackedLayout& l, int32_t level_offset, uint8_t* out) {
  auto* qs = reinterpret_cast<int8_t*>(out);
  auto* d = reinterpret_cast<float*>(out + l.d_offset);
  auto* neg_sum = reinterpret_cast<int32_t*>(out + l.sum_offset);
  auto* aux = l.aux_offset ? reinterpret_cast<int32_t*>(out + l.aux_offset) : nullptr;
  for (int64_t b = 0; b < k / 32; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
    const float amax = max_abs(v0, v1);
    const uint16_t h = _cvtss_sh(amax / 127.f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    d[b] = _cvtsh_ss(h);
    const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * b), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * b + 16), _mm512_cvtsepi32_epi8(q1));
    const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    neg_sum[b] = -sum;
    if (aux) aux[b] = -sum * level_offset;
  }
}

// Q8_K: per 256, the element of largest magnitude (the first, on ties) maps to -127: iscale = -127 / max,
// q = min(127, round-to-even(iscale * x)), d = 1 / iscale, bsums per 16. An all-zero block is all zeros.
void pack_row_q8_k_avx512(const float* x, int64_t k, const PackedLayout& l, uint8_t* out) {
  auto* qs = reinterpret_cast<int8_t*>(out);
  auto* d = reinterpret_cast<float*>(out + l.d_offset);
  auto* bsums = reinterpret_cast<int16_t*>(out + l.sum_offset);
  for (int64_t b = 0; b < k / 256; ++b) {
    const float* xb = x + 256 * b;
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < 16; ++i) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(xb + 16 * i)));
    const float amax = _mm512_reduce_max_ps(m);
    int16_t sums[16] = {};
    if (amax == 0.0f) {
      std::memset(qs + 256 * b, 0, 256);
      d[b] = 0.0f;
    } else {
      float max = 0;
      for (int i = 0; i < 16; ++i) {
        const __mmask16 hit =
            _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(xb + 16 * i)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
        if (hit) {
          max = xb[16 * i + __builtin_ctz(hit)];
          break;
        }
      }
      const float iscale = -127.f / max;
      const __m512 is = _mm512_set1_ps(iscale);
      for (int i = 0; i < 16; ++i) {
        const __m512i q =
            _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(is, _mm512_loadu_ps(xb + 16 * i))), _mm512_set1_epi32(127));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 256 * b + 16 * i), _mm512_cvtsepi32_epi8(q));
        sums[i] = (int16_t)_mm512_reduce_add_epi32(q);
      }
      d[b] = 1 / iscale;
    }
    std::memcpy(bsums + 16 * b, sums, sizeof sums);
    if (!l.aux_offset) continue;  // Q6_K's (the only K-quant aux plane)
    auto* aux = reinterpret_cast<int32_t*>(out + l.aux_offset) + 16 * b;
    for (int j = 0; j < 16; ++j) aux[j] = -32 * sums[j];
  }
}

}  // namespace xpert::cpu
