// Compiled with -mavx2 -mfma -mf16c; called only when best_isa() >= avx2. No inline functions from shared
// headers here (the linker could keep this file's AVX2 copy for baseline callers).
//
// Every (row, key) score is one 8-lane FMA accumulator over the dims in order, then the same horizontal
// sum order, then the dims past the last multiple of 8 one by one; every output element one FMA per key in
// order. Tiles of several rows and keys only interleave these sequences, so a row's bits do not depend
// on the tile it lands in.
#include <immintrin.h>

#include "backend/cpu/ops_attn.h"

namespace xpert::cpu {

namespace {

// The sum of a vector's 8 lanes as ((0+1)+(2+3)) + ((4+5)+(6+7)): the order hsum4 gives each of its
// four vectors, so a score has the same bits from either.
float hsum1(__m256 v) {
  __m256 t = _mm256_hadd_ps(v, v);
  t = _mm256_hadd_ps(t, t);
  return _mm_cvtss_f32(_mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}

// The lane sums of a, b, c, d (hsum1's order for each), stored to out[0..3].
void hsum4(__m256 a, __m256 b, __m256 c, __m256 d, float* out) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}

// RR rows x JJ keys (JJ 1 or 4): one 8-lane accumulator per pair over the dims in order, summed in
// hsum1's order, then the dims past the last multiple of 8.
template <int RR, int JJ>
void score_tile(const float* q, const float* k, int64_t D, float* s, int64_t lds) {
  __m256 acc[RR][JJ];
  for (int r = 0; r < RR; ++r)
    for (int j = 0; j < JJ; ++j) acc[r][j] = _mm256_setzero_ps();
  const int64_t D8 = D & ~(int64_t)7;
  for (int64_t c = 0; c < D8; c += 8) {
    __m256 kv[JJ];
    for (int j = 0; j < JJ; ++j) kv[j] = _mm256_loadu_ps(k + j * D + c);
    for (int r = 0; r < RR; ++r) {
      const __m256 qv = _mm256_loadu_ps(q + r * D + c);
      for (int j = 0; j < JJ; ++j) acc[r][j] = _mm256_fmadd_ps(qv, kv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < RR; ++r) {
    float x[4];
    if constexpr (JJ == 4)
      hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3], x);
    else
      x[0] = hsum1(acc[r][0]);
    for (int j = 0; j < JJ; ++j) {
      for (int64_t c = D8; c < D; ++c) x[j] = __builtin_fmaf(q[r * D + c], k[j * D + c], x[j]);
      s[r * lds + j] = x[j];
    }
  }
}

template <int RR>
void pv_tile(const float* p, int64_t ldp, const float* v, int64_t J, int64_t D, float* o) {
  int64_t c = 0;
  for (; c + 16 <= D; c += 16) {
    __m256 acc[RR][2];
    for (int r = 0; r < RR; ++r) {
      acc[r][0] = _mm256_loadu_ps(o + r * D + c);
      acc[r][1] = _mm256_loadu_ps(o + r * D + c + 8);
    }
    for (int64_t j = 0; j < J; ++j) {
      const __m256 v0 = _mm256_loadu_ps(v + j * D + c), v1 = _mm256_loadu_ps(v + j * D + c + 8);
      for (int r = 0; r < RR; ++r) {
        const __m256 w = _mm256_broadcast_ss(p + r * ldp + j);
        acc[r][0] = _mm256_fmadd_ps(w, v0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(w, v1, acc[r][1]);
      }
    }
    for (int r = 0; r < RR; ++r) {
      _mm256_storeu_ps(o + r * D + c, acc[r][0]);
      _mm256_storeu_ps(o + r * D + c + 8, acc[r][1]);
    }
  }
  for (; c + 8 <= D; c += 8)
    for (int r = 0; r < RR; ++r) {
      __m256 acc = _mm256_loadu_ps(o + r * D + c);
      for (int64_t j = 0; j < J; ++j)
        acc = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * ldp + j), _mm256_loadu_ps(v + j * D + c), acc);
      _mm256_storeu_ps(o + r * D + c, acc);
    }
  for (; c < D; ++c)
    for (int r = 0; r < RR; ++r) {
      float acc = o[r * D + c];
      for (int64_t j = 0; j < J; ++j) acc = __builtin_fmaf(p[r * ldp + j], v[j * D + c], acc);
      o[r * D + c] = acc;
    }
}

float load_d(const uint8_t* b) {
  uint16_t h;
  __builtin_memcpy(&h, b, 2);
  return _cvtsh_ss(h);
}

}  // namespace

// q * d per value, the same product as the reference dequantization.
void attn_rows_f32_avx2(DType type, const uint8_t* src, size_t stride, int64_t J, int64_t D, float* out) {
  // At depth the cache is read from DRAM in head slices (every stride bytes a slice of 128 B or less):
  // without a prefetch of the next tile's slices the hardware left the threads at ~3 GB/s.
  const int64_t slice = type == DType::F16 ? 2 * D : type == DType::Q8_0 ? D / 32 * 34 : D / 32 * 18;
  const size_t ahead = kAttnBlock * stride;
  for (int64_t j = 0; j < J; ++j, src += stride, out += D) {
    for (int64_t b = 0; b < slice; b += 64) _mm_prefetch((const char*)src + ahead + b, _MM_HINT_T0);
    if (type == DType::F16) {
      const auto* h = reinterpret_cast<const uint16_t*>(src);
      int64_t c = 0;
      for (; c + 8 <= D; c += 8) _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(h + c))));
      for (; c < D; ++c) out[c] = _cvtsh_ss(h[c]);
    } else if (type == DType::Q8_0) {
      for (int64_t b = 0; b < D / 32; ++b) {
        const uint8_t* blk = src + b * 34;
        const __m256 d = _mm256_set1_ps(load_d(blk));
        for (int i = 0; i < 32; i += 8) {
          const __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 2 + i))));
          _mm256_storeu_ps(out + b * 32 + i, _mm256_mul_ps(x, d));
        }
      }
    } else {  // Q4_0: low nibbles are values 0-15, high nibbles 16-31, minus 8
      for (int64_t b = 0; b < D / 32; ++b) {
        const uint8_t* blk = src + b * 18;
        const __m256 d = _mm256_set1_ps(load_d(blk));
        const __m128i bytes = _mm_loadu_si128((const __m128i*)(blk + 2));
        const __m128i m = _mm_set1_epi8(0xF), eight = _mm_set1_epi8(8);
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(bytes, m), eight);
        const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), m), eight);
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int i = 0; i < 4; ++i)
          _mm256_storeu_ps(out + b * 32 + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[i])), d));
      }
    }
  }
}

void attn_scores_avx2(const float* q, int64_t R, const float* k, int64_t J, int64_t D, float* s, int64_t lds) {
  int64_t r = 0;
  for (; r + 2 <= R; r += 2) {
    int64_t j = 0;
    for (; j + 4 <= J; j += 4) score_tile<2, 4>(q + r * D, k + j * D, D, s + r * lds + j, lds);
    for (; j < J; ++j) score_tile<2, 1>(q + r * D, k + j * D, D, s + r * lds + j, lds);
  }
  for (; r < R; ++r) {
    int64_t j = 0;
    for (; j + 4 <= J; j += 4) score_tile<1, 4>(q + r * D, k + j * D, D, s + r * lds + j, lds);
    for (; j < J; ++j) score_tile<1, 1>(q + r * D, k + j * D, D, s + r * lds + j, lds);
  }
}

void attn_pv_avx2(const float* p, int64_t ldp, int64_t R, const float* v, int64_t J, int64_t D, float* o) {
  int64_t r = 0;
  for (; r + 4 <= R; r += 4) pv_tile<4>(p + r * ldp, ldp, v, J, D, o + r * D);
  for (; r < R; ++r) pv_tile<1>(p + r * ldp, ldp, v, J, D, o + r * D);
}

}  // namespace xpert::cpu
