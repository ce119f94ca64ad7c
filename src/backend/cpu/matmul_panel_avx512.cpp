// Prefill kernels (many X rows) for AVX-512 VNNI: quantized weights are repacked, per call, into panels of
// 16 rows with the rows interleaved, so one zmm holds 4 consecutive levels of each of the 16 rows:
//
//   panel group g (64 bytes) = { row 0: levels 4g..4g+3 | row 1: levels 4g..4g+3 | ... | row 15 }
//
// One vpdpbusd of that group with 4 activation bytes broadcast to all lanes adds 64 products into 16 lanes,
// lane r being row r's dot product: no horizontal sums, and each block's float step (convert, scale, add)
// is shared by 16 rows instead of done per row. The inner loop is a load, then one broadcast + vpdpbusd
// per X row. Levels are stored unsigned (q + offset) since vpdpbusd multiplies u8 by s8; the offset's
// share, -offset * sum(a), starts the integer sum (the packed X's aux plane holds it, see matmul.cpp).
// Per-row scales are stored beside the levels: f32 for the Q8_0 family; for K-quants the integer sub-block
// scales and mins, and d, dmin as f32.
//
// Integer dot products per block are llama.cpp's. K-quants then take the float steps every K-quant kernel
// shares (matmul_simd.inl), so their panels give decode's bits; the Q8_0 family's do not (one float step per
// block here, per 8-lane group in decode), so batch invariance keeps them off (matmul.cpp).
// This file uses no standard-library templates and no inline functions of shared headers (see
// matmul_simd.inl: nothing built with AVX-512 flags may be merged into baseline code).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"

// GCC 12 flags the _mm512_undefined_* inside the 512-bit intrinsic headers as "maybe uninitialized".
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace xpert::cpu {
namespace {

#define XP_INLINE inline __attribute__((always_inline))

#include "backend/cpu/matmul_panel_repack.inl"

constexpr int kRows = (int)kPanelRows;
static_assert(kRows == 16, "one zmm of int32 lanes per panel");
// X rows per register tile: K-quants hold 3 zmm per row (sub-block dot, block sum, total), 8 rows fill 24 of
// the 32 registers. The Q8_0 family holds 2 per row, but 12 rows measured ~3 % slower than 8.
constexpr int kMaxMR = 8;

XP_INLINE int32_t i32_at(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- Q4_0 / Q5_0 / Q8_0: panel block = 8 groups (512 B) + 16 f32 scales (64 B) ------------------------

struct Q4_0P {
  static constexpr size_t kBytes = 18;
  static XP_INLINE __m256i levels(const uint8_t* b) { return nibbles_32(b + 2); }
};
struct Q5_0P {
  static constexpr size_t kBytes = 22;
  static XP_INLINE __m256i levels(const uint8_t* b) {
    const __m256i high = _mm256_maskz_mov_epi8((__mmask32)(uint32_t)i32_at(b + 2), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(nibbles_32(b + 6), high);
  }
};
struct Q8_0P {
  static constexpr size_t kBytes = 34;
  static XP_INLINE __m256i levels(const uint8_t* b) { return _mm256_xor_si256(load256(b + 2), _mm256_set1_epi8(-128)); }
};


// MR X rows against the panel. aux: int32 per block, -offset * sum(a).
template <int MR>
void gemm_q8_0_family(int64_t nb, const uint8_t* panel, const uint8_t* x, const PackedLayout& l, float* y,
                      int64_t ldy, __mmask16 store_mask) {
  __m512 acc[MR];
  for (int c = 0; c < MR; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* pb = panel + b * kQ8BlockBytes;
    __m512i sum[MR];
    for (int c = 0; c < MR; ++c) sum[c] = _mm512_set1_epi32(i32_at(x + c * l.row_bytes + l.aux_offset + 4 * b));
    for (int g = 0; g < 8; ++g) {
      const __m512i wv = _mm512_load_si512(pb + 64 * g);
      for (int c = 0; c < MR; ++c)
        sum[c] = _mm512_dpbusd_epi32(sum[c], wv, _mm512_set1_epi32(i32_at(x + c * l.row_bytes + 32 * b + 4 * g)));
    }
    const __m512 wd = _mm512_load_ps(pb + 512);
    for (int c = 0; c < MR; ++c) {
      float xd;
      std::memcpy(&xd, x + c * l.row_bytes + l.d_offset + 4 * b, 4);
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[c]), _mm512_mul_ps(wd, _mm512_set1_ps(xd)), acc[c]);
    }
  }
  for (int c = 0; c < MR; ++c) _mm512_mask_storeu_ps(y + c * ldy, store_mask, acc[c]);
}

// ---- Q4_K / Q5_K and Q6_K: exact integer totals per block, then the shared float steps -----------------
// Per block and X row: each sub-block's dot products (vpdpbusd, exact int32) times its scale (vpmulld) summed
// to isum; the mins against the X row's bsums pairs (vpdpwssd) to msum; then, as every K-quant kernel
// (matmul_simd.inl): acc = fma(isum, d * da, acc), acc = fma(-msum, dmin * da, acc). Lane r's bits are
// those of weight row r computed alone (decode), whatever the panel's X rows.

template <int MR>
void gemm_q45_k(int64_t nb, const uint8_t* panel, const uint8_t* x, const PackedLayout& l, float* y, int64_t ldy,
                __mmask16 store_mask) {
  __m512 acc[MR];
  for (int c = 0; c < MR; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* pb = panel + b * kKBlockBytes;
    __m512i isum[MR];
    for (int c = 0; c < MR; ++c) isum[c] = _mm512_setzero_si512();
    for (int s = 0; s < 8; ++s) {
      __m512i dot[MR];
      for (int c = 0; c < MR; ++c) dot[c] = _mm512_setzero_si512();
      for (int g = 0; g < 8; ++g) {
        const __m512i wv = _mm512_load_si512(pb + 64 * (8 * s + g));
        for (int c = 0; c < MR; ++c)
          dot[c] = _mm512_dpbusd_epi32(dot[c], wv,
                                       _mm512_set1_epi32(i32_at(x + c * l.row_bytes + 256 * b + 32 * s + 4 * g)));
      }
      const __m512i sc = _mm512_load_si512(pb + kKScOffset + 64 * s);
      for (int c = 0; c < MR; ++c) isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(dot[c], sc));
    }
    __m512i msum[MR];
    for (int c = 0; c < MR; ++c) msum[c] = _mm512_setzero_si512();
    for (int s = 0; s < 8; ++s) {
      const __m512i mins = _mm512_load_si512(pb + kKMinOffset + 64 * s);
      for (int c = 0; c < MR; ++c)  // bsums 2s, 2s+1 of the X row
        msum[c] = _mm512_dpwssd_epi32(msum[c], mins,
                                      _mm512_set1_epi32(i32_at(x + c * l.row_bytes + l.sum_offset + 32 * b + 4 * s)));
    }
    const __m512 d = _mm512_load_ps(pb + kKDOffset), dmin = _mm512_load_ps(pb + kKDminOffset);
    for (int c = 0; c < MR; ++c) {
      float xd;
      std::memcpy(&xd, x + c * l.row_bytes + l.d_offset + 4 * b, 4);
      const __m512 da = _mm512_set1_ps(xd);
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d, da), acc[c]);
      acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[c]), _mm512_mul_ps(dmin, da), acc[c]);
    }
  }
  for (int c = 0; c < MR; ++c) _mm512_mask_storeu_ps(y + c * ldy, store_mask, acc[c]);
}

// aux: int32 per 16 elements, -32 * sum(a) of the sub-block (the levels' offset), the start of its dot.
template <int MR>
void gemm_q6_k(int64_t nb, const uint8_t* panel, const uint8_t* x, const PackedLayout& l, float* y, int64_t ldy,
               __mmask16 store_mask) {
  __m512 acc[MR];
  for (int c = 0; c < MR; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* pb = panel + b * kQ6KBlockBytes;
    __m512i isum[MR];
    for (int c = 0; c < MR; ++c) isum[c] = _mm512_setzero_si512();
    for (int s = 0; s < 16; ++s) {
      __m512i dot[MR];
      for (int c = 0; c < MR; ++c)
        dot[c] = _mm512_set1_epi32(i32_at(x + c * l.row_bytes + l.aux_offset + 4 * (16 * b + s)));
      for (int g = 0; g < 4; ++g) {
        const __m512i wv = _mm512_load_si512(pb + 64 * (4 * s + g));
        for (int c = 0; c < MR; ++c)
          dot[c] = _mm512_dpbusd_epi32(dot[c], wv,
                                       _mm512_set1_epi32(i32_at(x + c * l.row_bytes + 256 * b + 16 * s + 4 * g)));
      }
      const __m512i sc = _mm512_load_si512(pb + kQ6KScOffset + 64 * s);
      for (int c = 0; c < MR; ++c) isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(dot[c], sc));
    }
    const __m512 d = _mm512_load_ps(pb + kQ6KDOffset);
    for (int c = 0; c < MR; ++c) {
      float xd;
      std::memcpy(&xd, x + c * l.row_bytes + l.d_offset + 4 * b, 4);
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d, _mm512_set1_ps(xd)), acc[c]);
    }
  }
  for (int c = 0; c < MR; ++c) _mm512_mask_storeu_ps(y + c * ldy, store_mask, acc[c]);
}

// ---- entry: repack one panel, then all X rows in tiles of kMaxMR -------------------------------------

// The last n_x % MR rows: one tile of exactly that height (MR-1, then MR-2, ... down to 1).
template <template <int> class G, int MR>
XP_INLINE void gemm_tail(int64_t rows, int64_t nb, const uint8_t* panel, const uint8_t* x, const PackedLayout& l,
                         float* y, int64_t ldy, __mmask16 mask) {
  if constexpr (MR > 0) {
    if (rows == MR) return G<MR>::run(nb, panel, x, l, y, ldy, mask);
    gemm_tail<G, MR - 1>(rows, nb, panel, x, l, y, ldy, mask);
  }
}

template <template <int> class G, int MR>
void gemm_all_rows(int64_t nb, const uint8_t* panel, const uint8_t* x, const PackedLayout& l, int64_t n_x,
                   float* y, int64_t ldy, int n_w) {
  const __mmask16 mask = (__mmask16)((1u << n_w) - 1);
  int64_t i = 0;
  for (; i + MR <= n_x; i += MR) G<MR>::run(nb, panel, x + i * l.row_bytes, l, y + i * ldy, ldy, mask);
  gemm_tail<G, MR - 1>(n_x - i, nb, panel, x + i * l.row_bytes, l, y + i * ldy, ldy, mask);
}

template <int MR>
struct Q8_0FamilyGemm {
  static void run(int64_t nb, const uint8_t* p, const uint8_t* x, const PackedLayout& l, float* y, int64_t ldy,
                  __mmask16 m) {
    gemm_q8_0_family<MR>(nb, p, x, l, y, ldy, m);
  }
};
template <int MR>
struct Q45KGemm {
  static void run(int64_t nb, const uint8_t* p, const uint8_t* x, const PackedLayout& l, float* y, int64_t ldy,
                  __mmask16 m) {
    gemm_q45_k<MR>(nb, p, x, l, y, ldy, m);
  }
};
template <int MR>
struct Q6KGemm {
  static void run(int64_t nb, const uint8_t* p, const uint8_t* x, const PackedLayout& l, float* y, int64_t ldy,
                  __mmask16 m) {
    gemm_q6_k<MR>(nb, p, x, l, y, ldy, m);
  }
};

template <class W>
void panel_q8_0_family(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                       const PackedLayout& l, int64_t n_x, float* y, int64_t ldy, uint8_t* scratch) {
  repack_q8_0_family<W>(k / 32, w, w_row_bytes, (int)n_w, scratch);
  gemm_all_rows<Q8_0FamilyGemm, kMaxMR>(k / 32, scratch, x, l, n_x, y, ldy, (int)n_w);
}

template <bool kFiveBit>
void panel_q45_k(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                 const PackedLayout& l, int64_t n_x, float* y, int64_t ldy, uint8_t* scratch) {
  repack_q45_k<kFiveBit>(k / 256, w, w_row_bytes, (int)n_w, scratch);
  gemm_all_rows<Q45KGemm, kMaxMR>(k / 256, scratch, x, l, n_x, y, ldy, (int)n_w);
}

void panel_q6_k(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                const PackedLayout& l, int64_t n_x, float* y, int64_t ldy, uint8_t* scratch) {
  repack_q6_k<0>(k / 256, w, w_row_bytes, (int)n_w, scratch);  // levels unsigned for vpdpbusd
  gemm_all_rows<Q6KGemm, kMaxMR>(k / 256, scratch, x, l, n_x, y, ldy, (int)n_w);
}

}  // namespace

const PanelKernels& matmul_panel_kernels_avx512() {
  static const PanelKernels kernels = {
      .q4_0 = panel_q8_0_family<Q4_0P>,
      .q5_0 = panel_q8_0_family<Q5_0P>,
      .q8_0 = panel_q8_0_family<Q8_0P>,
      .q4_k = panel_q45_k<false>,
      .q5_k = panel_q45_k<true>,
      .q6_k = panel_q6_k,
  };
  return kernels;
}

}  // namespace xpert::cpu
