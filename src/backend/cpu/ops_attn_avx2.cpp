// Compiled with -mavx2 -mfma -mf16c; called only when best_isa() >= avx2. No inline functions from shared
// headers here (the linker could keep this file's AVX2 copy for baseline callers).
//
// Every (row, key) score is one 8-lane FMA accumulator over the dims in order, then the same horizontal
// sum, then the dims past the last multiple of 8 one by one; every output element one FMA per key in
// order. Tiles of several rows and keys only interleave these sequences, so a row's bits do not depend
// on the tile it lands in.
#include <immintrin.h>

#include "backend/cpu/ops_attn.h"

namespace xpert::cpu {

namespace {

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

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
  for (int r = 0; r < RR; ++r)
    for (int j = 0; j < JJ; ++j) {
      float x = hsum(acc[r][j]);
      for (int64_t c = D8; c < D; ++c) x = __builtin_fmaf(q[r * D + c], k[j * D + c], x);
      s[r * lds + j] = x;
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

}  // namespace

void attn_scores_avx2(const float* q, int64_t R, const float* k, int64_t J, int64_t D, float* s, int64_t lds) {
  int64_t r = 0;
  for (; r + 4 <= R; r += 4) {
    int64_t j = 0;
    for (; j + 2 <= J; j += 2) score_tile<4, 2>(q + r * D, k + j * D, D, s + r * lds + j, lds);
    for (; j < J; ++j) score_tile<4, 1>(q + r * D, k + j * D, D, s + r * lds + j, lds);
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
