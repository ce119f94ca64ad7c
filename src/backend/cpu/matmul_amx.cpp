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

#include "backend/cpu/matmul_panel_repack.inl"

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

XP_INLINE int32_t i32_at(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

XP_INLINE float f32_at(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- Q4_0 / Q5_0 / Q8_0: panel block = B tile (8 rows, 512 B) + 16 f32 weight scales (64 B) -----------

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

// ---- Q4_K / Q5_K: panel block = 8 B tiles (4096 B) + sc, (m, m), d, dmin (matmul_panel_repack.inl) -------


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

// The epilogue of the VNNI panels' K-quant kernels (matmul_panel_avx512.cpp) on the stored C tiles: exact
// integer totals per block (sub-block products times their scales; the mins against the bsums pairs), then
// the same float steps.
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
    const __m512 d = _mm512_load_ps(pb + kKDOffset), dmin = _mm512_load_ps(pb + kKDminOffset);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      const uint8_t* xr = x + r * l.row_bytes;
      __m512i isum = _mm512_setzero_si512(), msum = _mm512_setzero_si512();
      for (int s = 0; s < 8; ++s) {
        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_load_si512(c[s] + 16 * r),
                                                         _mm512_load_si512(pb + kKScOffset + 64 * s)));
        msum = _mm512_dpwssd_epi32(msum, _mm512_load_si512(pb + kKMinOffset + 64 * s),
                                   _mm512_set1_epi32(i32_at(xr + l.sum_offset + 32 * b + 4 * s)));
      }
      const __m512 da = _mm512_set1_ps(f32_at(xr + l.d_offset + 4 * b));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, da), acc[r]);
      acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, da), acc[r]);
    }
  }
  for (int r = 0; r < x_rows; ++r) _mm512_mask_storeu_ps(y + r * ldy, store_mask, acc[r]);
}

// ---- Q6_K: panel block = 16 B tiles of 4 rows (4096 B) + sc [16][16] int32 + d [16] f32 -----------------

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
    const __m512 d = _mm512_load_ps(pb + kQ6KDOffset);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      __m512i isum = _mm512_setzero_si512();
      for (int s = 0; s < 16; ++s)
        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_load_si512(c[s] + 16 * r),
                                                         _mm512_load_si512(pb + kQ6KScOffset + 64 * s)));
      const __m512 da = _mm512_set1_ps(f32_at(x + r * l.row_bytes + l.d_offset + 4 * b));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, da), acc[r]);
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
  repack_q6_k<32>(k / 256, w, w_row_bytes, (int)n_w, scratch);  // signed levels for tdpbssd
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
