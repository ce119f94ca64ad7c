// Prefill kernels on AMX-INT8 tiles (Sapphire Rapids and later). A panel of 16 weight rows is repacked per
// call exactly as the VNNI panels do it (matmul_panel_avx512.cpp), which happens to be the layout of a
// tdpbssd B operand: tile row g holds levels 4g..4g+3 of each of the 16 weight rows (64 bytes). The levels
// are stored signed (q - offset), so the products need no offset correction. The packed X rows are the A
// operand as they are: 16 rows of a block's int8 quants, the stride between packed rows.
//
// A scale covers 32 elements (16 for Q6_K), so one tile product covers one block: C (16 X rows x 16 weight
// rows, int32) = A (16 x 32 bytes) . B (8 rows x 64 bytes). Products of 4 blocks go to tmm4..tmm7, are
// stored to a buffer in L1, and the float epilogue (AVX-512) applies the scales, in the same operations
// and order as the VNNI panels: both give the same floats, bit for bit. The A/B operands alternate between
// tmm0/tmm2 and tmm1/tmm3 so the next product's loads need not wait for the previous product.
//
// Each step is split so tests can check everything but the tile instructions on CPUs without AMX: the
// kernels are templates over the tile operations, instantiated once with the instructions (HwTiles) and
// once with functions a test supplies (EmulatedTiles, see AmxEmulator in matmul_kernels.h).
//
// Compiled with the AVX-512 and AMX flags; only called after amx_enabled() (cpu_features.h), which also
// obtained the kernel's permission for tile data. Like every ISA file: no standard-library templates and
// no inline functions of shared headers (see matmul_simd.inl).
#include <immintrin.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"

// GCC 12 flags the _mm512_undefined_* inside the 512-bit intrinsic headers as "maybe uninitialized".
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace xpert::cpu {
namespace {

#define XP_INLINE inline __attribute__((always_inline))

constexpr int kRows = (int)kPanelRows;
static_assert(kRows == 16 && kAmxXRows == 16, "one 16 x 16 int32 C tile per panel and X tile");
constexpr int kRound = 4;  // tile products in flight: C tiles tmm4..tmm7

// Tile shapes for blocks of `block` elements (32, or 16 for Q6_K): A tmm0-1, B tmm2-3, C tmm4-7.
AmxTileConfig tile_config(int block) {
  AmxTileConfig c;
  c.palette = 1;
  for (int t = 0; t < 2; ++t) {  // A: 16 X rows x `block` int8
    c.rows[t] = 16;
    c.colsb[t] = (uint16_t)block;
  }
  for (int t = 2; t < 4; ++t) {  // B: block / 4 rows of (16 weight rows x 4 int8)
    c.rows[t] = (uint8_t)(block / 4);
    c.colsb[t] = 64;
  }
  for (int t = 4; t < 8; ++t) {  // C: 16 X rows x 16 weight rows int32
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  return c;
}

// GCC's tileloadd / ldtilecfg intrinsics do not tell the compiler which memory they read: before each one,
// this makes every store to memory the asm could reach (the repacked panel, the config) happen first.
XP_INLINE void memory_barrier(const void* p) { __asm__ volatile("" : : "r"(p) : "memory"); }

// Product j of a round (0..3): C tile 4 + j = A . B, operands in tmm(j % 2) and tmm(2 + j % 2). The
// intrinsics take tile numbers as literal tokens, hence the switch (j is a constant after inlining).
struct HwTiles {
  XP_INLINE void config(const AmxTileConfig& c) const {
    memory_barrier(&c);
    _tile_loadconfig(&c);
  }
  XP_INLINE void release() const { _tile_release(); }
  XP_INLINE void product(int j, const uint8_t* a, size_t lda, const uint8_t* b) const {
    memory_barrier(a);
    memory_barrier(b);
    switch (j) {
      case 0: _tile_zero(4); _tile_loadd(0, a, lda); _tile_loadd(2, b, 64); _tile_dpbssd(4, 0, 2); break;
      case 1: _tile_zero(5); _tile_loadd(1, a, lda); _tile_loadd(3, b, 64); _tile_dpbssd(5, 1, 3); break;
      case 2: _tile_zero(6); _tile_loadd(0, a, lda); _tile_loadd(2, b, 64); _tile_dpbssd(6, 0, 2); break;
      default: _tile_zero(7); _tile_loadd(1, a, lda); _tile_loadd(3, b, 64); _tile_dpbssd(7, 1, 3); break;
    }
  }
  // C tile of product j -> c (16 rows of 16 int32, 64-byte stride). _tile_stored clobbers memory.
  XP_INLINE void store(int j, int32_t* c) const {
    switch (j) {
      case 0: _tile_stored(4, c, 64); break;
      case 1: _tile_stored(5, c, 64); break;
      case 2: _tile_stored(6, c, 64); break;
      default: _tile_stored(7, c, 64); break;
    }
  }
};

const AmxEmulator* g_emulator = nullptr;  // __atomic builtins: no std::atomic templates in this file

struct EmulatedTiles {
  const AmxEmulator* e;
  void config(const AmxTileConfig& c) const { e->load_config(c); }
  void release() const { e->release(); }
  void product(int j, const uint8_t* a, size_t lda, const uint8_t* b) const {
    const int at = j % 2, bt = 2 + j % 2, ct = 4 + j;
    e->zero(ct);
    e->load(at, a, lda);
    e->load(bt, b, 64);
    e->dp_bssd(ct, at, bt);
  }
  void store(int j, int32_t* c) const { e->store(4 + j, c, 64); }
};

XP_INLINE float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

XP_INLINE float f32_at(const uint8_t* p) {
  float v;
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

// Row r's levels (n_groups words of 4 bytes) into the panel: word g goes to B row g, column r.
XP_INLINE void scatter_levels(const uint8_t* levels, int n_groups, uint8_t* groups, int r) {
  for (int g = 0; g < n_groups; ++g) std::memcpy(groups + 64 * g + 4 * r, levels + 4 * g, 4);
}

// ---- Q4_0 / Q5_0 / Q8_0: panel block = B tile (8 rows, 512 B) + 16 f32 weight scales (64 B) -----------

constexpr size_t kQ8BlockBytes = 8 * 64 + 64;

// Signed levels of one block (q - offset), as the scalar reference multiplies them.
struct Q4_0A {
  static constexpr size_t kBytes = 18;
  static XP_INLINE __m256i levels(const uint8_t* b) { return _mm256_sub_epi8(nibbles_32(b + 2), _mm256_set1_epi8(8)); }
};
struct Q5_0A {
  static constexpr size_t kBytes = 22;
  static XP_INLINE __m256i levels(const uint8_t* b) {
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const __m256i high = _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(0x10));
    return _mm256_sub_epi8(_mm256_or_si256(nibbles_32(b + 6), high), _mm256_set1_epi8(16));
  }
};
struct Q8_0A {
  static constexpr size_t kBytes = 34;
  static XP_INLINE __m256i levels(const uint8_t* b) { return load256(b + 2); }
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

// 16 X rows (x, padded past n_x by the caller) against the panel; rows < x_rows of y written.
template <class Tiles>
void gemm_q8_0_family(const Tiles& t, int64_t nb, const uint8_t* panel, const uint8_t* x, const PackedLayout& l,
                      int x_rows, float* y, int64_t ldy, __mmask16 store_mask) {
  alignas(64) int32_t c[kRound][256];
  __m512 acc[16];
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b0 = 0; b0 < nb; b0 += kRound) {
    const int n = nb - b0 < kRound ? (int)(nb - b0) : kRound;
#pragma GCC unroll 4
    for (int j = 0; j < kRound; ++j)
      if (j < n) t.product(j, x + 32 * (b0 + j), l.row_bytes, panel + (b0 + j) * kQ8BlockBytes);
#pragma GCC unroll 4
    for (int j = 0; j < kRound; ++j)
      if (j < n) t.store(j, c[j]);
    for (int j = 0; j < n; ++j) {
      const __m512 wd = _mm512_load_ps(panel + (b0 + j) * kQ8BlockBytes + 512);
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) {
        const float xd = f32_at(x + r * l.row_bytes + l.d_offset + 4 * (b0 + j));
        const __m512 sum = _mm512_cvtepi32_ps(_mm512_load_si512(c[j] + 16 * r));
        acc[r] = _mm512_fmadd_ps(sum, _mm512_mul_ps(wd, _mm512_set1_ps(xd)), acc[r]);
      }
    }
  }
  for (int r = 0; r < x_rows; ++r) _mm512_mask_storeu_ps(y + r * ldy, store_mask, acc[r]);
}

// ---- Q4_K / Q5_K: panel block = 8 B tiles (4096 B) + d*sc [8][16] f32 + dmin*m [8][16] f32 -------------

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

// Levels 0..15 (0..31) are non-negative: as int8 they are the same numbers.
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

// All sub-blocks of super-block b: n_sub products of `sub` elements each, C tiles stored to c[0..n_sub).
template <class Tiles>
XP_INLINE void super_block_products(const Tiles& t, int n_sub, int sub, const uint8_t* x, size_t lda,
                                    const uint8_t* groups, int32_t (*c)[256]) {
  for (int s0 = 0; s0 < n_sub; s0 += kRound) {
#pragma GCC unroll 4
    for (int j = 0; j < kRound; ++j) t.product(j, x + sub * (s0 + j), lda, groups + 16 * sub * (s0 + j));
#pragma GCC unroll 4
    for (int j = 0; j < kRound; ++j) t.store(j, c[s0 + j]);
  }
}

// aux: f32 per 32 elements, sum(a) of the sub-block (for the mins).
template <class Tiles>
void gemm_q45_k(const Tiles& t, int64_t nb, const uint8_t* panel, const uint8_t* x, const PackedLayout& l,
                int x_rows, float* y, int64_t ldy, __mmask16 store_mask) {
  alignas(64) int32_t c[8][256];
  __m512 acc[16];
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* pb = panel + b * kKBlockBytes;
    super_block_products(t, 8, 32, x + 256 * b, l.row_bytes, pb, c);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      const uint8_t* xr = x + r * l.row_bytes;
      __m512 blk = _mm512_setzero_ps();
      for (int s = 0; s < 8; ++s) {
        const __m512 dsc = _mm512_load_ps(pb + 4096 + 64 * s), dm = _mm512_load_ps(pb + 4096 + 512 + 64 * s);
        const float asum = f32_at(xr + l.aux_offset + 4 * (8 * b + s));
        blk = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[s] + 16 * r)), dsc, blk);
        blk = _mm512_fnmadd_ps(dm, _mm512_set1_ps(asum), blk);
      }
      acc[r] = _mm512_fmadd_ps(blk, _mm512_set1_ps(f32_at(xr + l.d_offset + 4 * b)), acc[r]);
    }
  }
  for (int r = 0; r < x_rows; ++r) _mm512_mask_storeu_ps(y + r * ldy, store_mask, acc[r]);
}

// ---- Q6_K: panel block = 16 B tiles of 4 rows (4096 B) + d*sc [16][16] f32 -----------------------------

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
        // from bits 2g of qh[l]; stored as level - 32.
        const __m256i ql0 = load256(blk + 64 * half), ql1 = load256(blk + 64 * half + 32);
        const __m256i qh = load256(blk + 128 + 32 * half);
        const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), off = _mm256_set1_epi8(32);
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
            _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30))};
        for (int g = 0; g < 4; ++g)
          _mm256_store_si256(reinterpret_cast<__m256i*>(lv + 128 * half + 32 * g), _mm256_sub_epi8(q[g], off));
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

template <class Tiles>
void gemm_q6_k(const Tiles& t, int64_t nb, const uint8_t* panel, const uint8_t* x, const PackedLayout& l,
               int x_rows, float* y, int64_t ldy, __mmask16 store_mask) {
  alignas(64) int32_t c[16][256];
  __m512 acc[16];
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* pb = panel + b * kQ6KBlockBytes;
    super_block_products(t, 16, 16, x + 256 * b, l.row_bytes, pb, c);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      __m512 blk = _mm512_setzero_ps();
      for (int s = 0; s < 16; ++s)
        blk = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[s] + 16 * r)), _mm512_load_ps(pb + 4096 + 64 * s),
                              blk);
      acc[r] = _mm512_fmadd_ps(blk, _mm512_set1_ps(f32_at(x + r * l.row_bytes + l.d_offset + 4 * b)), acc[r]);
    }
  }
  for (int r = 0; r < x_rows; ++r) _mm512_mask_storeu_ps(y + r * ldy, store_mask, acc[r]);
}

// ---- entry: configure the tiles, repack one panel, then all X rows 16 at a time ------------------------

enum class Family { q8_0, q45_k, q6_k };

template <class Tiles, Family F>
void run_panel(const Tiles& t, int64_t k, const uint8_t* panel, const uint8_t* x, const PackedLayout& l,
               int64_t n_x, float* y, int64_t ldy, int n_w) {
  const __mmask16 mask = (__mmask16)((1u << n_w) - 1);
  // The tile configuration is per thread and tilerelease drops it: load it for each call, release after
  // (a thread with tiles in use saves 8 KB more at every context switch).
  const AmxTileConfig config = tile_config(F == Family::q6_k ? 16 : 32);
  t.config(config);
  for (int64_t i = 0; i < n_x; i += 16) {
    const int rows = n_x - i < 16 ? (int)(n_x - i) : 16;
    const uint8_t* xi = x + i * l.row_bytes;
    float* yi = y + i * ldy;
    if constexpr (F == Family::q8_0) gemm_q8_0_family(t, k / 32, panel, xi, l, rows, yi, ldy, mask);
    else if constexpr (F == Family::q45_k) gemm_q45_k(t, k / 256, panel, xi, l, rows, yi, ldy, mask);
    else gemm_q6_k(t, k / 256, panel, xi, l, rows, yi, ldy, mask);
  }
  t.release();
}

template <class Tiles>
Tiles tiles();
template <>
XP_INLINE HwTiles tiles<HwTiles>() {
  return {};
}
template <>
XP_INLINE EmulatedTiles tiles<EmulatedTiles>() {
  const AmxEmulator* e = __atomic_load_n(&g_emulator, __ATOMIC_ACQUIRE);
  if (!e) {
    std::fprintf(stderr, "xpert: internal error: AMX emulated kernels called without set_amx_emulator\n");
    std::abort();
  }
  return {e};
}

template <class Tiles, class W>
void panel_q8_0_family(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                       const PackedLayout& l, int64_t n_x, float* y, int64_t ldy, uint8_t* scratch) {
  repack_q8_0_family<W>(k / 32, w, w_row_bytes, (int)n_w, scratch);
  run_panel<Tiles, Family::q8_0>(tiles<Tiles>(), k, scratch, x, l, n_x, y, ldy, (int)n_w);
}

template <class Tiles, bool kFiveBit>
void panel_q45_k(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                 const PackedLayout& l, int64_t n_x, float* y, int64_t ldy, uint8_t* scratch) {
  repack_q45_k<kFiveBit>(k / 256, w, w_row_bytes, (int)n_w, scratch);
  run_panel<Tiles, Family::q45_k>(tiles<Tiles>(), k, scratch, x, l, n_x, y, ldy, (int)n_w);
}

template <class Tiles>
void panel_q6_k(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                const PackedLayout& l, int64_t n_x, float* y, int64_t ldy, uint8_t* scratch) {
  repack_q6_k(k / 256, w, w_row_bytes, (int)n_w, scratch);
  run_panel<Tiles, Family::q6_k>(tiles<Tiles>(), k, scratch, x, l, n_x, y, ldy, (int)n_w);
}

template <class Tiles>
PanelKernels make_kernels() {
  return {
      .q4_0 = panel_q8_0_family<Tiles, Q4_0A>,
      .q5_0 = panel_q8_0_family<Tiles, Q5_0A>,
      .q8_0 = panel_q8_0_family<Tiles, Q8_0A>,
      .q4_k = panel_q45_k<Tiles, false>,
      .q5_k = panel_q45_k<Tiles, true>,
      .q6_k = panel_q6_k<Tiles>,
  };
}

}  // namespace

const PanelKernels& matmul_panel_kernels_amx() {
  static const PanelKernels kernels = make_kernels<HwTiles>();
  return kernels;
}

const PanelKernels& matmul_panel_kernels_amx_emulated() {
  static const PanelKernels kernels = make_kernels<EmulatedTiles>();
  return kernels;
}

void set_amx_emulator(const AmxEmulator* emulator) { __atomic_store_n(&g_emulator, emulator, __ATOMIC_RELEASE); }

}  // namespace xpert::cpu
