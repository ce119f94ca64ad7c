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
// Per-row scales are stored as f32 beside the levels, pre-multiplied where the format allows (K-quants:
// d * sub-block scale, dmin * sub-block min).
//
// Integer dot products per block are llama.cpp's for Q4_0 / Q5_0 / Q8_0; K-quants sum their sub-blocks
// in float (d * sc * dot) rather than in int32 first: the same products, rounded a little differently.
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

constexpr int kRows = (int)kPanelRows;
static_assert(kRows == 16, "one zmm of int32 lanes per panel");
// X rows per register tile: K-quants hold 3 zmm per row (integer sum, block sum, total), 8 rows fill 24 of
// the 32 registers. The Q8_0 family holds 2 per row, but 12 rows measured ~3 % slower than 8.
constexpr int kMaxMR = 8;

XP_INLINE float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

XP_INLINE int32_t i32_at(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

XP_INLINE __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 16 nibbles -> 32 levels: low nibbles (elements 0..15), then high nibbles (16..31).
XP_INLINE __m256i nibbles_32(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Row r's levels (n_groups words of 4 bytes) into the panel: word g goes to panel group g, lane r.
XP_INLINE void scatter_levels(const uint8_t* levels, int n_groups, uint8_t* groups, int r) {
  for (int g = 0; g < n_groups; ++g) std::memcpy(groups + 64 * g + 4 * r, levels + 4 * g, 4);
}

// ---- Q4_0 / Q5_0 / Q8_0: panel block = 8 groups (512 B) + 16 f32 scales (64 B) ------------------------

constexpr size_t kQ8BlockBytes = 8 * 64 + 64;

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

template <class W>
void repack_q8_0_family(int64_t nb, const uint8_t* w, size_t w_row_bytes, int n_w, uint8_t* panel) {
  std::memset(panel, 0, (size_t)nb * kQ8BlockBytes);  // rows past n_w: levels and scales 0
  for (int r = 0; r < n_w; ++r) {
    const uint8_t* row = w + (size_t)r * w_row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      alignas(32) uint8_t lv[32];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lv), W::levels(row + b * W::kBytes));
      uint8_t* pb = panel + b * kQ8BlockBytes;
      scatter_levels(lv, 8, pb, r);
      const float d = f16_at(row + b * W::kBytes);
      std::memcpy(pb + 512 + 4 * r, &d, 4);
    }
  }
}

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

// ---- Q4_K / Q5_K: panel block = 64 groups (4096 B) + d*sc [8][16] f32 + dmin*m [8][16] f32 ------------

constexpr size_t kKBlockBytes = 64 * 64 + 2 * 8 * 64;
constexpr size_t kQ6KBlockBytes = 64 * 64 + 16 * 64;

// The 6-bit scale and min of sub-block j (quant::unpack_scale_min_k4, kept local: see the top of the file).
XP_INLINE void scale_min_k4(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *min = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

template <bool kFiveBit>
void repack_q45_k(int64_t nb, const uint8_t* w, size_t w_row_bytes, int n_w, uint8_t* panel) {
  constexpr size_t kBytes = kFiveBit ? 176 : 144;
  constexpr size_t kQsOffset = kFiveBit ? 48 : 16;
  std::memset(panel, 0, (size_t)nb * kKBlockBytes);
  for (int r = 0; r < n_w; ++r) {
    const uint8_t* row = w + (size_t)r * w_row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = row + b * kBytes;
      uint8_t* pb = panel + b * kKBlockBytes;
      alignas(32) uint8_t lv[256];
      for (int ch = 0; ch < 4; ++ch) {
        const __m256i raw = load256(blk + kQsOffset + 32 * ch);
        __m256i lo = _mm256_and_si256(raw, _mm256_set1_epi8(0x0F));
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0F));
        if constexpr (kFiveBit) {
          // bit s of qh[l] is bit 4 of element 32s + l
          const __m256i qh = load256(blk + 16);
          const __m256i bit_lo = _mm256_set1_epi8((char)(1 << (2 * ch))), bit_hi = _mm256_set1_epi8((char)(2 << (2 * ch)));
          const __m256i x10 = _mm256_set1_epi8(0x10);
          lo = _mm256_or_si256(lo, _mm256_maskz_mov_epi8(_mm256_test_epi8_mask(qh, bit_lo), x10));
          hi = _mm256_or_si256(hi, _mm256_maskz_mov_epi8(_mm256_test_epi8_mask(qh, bit_hi), x10));
        }
        _mm256_store_si256(reinterpret_cast<__m256i*>(lv + 64 * ch), lo);
        _mm256_store_si256(reinterpret_cast<__m256i*>(lv + 64 * ch + 32), hi);
      }
      scatter_levels(lv, 64, pb, r);
      const float d = f16_at(blk), dmin = f16_at(blk + 2);
      for (int s = 0; s < 8; ++s) {
        uint8_t sc, m;
        scale_min_k4(s, blk + 4, &sc, &m);
        const float dsc = d * (float)sc, dm = dmin * (float)m;
        std::memcpy(pb + 4096 + 64 * s + 4 * r, &dsc, 4);
        std::memcpy(pb + 4096 + 512 + 64 * s + 4 * r, &dm, 4);
      }
    }
  }
}

// aux: f32 per 32 elements, sum(a) of the sub-block (for the mins).
template <int MR>
void gemm_q45_k(int64_t nb, const uint8_t* panel, const uint8_t* x, const PackedLayout& l, float* y, int64_t ldy,
                __mmask16 store_mask) {
  __m512 acc[MR];
  for (int c = 0; c < MR; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* pb = panel + b * kKBlockBytes;
    __m512 blk[MR];
    for (int c = 0; c < MR; ++c) blk[c] = _mm512_setzero_ps();
    for (int s = 0; s < 8; ++s) {
      __m512i sum[MR];
      for (int c = 0; c < MR; ++c) sum[c] = _mm512_setzero_si512();
      for (int g = 0; g < 8; ++g) {
        const __m512i wv = _mm512_load_si512(pb + 64 * (8 * s + g));
        for (int c = 0; c < MR; ++c)
          sum[c] = _mm512_dpbusd_epi32(sum[c], wv,
                                       _mm512_set1_epi32(i32_at(x + c * l.row_bytes + 256 * b + 32 * s + 4 * g)));
      }
      const __m512 dsc = _mm512_load_ps(pb + 4096 + 64 * s), dm = _mm512_load_ps(pb + 4096 + 512 + 64 * s);
      for (int c = 0; c < MR; ++c) {
        float asum;
        std::memcpy(&asum, x + c * l.row_bytes + l.aux_offset + 4 * (8 * b + s), 4);
        blk[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[c]), dsc, blk[c]);
        blk[c] = _mm512_fnmadd_ps(dm, _mm512_set1_ps(asum), blk[c]);
      }
    }
    for (int c = 0; c < MR; ++c) {
      float xd;
      std::memcpy(&xd, x + c * l.row_bytes + l.d_offset + 4 * b, 4);
      acc[c] = _mm512_fmadd_ps(blk[c], _mm512_set1_ps(xd), acc[c]);
    }
  }
  for (int c = 0; c < MR; ++c) _mm512_mask_storeu_ps(y + c * ldy, store_mask, acc[c]);
}

// ---- Q6_K: panel block = 64 groups (4096 B) + d*sc [16][16] f32 ----------------------------------------

void repack_q6_k(int64_t nb, const uint8_t* w, size_t w_row_bytes, int n_w, uint8_t* panel) {
  std::memset(panel, 0, (size_t)nb * kQ6KBlockBytes);
  for (int r = 0; r < n_w; ++r) {
    const uint8_t* row = w + (size_t)r * w_row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = row + b * 210;
      uint8_t* pb = panel + b * kQ6KBlockBytes;
      alignas(32) uint8_t lv[256];
      for (int half = 0; half < 2; ++half) {
        // Elements 128 half + 32 g + l: low 4 bits from ql (nibble g/2 of byte 32 (g%2) + l), high 2 bits
        // from bits 2g of qh[l].
        const __m256i ql0 = load256(blk + 64 * half), ql1 = load256(blk + 64 * half + 32);
        const __m256i qh = load256(blk + 128 + 32 * half);
        const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
            _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30))};
        for (int g = 0; g < 4; ++g)
          _mm256_store_si256(reinterpret_cast<__m256i*>(lv + 128 * half + 32 * g), q[g]);
      }
      scatter_levels(lv, 64, pb, r);
      const float d = f16_at(blk + 208);
      for (int s = 0; s < 16; ++s) {
        const float dsc = d * (float)(int8_t)blk[192 + s];
        std::memcpy(pb + 4096 + 64 * s + 4 * r, &dsc, 4);
      }
    }
  }
}

// aux: int32 per 16 elements, -32 * sum(a) of the sub-block (the levels' offset).
template <int MR>
void gemm_q6_k(int64_t nb, const uint8_t* panel, const uint8_t* x, const PackedLayout& l, float* y, int64_t ldy,
               __mmask16 store_mask) {
  __m512 acc[MR];
  for (int c = 0; c < MR; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* pb = panel + b * kQ6KBlockBytes;
    __m512 blk[MR];
    for (int c = 0; c < MR; ++c) blk[c] = _mm512_setzero_ps();
    for (int s = 0; s < 16; ++s) {
      __m512i sum[MR];
      for (int c = 0; c < MR; ++c)
        sum[c] = _mm512_set1_epi32(i32_at(x + c * l.row_bytes + l.aux_offset + 4 * (16 * b + s)));
      for (int g = 0; g < 4; ++g) {
        const __m512i wv = _mm512_load_si512(pb + 64 * (4 * s + g));
        for (int c = 0; c < MR; ++c)
          sum[c] = _mm512_dpbusd_epi32(sum[c], wv,
                                       _mm512_set1_epi32(i32_at(x + c * l.row_bytes + 256 * b + 16 * s + 4 * g)));
      }
      const __m512 dsc = _mm512_load_ps(pb + 4096 + 64 * s);
      for (int c = 0; c < MR; ++c) blk[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[c]), dsc, blk[c]);
    }
    for (int c = 0; c < MR; ++c) {
      float xd;
      std::memcpy(&xd, x + c * l.row_bytes + l.d_offset + 4 * b, 4);
      acc[c] = _mm512_fmadd_ps(blk[c], _mm512_set1_ps(xd), acc[c]);
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
  repack_q6_k(k / 256, w, w_row_bytes, (int)n_w, scratch);
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
