// AVX-512 (F/BW/VL/DQ) + VNNI kernels (Ice Lake, Sapphire Rapids, Zen 4 and later): the same code as the
// AVX2 table, with dpbusd/dpwssd for the integer dot products, mask moves, and 32 vector registers; plus
// 512-bit kernels below where whole vectors pay (decode of the Q8_0 family: two blocks per instruction).
#define XP_SIMD_TABLE_NAME matmul_kernels_avx512_vl
#define XP_SIMD_ISA_LABEL "avx512-vnni"

namespace xpert::cpu {
struct MatmulKernels;
const MatmulKernels& matmul_kernels_avx512_vl();  // the 256-bit kernels of matmul_simd.inl
}  // namespace xpert::cpu

#include "backend/cpu/matmul_simd.inl"

// GCC 12 flags the _mm512_undefined_* inside the 512-bit intrinsic headers (cast, permute, cvtph) as
// "maybe uninitialized"; the upper lanes they leave are never read here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace xpert::cpu {
namespace {

// ---- decode (one X row) of Q4_0 / Q5_0 / Q8_0 weights on 512-bit vectors ------------------------------
// A zmm holds two consecutive blocks: lanes 0..7 are block b's int32 partial sums, lanes 8..15 block b+1's,
// so one dpbusd does 64 products and the f16 scales of both blocks are converted by one vcvtph2ps.
// Per row and block pair: ~3 loads, 2-3 ops to unpack, dpbusd, cvtdq2ps, mul, fma (vs twice that at 256).

XP_INLINE __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

XP_INLINE uint16_t load_u16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

XP_INLINE uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Two 16-byte nibble arrays -> 64 levels: block 0 low nibbles, high nibbles, block 1 low, high.
XP_INLINE __m512i unpack_nibbles_64(const uint8_t* qs0, const uint8_t* qs1) {
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(load128(qs0))),
                                          _mm256_broadcastsi128_si256(load128(qs1)), 1);
  return _mm512_and_si512(_mm512_srlv_epi64(both, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)),
                          _mm512_set1_epi8(0x0F));
}

// Unsigned levels of blocks b and b+1 (b+1 only if `two`; else its lanes are 0), q + offset as in the .inl.
struct Q4_0W512 {
  static constexpr size_t kBytes = 18;
  static constexpr int kLaneShift = 0;
  static XP_INLINE __m512i load2(const uint8_t* b, bool two) {
    const __m512i v = unpack_nibbles_64(b + 2, b + (two ? kBytes : 0) + 2);
    return two ? v : _mm512_zextsi256_si512(_mm512_castsi512_si256(v));
  }
};
struct Q5_0W512 {
  static constexpr size_t kBytes = 22;
  static constexpr int kLaneShift = 1;
  static XP_INLINE __m512i load2(const uint8_t* b, bool two) {
    __m512i v = unpack_nibbles_64(b + 6, b + (two ? kBytes : 0) + 6);
    const uint64_t hi = two ? (uint64_t)load_u32(b + kBytes + 2) << 32 : 0;
    v = _mm512_mask_add_epi8(v, (__mmask64)(load_u32(b + 2) | hi), v, _mm512_set1_epi8(0x10));
    return two ? v : _mm512_zextsi256_si512(_mm512_castsi512_si256(v));
  }
};
struct Q8_0W512 {
  static constexpr size_t kBytes = 34;
  static constexpr int kLaneShift = 4;
  static XP_INLINE __m512i load2(const uint8_t* b, bool two) {
    const __m256i lo = _mm256_xor_si256(load256(b + 2), _mm256_set1_epi8(-128));
    if (!two) return _mm512_zextsi256_si512(lo);
    return _mm512_xor_si512(
        _mm512_inserti64x4(_mm512_castsi256_si512(load256(b + 2)), load256(b + kBytes + 2), 1),
        _mm512_set1_epi8(-128));
  }
};

// Scales of blocks b, b+1 as 8 + 8 floats (block b+1's = block b's when !two: its products are 0 anyway).
template <class W>
XP_INLINE __m512 load_scales2(const uint8_t* b, bool two) {
  const __m128i d0 = _mm_set1_epi16((short)load_u16(b));
  const __m128i d1 = _mm_set1_epi16((short)load_u16(b + (two ? W::kBytes : 0)));
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(d0), d1, 1));
}

// Each step prefetches (to L2) the same position of the next tile's rows, i.e. one tile ahead: the hardware
// streamers alone left decode at ~15 GB/s for 2 threads. Measured on a quiet 16-core Xeon, 2 threads, Q8_0:
// k=640 (the output projection) 13-21 GB/s with a fixed +512 B in-row prefetch, 35-42 with this; k=4096
// 30-40 vs 34-45.
//
// The float steps are those every Q8_0-family kernel takes (top of matmul_simd.inl): one per block and row,
// acc = fma(float(isum), d * da, acc). With 8 rows, the 8 x 16 int32 lanes of a block pair are summed to
// the 16 (row, block) totals in one transposition tree (21 operations), and the float steps run with the
// rows in lanes, the 16 weight scales fetched by one gather: fewer operations per row than a float step per
// lane, and the bits of the tiles and the panels.

XP_INLINE int total_epi32(__m256i v) { return _mm_cvtsi128_si32(row_totals<1>(&v)); }

// rows 0..7 of block b | rows 0..7 of block b+1 -> the 16 totals, lanes 0..7 block b, 8..15 block b+1.
XP_INLINE __m512i block_pair_totals_8(const __m512i (&p)[8]) {
  __m512i t[4];
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
    t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2 * i], p[2 * i + 1]),
                            _mm512_unpackhi_epi32(p[2 * i], p[2 * i + 1]));
  // per 128-bit lane: the lane's sum for rows 0..3 (u0) and 4..7 (u1)
  const __m512i u0 = _mm512_add_epi32(_mm512_unpacklo_epi64(t[0], t[1]), _mm512_unpackhi_epi64(t[0], t[1]));
  const __m512i u1 = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2], t[3]), _mm512_unpackhi_epi64(t[2], t[3]));
  // 128-bit lanes 0+1 are block b, 2+3 block b+1: [rows 0-3 b, rows 0-3 b+1, rows 4-7 b, rows 4-7 b+1]
  const __m512i v = _mm512_add_epi32(_mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15), v);
}

// R weight rows x one X row, all of k. y[r] = dot(row r, x). R = 8, or 1 (the last rows).
template <class W, int R>
void gemv_q8_0_family_512(int64_t k, const uint8_t* w, size_t w_row_bytes, const XRows& x, float* y) {
  static_assert(R == 8 || R == 1);
  const __m512i pick01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const int8_t* xq = x.qs(0);
  const float* xd = x.d(0);
  const int32_t* xs = reinterpret_cast<const int32_t*>(x.sums(0));
  const int rb = (int)w_row_bytes, kb = (int)W::kBytes;
  // Byte offsets of the 16 scales of a block pair: rows 0..7 of block b, then of block b+1.
  const __m512i scale_at = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7),
                                                               _mm512_set1_epi32(rb)),
                                            _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, kb, kb, kb, kb, kb, kb, kb, kb));
  __m256 acc8 = _mm256_setzero_ps();
  __m128 acc1 = _mm_setzero_ps();
  const int64_t nb = k / 32;
  auto step = [&](int64_t b, bool two) __attribute__((always_inline)) {
    // Shared by the R rows: 64 activations, -offset * sum(a) spread over each block's 8 lanes, and da.
    const __m512i a = two ? _mm512_loadu_si512(xq + 32 * b) : _mm512_zextsi256_si512(load256(xq + 32 * b));
    const __m128i s2 =
        two ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(xs + b)) : _mm_cvtsi32_si128(xs[b]);
    __m512i start = _mm512_permutexvar_epi32(pick01, _mm512_castsi128_si512(s2));
    if constexpr (W::kLaneShift > 0) start = _mm512_slli_epi32(start, W::kLaneShift);
    const __m128 d2 =
        two ? _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(xd + b))) : _mm_load_ss(xd + b);
    const __m512 da = _mm512_permutexvar_ps(pick01, _mm512_castps128_ps512(d2));
    __m512i p[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w + r * w_row_bytes + b * W::kBytes;
      _mm_prefetch(reinterpret_cast<const char*>(blk) + R * w_row_bytes, _MM_HINT_T1);  // next tile's row r
      p[r] = _mm512_dpbusd_epi32(start, W::load2(blk, two), a);
    }
    const uint8_t* base = w + b * W::kBytes;
    if constexpr (R == 8) {
      // The f16 scale opens each block: the low half of the 4 bytes there (block b+1's only if `two`).
      const __m512i raw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), two ? 0xFFFF : 0x00FF, scale_at, base, 1);
      const __m512 dd = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw)), da);
      const __m512 tot = _mm512_cvtepi32_ps(block_pair_totals_8(p));
      acc8 = _mm256_fmadd_ps(_mm512_castps512_ps256(tot), _mm512_castps512_ps256(dd), acc8);
      if (two) acc8 = _mm256_fmadd_ps(_mm512_extractf32x8_ps(tot, 1), _mm512_extractf32x8_ps(dd, 1), acc8);
    } else {
      const __m128 t0 = _mm_cvtsi32_ss(_mm_setzero_ps(), total_epi32(_mm512_castsi512_si256(p[0])));
      acc1 = _mm_fmadd_ss(t0, _mm_mul_ss(_mm_set_ss(load_f16(base)), _mm_set_ss(xd[b])), acc1);
      if (two) {
        const __m128 t1 = _mm_cvtsi32_ss(_mm_setzero_ps(), total_epi32(_mm512_extracti64x4_epi64(p[0], 1)));
        acc1 = _mm_fmadd_ss(t1, _mm_mul_ss(_mm_set_ss(load_f16(base + W::kBytes)), _mm_set_ss(xd[b + 1])), acc1);
      }
    }
  };
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) step(b, true);
  if (b < nb) step(b, false);
  if constexpr (R == 8) _mm256_storeu_ps(y, acc8);
  else y[0] = _mm_cvtss_f32(acc1);
}

template <class W>
void run_q8_0_family_512(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                         const PackedLayout& layout, int64_t n_x, float* y, int64_t ldy,
                         TileKernel tiles) {
  if (n_x != 1) return tiles(k, w, w_row_bytes, n_w, x, layout, n_x, y, ldy);
  const XRows xr{x, layout.row_bytes, layout.d_offset, layout.sum_offset};
  int64_t j = 0;
  for (; j + 8 <= n_w; j += 8) gemv_q8_0_family_512<W, 8>(k, w + j * w_row_bytes, w_row_bytes, xr, y + j);
  for (; j < n_w; ++j) gemv_q8_0_family_512<W, 1>(k, w + j * w_row_bytes, w_row_bytes, xr, y + j);
}

// ---- decode (one X row) of Q4_K weights on 512-bit vectors ------------------------------------------
// The 256-bit tile spent most of its time outside the products (scales unpacked byte by byte into the
// stack and read back, one broadcast per sub-block and row): ~8 GB/s per core even from L2. Here a zmm
// holds 64 bytes of levels = two 32-byte chunks, so its low nibbles are sub-blocks 2c and 2c+2 and its high
// nibbles 2c+1 and 2c+3. The activations are permuted once per block to match (shared by the R rows), the
// 6-bit scales and mins are unpacked with a few 32-bit word operations, and one pshufb per 64 levels spreads
// the two sub-blocks' scales over their int16 lanes. Integer sums are exactly the 256-bit kernel's (and
// llama.cpp's): sum sc * maddubs(q, a), minus sum m * (bsum pair). They are summed to one integer per row and
// block, and the float steps are the order every K-quant kernel shares (top of matmul_simd.inl): the results
// are bit for bit tile_q45_k's and the panels', whatever the batch.

// The 12 scale bytes of a Q4_K / Q5_K block -> sc[0..7] (low qword) and m[0..7] (high qword).
XP_INLINE void unpack_scales_k4_words(const uint8_t* s, uint64_t& sc8, uint64_t& m8) {
  const uint32_t u0 = load_u32(s), u1 = load_u32(s + 4), u2 = load_u32(s + 8);
  const uint32_t sc_lo = u0 & 0x3f3f3f3fu, m_lo = u1 & 0x3f3f3f3fu;
  const uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | (((u0 >> 6) & 0x03030303u) << 4);
  const uint32_t m_hi = ((u2 >> 4) & 0x0f0f0f0fu) | (((u1 >> 6) & 0x03030303u) << 4);
  sc8 = sc_lo | (uint64_t)sc_hi << 32;
  m8 = m_lo | (uint64_t)m_hi << 32;
}

// pshufb control: int16 lanes 0..15 = scale byte s0 zero-extended, lanes 16..31 = byte s1.
XP_INLINE __m512i scale_pick(int s0, int s1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(0x8000 | s0))),
                            _mm256_set1_epi16((short)(0x8000 | s1)), 1);
}

// Two f16 at p + r * w_row_bytes for rows r < G (G = 1 or 4): the first of each pair in lane r of `first`,
// the second in lane r of `second` (lanes past G: 0). row_offsets: r * w_row_bytes in int32 lane r.
template <int G>
XP_INLINE void load_f16_pairs(const uint8_t* p, __m128i row_offsets, __m128& first, __m128& second) {
  static_assert(G == 1 || G == 4);
  __m128i v;
  if constexpr (G == 1) v = _mm_cvtsi32_si128((int)load_u32(p));
  else v = _mm_i32gather_epi32(reinterpret_cast<const int*>(p), row_offsets, 1);
  const __m128i halves = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
  first = _mm_cvtph_ps(halves);
  second = _mm_cvtph_ps(_mm_unpackhi_epi64(halves, halves));
}

// The K-quant decode kernels below take R = 1, 4 or 8 rows: groups of G = min(R, 4) rows share one float lane
// vector (lane r: row r), as in the 256-bit tiles (the shared float order: top of matmul_simd.inl).
template <int R>
constexpr int kGroupRows = R < 4 ? R : 4;

// One Q4_K block of a weight row ready for the products: its levels' nibbles (sub-blocks 2c / 2c+2 in lo,
// 2c+1 / 2c+3 in hi), its scales spread over int16 lanes per pair of sub-blocks, its mins as int16.
struct Q4kBlock {
  __m512i lo0, hi0, lo1, hi1, sc02, sc13, sc46, sc57;
  __m256i m16;
};
XP_INLINE Q4kBlock load_q4k_block(const uint8_t* blk) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  uint64_t sc8, m8;
  unpack_scales_k4_words(blk + 4, sc8, m8);
  const __m512i scv = _mm512_broadcastq_epi64(_mm_cvtsi64_si128((long long)sc8));
  const __m512i raw0 = _mm512_loadu_si512(blk + 16), raw1 = _mm512_loadu_si512(blk + 80);
  const __m128i mv = _mm_cvtsi64_si128((long long)m8);
  return {_mm512_and_si512(raw0, m4),
          _mm512_and_si512(_mm512_srli_epi16(raw0, 4), m4),
          _mm512_and_si512(raw1, m4),
          _mm512_and_si512(_mm512_srli_epi16(raw1, 4), m4),
          _mm512_shuffle_epi8(scv, scale_pick(0, 2)),
          _mm512_shuffle_epi8(scv, scale_pick(1, 3)),
          _mm512_shuffle_epi8(scv, scale_pick(4, 6)),
          _mm512_shuffle_epi8(scv, scale_pick(5, 7)),
          _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv))};
}
// The block's activations in its levels' order (one X row): a02, a13, a46, a57.
struct Q4kActs {
  __m512i a02, a13, a46, a57;
};
XP_INLINE Q4kActs load_q4k_acts(const int8_t* a) {
  const __m512i a0 = _mm512_loadu_si512(a), a1 = _mm512_loadu_si512(a + 64), a2 = _mm512_loadu_si512(a + 128),
                a3 = _mm512_loadu_si512(a + 192);
  return {_mm512_shuffle_i64x2(a0, a1, 0x44), _mm512_shuffle_i64x2(a0, a1, 0xEE),
          _mm512_shuffle_i64x2(a2, a3, 0x44), _mm512_shuffle_i64x2(a2, a3, 0xEE)};
}
// sum sc * maddubs(q, a) of the block against one X row, as 8 int32 lanes.
XP_INLINE __m256i q4k_block_sumi(const Q4kBlock& w, const Q4kActs& a) {
  __m512i s0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(w.lo0, a.a02), w.sc02);
  __m512i s1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(w.hi0, a.a13), w.sc13);
  s0 = _mm512_dpwssd_epi32(s0, _mm512_maddubs_epi16(w.lo1, a.a46), w.sc46);
  s1 = _mm512_dpwssd_epi32(s1, _mm512_maddubs_epi16(w.hi1, a.a57), w.sc57);
  const __m512i s01 = _mm512_add_epi32(s0, s1);
  return _mm256_add_epi32(_mm512_castsi512_si256(s01), _mm512_extracti64x4_epi64(s01, 1));
}

// X rows up to which the Q4_K and Q6_K kernels run their decode form over a few rows at once instead of the
// tiles: kFewRowsMax (matmul_kernels.h), from where the panels take the product. Before the Q6_K rows kernel,
// taking 8-15 rows from the panels measured M = 8 35.2 -> 46.8 but M = 12 48.7 -> 32.9 (Q6_K then took the
// tiles); with both: kFewRowsMax's numbers.
constexpr int64_t kRowsMax = kFewRowsMax;

template <int R>
void gemv_q4_k_512(int64_t k, const uint8_t* w, size_t w_row_bytes, const XRows& x, float* y) {
  constexpr size_t kBytes = 144;
  const int8_t* xq = x.qs(0);
  const float* xd = x.d(0);
  const uint8_t* xs = x.sums(0);
  constexpr int G = kGroupRows<R>;
  static_assert(R % G == 0);
  __m128 acc[R / G];
  for (int g = 0; g < R / G; ++g) acc[g] = _mm_setzero_ps();
  const __m128i row_offsets = _mm_mullo_epi32(_mm_setr_epi32(0, 1, 2, 3), _mm_set1_epi32((int)w_row_bytes));
  const int64_t nb = k / 256;
  for (int64_t b = 0; b < nb; ++b) {
    // Shared by the R rows: the activations in the levels' order, the 16 bsums, da.
    const Q4kActs acts = load_q4k_acts(xq + 256 * b);
    const __m256i bsums = load256(xs + 32 * b);
    const __m128 da = _mm_set1_ps(xd[b]);
    __m256i sumi[R], summ[R];
    // Unrolled, the R accumulators stay in registers and a row's loads issue before the previous row's
    // products finish (bench_matmul 2 Q4_K decode, 6 alternating runs: 23.1-25.0 GB/s, median 24.6, vs
    // 19.2-24.4, median 22.8, rolled; Q6_K's loop measured no better unrolled).
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w + r * w_row_bytes + b * kBytes;
      // One tile ahead, to L2 (measured on the MoE experts, `bench_matmul 1 moe`: 2 or 4 tiles ahead, or
      // to L1, were no faster; none was 10-15 % slower).
      prefetch_next_tile<kBytes>(blk + R * w_row_bytes);
      const Q4kBlock wb = load_q4k_block(blk);
      sumi[r] = q4k_block_sumi(wb, acts);
      summ[r] = _mm256_madd_epi16(bsums, wb.m16);
    }
    // The block's integer totals per row, then the shared float steps for G rows at a time: the bits of
    // tile_q45_k and of the panels, whatever the batch.
    for (int g = 0; g < R / G; ++g) {
      __m128 d, dmin;
      load_f16_pairs<G>(w + G * g * w_row_bytes + b * kBytes, row_offsets, d, dmin);
      acc[g] = k_block_step(acc[g], row_totals<G>(sumi + G * g), d, da);
      acc[g] = k_block_step_min(acc[g], row_totals<G>(summ + G * g), dmin, da);
    }
  }
  for (int g = 0; g < R / G; ++g) store_lanes<G>(acc[g], y + G * g);
}

// gemv_q4_k_512<4> for MR X rows at once: each weight block of the 4 rows is loaded and unpacked once for
// the MR rows (the 256-bit tiles that took 2-7 rows cost about a decode step per row on a 2-core Xeon).
// Per X row the same integer totals and float steps as gemv_q4_k_512: the same bits.
template <int MR>
void gemv_q4_k_512_rows(int64_t k, const uint8_t* w, size_t w_row_bytes, const XRows& x, float* y, int64_t ldy) {
  constexpr size_t kBytes = 144;
  constexpr int R = 4;
  __m128 acc[MR];
  for (int c = 0; c < MR; ++c) acc[c] = _mm_setzero_ps();
  const __m128i row_offsets = _mm_mullo_epi32(_mm_setr_epi32(0, 1, 2, 3), _mm_set1_epi32((int)w_row_bytes));
  const int64_t nb = k / 256;
  for (int64_t b = 0; b < nb; ++b) {
    Q4kActs acts[MR];
    __m256i bsums[MR];
    for (int c = 0; c < MR; ++c) {
      acts[c] = load_q4k_acts(x.qs(c) + 256 * b);
      bsums[c] = load256(x.sums(c) + 32 * b);
    }
    __m256i sumi[MR][R], summ[MR][R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w + r * w_row_bytes + b * kBytes;
      prefetch_next_tile<kBytes>(blk + R * w_row_bytes);
      const Q4kBlock wb = load_q4k_block(blk);
#pragma GCC unroll 4
      for (int c = 0; c < MR; ++c) {
        sumi[c][r] = q4k_block_sumi(wb, acts[c]);
        summ[c][r] = _mm256_madd_epi16(bsums[c], wb.m16);
      }
    }
    __m128 d, dmin;
    load_f16_pairs<R>(w + b * kBytes, row_offsets, d, dmin);
    for (int c = 0; c < MR; ++c) {
      const __m128 da = _mm_set1_ps(x.d(c)[b]);
      acc[c] = k_block_step(acc[c], row_totals<R>(sumi[c]), d, da);
      acc[c] = k_block_step_min(acc[c], row_totals<R>(summ[c]), dmin, da);
    }
  }
  for (int c = 0; c < MR; ++c) store_lanes<R>(acc[c], y + c * ldy);
}

// A few X rows (2..kRowsMax): the decode kernel over 2-3 of them at once (Rows<MR>: 4 weight rows x MR X
// rows), the weight rows past a multiple of 4 one at a time (One<1>); 4 X rows as 2 + 2.
using RowsFn = void (*)(int64_t, const uint8_t*, size_t, const XRows&, float*, int64_t);
using OneFn = void (*)(int64_t, const uint8_t*, size_t, const XRows&, float*);
template <RowsFn rows3, RowsFn rows2, OneFn one4, OneFn one1>
void few_rows(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
              const PackedLayout& layout, int64_t n_x, float* y, int64_t ldy) {
  for (int64_t i = 0; i < n_x;) {
    const int64_t left = n_x - i, mr = left == 4 ? 2 : left < 3 ? left : 3;
    const XRows xr{x + i * layout.row_bytes, layout.row_bytes, layout.d_offset, layout.sum_offset};
    float* yi = y + i * ldy;
    int64_t j = 0;
    for (; j + 4 <= n_w; j += 4) {
      const uint8_t* wj = w + j * w_row_bytes;
      if (mr == 3)
        rows3(k, wj, w_row_bytes, xr, yi + j, ldy);
      else if (mr == 2)
        rows2(k, wj, w_row_bytes, xr, yi + j, ldy);
      else
        one4(k, wj, w_row_bytes, xr, yi + j);
    }
    for (; j < n_w; ++j)
      for (int64_t c = 0; c < mr; ++c) {
        const XRows xc{x + (i + c) * layout.row_bytes, layout.row_bytes, layout.d_offset, layout.sum_offset};
        one1(k, w + j * w_row_bytes, w_row_bytes, xc, y + (i + c) * ldy + j);
      }
    i += mr;
  }
}

void q4_k_kernel(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                 const PackedLayout& layout, int64_t n_x, float* y, int64_t ldy) {
  if (n_x >= 2 && n_x <= kRowsMax)
    return few_rows<gemv_q4_k_512_rows<3>, gemv_q4_k_512_rows<2>, gemv_q4_k_512<4>, gemv_q4_k_512<1>>(
        k, w, w_row_bytes, n_w, x, layout, n_x, y, ldy);
  if (n_x != 1) return run_tiles<Q45KTile<false>::T>(k, w, w_row_bytes, n_w, x, layout, n_x, y, ldy);
  const XRows xr{x, layout.row_bytes, layout.d_offset, layout.sum_offset};
  int64_t j = 0;
  for (; j + 8 <= n_w; j += 8) gemv_q4_k_512<8>(k, w + j * w_row_bytes, w_row_bytes, xr, y + j);
  for (; j + 4 <= n_w; j += 4) gemv_q4_k_512<4>(k, w + j * w_row_bytes, w_row_bytes, xr, y + j);
  for (; j < n_w; ++j) gemv_q4_k_512<1>(k, w + j * w_row_bytes, w_row_bytes, xr, y + j);
}

// ---- decode (one X row) of Q6_K weights on 512-bit vectors ------------------------------------------
// 64 bytes of ql are a half-block's two 32-byte runs, so their low nibbles are elements 128h..128h+63 and
// their high nibbles the next 64, in order: the activations need no permutation. The qh byte run is
// broadcast to both 256-bit halves and shifted per half (64-bit variable shifts; the bits that cross bytes
// are masked off). Each int16 product pair belongs to one 16-element scale group: vpermw spreads 4 of the
// 16 signed scales over 8 lanes each. As in the 256-bit kernel: sum sc * q * a - 32 * sum sc_g * bsum_g.
// int16 lane l of the 64 levels of quarter q -> scale 4q + l / 8.
struct Q6kSpread {
  __m512i v[4];
  Q6kSpread() {
    for (int q = 0; q < 4; ++q) {
      alignas(64) int16_t idx[32];
      for (int l = 0; l < 32; ++l) idx[l] = (int16_t)(4 * q + l / 8);
      v[q] = _mm512_load_si512(idx);
    }
  }
};
// One Q6_K block of a weight row ready for the products: its 6-bit levels by quarter (elements 64q..+64),
// each quarter's scales spread over its int16 lanes, and the 16 scales as int16 for the -32 offset.
struct Q6kBlock {
  __m512i q[4], sc[4];
  __m256i sc16;
};
XP_INLINE Q6kBlock load_q6k_block(const uint8_t* blk, const Q6kSpread& spread) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  // High bits of elements 0..31 / 32..63 of a half are qh bits 0-1 / 2-3 (moved to 4-5); of 64..95 /
  // 96..127 bits 4-5 / 6-7.
  const __m512i shl_lo = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4),
                shr_hi = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
  Q6kBlock b;
  b.sc16 = _mm256_cvtepi8_epi16(load128(blk + 192));
  const __m512i sc16z = _mm512_castsi256_si512(b.sc16);
  for (int h = 0; h < 2; ++h) {
    const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
    const __m512i qh = _mm512_broadcast_i64x4(load256(blk + 128 + 32 * h));
    b.q[2 * h] =
        _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi64(qh, shl_lo), m30));
    b.q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                     _mm512_and_si512(_mm512_srlv_epi64(qh, shr_hi), m30));
    b.sc[2 * h] = _mm512_permutexvar_epi16(spread.v[2 * h], sc16z);
    b.sc[2 * h + 1] = _mm512_permutexvar_epi16(spread.v[2 * h + 1], sc16z);
  }
  return b;
}
// The block's 256 activations of one X row, by quarter.
struct Q6kActs {
  __m512i a[4];
};
XP_INLINE Q6kActs load_q6k_acts(const int8_t* a) {
  return {{_mm512_loadu_si512(a), _mm512_loadu_si512(a + 64), _mm512_loadu_si512(a + 128),
           _mm512_loadu_si512(a + 192)}};
}
// sum sc * q * a - 32 * sum sc_g * bsum_g of the block against one X row, as 8 int32 lanes.
XP_INLINE __m256i q6k_block_dot(const Q6kBlock& w, const Q6kActs& a, __m256i bsums) {
  __m512i s0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(w.q[0], a.a[0]), w.sc[0]);
  __m512i s1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(w.q[1], a.a[1]), w.sc[1]);
  s0 = _mm512_dpwssd_epi32(s0, _mm512_maddubs_epi16(w.q[2], a.a[2]), w.sc[2]);
  s1 = _mm512_dpwssd_epi32(s1, _mm512_maddubs_epi16(w.q[3], a.a[3]), w.sc[3]);
  const __m512i s01 = _mm512_add_epi32(s0, s1);
  const __m256i sumi = _mm256_add_epi32(_mm512_castsi512_si256(s01), _mm512_extracti64x4_epi64(s01, 1));
  return _mm256_sub_epi32(sumi, _mm256_slli_epi32(_mm256_madd_epi16(bsums, w.sc16), 5));
}

template <int R>
void gemv_q6_k_512(int64_t k, const uint8_t* w, size_t w_row_bytes, const XRows& x, float* y) {
  constexpr size_t kBytes = 210;
  const int8_t* xq = x.qs(0);
  const float* xd = x.d(0);
  const uint8_t* xs = x.sums(0);
  const Q6kSpread spread;
  constexpr int G = kGroupRows<R>;
  static_assert(R % G == 0);
  __m128 acc[R / G];
  for (int g = 0; g < R / G; ++g) acc[g] = _mm_setzero_ps();
  const __m128i row_offsets = _mm_mullo_epi32(_mm_setr_epi32(0, 1, 2, 3), _mm_set1_epi32((int)w_row_bytes));
  const int64_t nb = k / 256;
  for (int64_t b = 0; b < nb; ++b) {
    const Q6kActs acts = load_q6k_acts(xq + 256 * b);
    const __m256i bsums = load256(xs + 32 * b);
    const __m128 da = _mm_broadcast_ss(xd + b);
    __m256i dot[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w + r * w_row_bytes + b * kBytes;
      prefetch_next_tile<kBytes>(blk + R * w_row_bytes);
      dot[r] = q6k_block_dot(load_q6k_block(blk, spread), acts, bsums);
    }
    // Integer totals, then the shared float step (see gemv_q4_k_512). d is the f16 at byte 208: read as the
    // second half of the 4 bytes at 206 (inside the block).
    for (int g = 0; g < R / G; ++g) {
      __m128 unused, d;
      load_f16_pairs<G>(w + G * g * w_row_bytes + b * kBytes + 206, row_offsets, unused, d);
      acc[g] = k_block_step(acc[g], row_totals<G>(dot + G * g), d, da);
    }
  }
  for (int g = 0; g < R / G; ++g) store_lanes<G>(acc[g], y + G * g);
}

// gemv_q6_k_512<4> for MR X rows at once (as gemv_q4_k_512_rows): the same bits per X row. 2-core Xeon, the
// default model (its Q6_K tensors), tiles -> rows, interleaved: pp2 40.4-40.7 -> 45.0-46.2 t/s, pp4
// 53.3-53.9 -> 55.7-57.4, pp7 64.3-67.8 -> 69.2, `--parallel 4 -p 64 -n 32` S_TG 43.6-44.8 -> 50.1-51.3
// (2026-12-04).
template <int MR>
void gemv_q6_k_512_rows(int64_t k, const uint8_t* w, size_t w_row_bytes, const XRows& x, float* y,
                        int64_t ldy) {
  constexpr size_t kBytes = 210;
  constexpr int R = 4;
  const Q6kSpread spread;
  __m128 acc[MR];
  for (int c = 0; c < MR; ++c) acc[c] = _mm_setzero_ps();
  const __m128i row_offsets = _mm_mullo_epi32(_mm_setr_epi32(0, 1, 2, 3), _mm_set1_epi32((int)w_row_bytes));
  const int64_t nb = k / 256;
  for (int64_t b = 0; b < nb; ++b) {
    Q6kActs acts[MR];
    __m256i bsums[MR];
    for (int c = 0; c < MR; ++c) {
      acts[c] = load_q6k_acts(x.qs(c) + 256 * b);
      bsums[c] = load256(x.sums(c) + 32 * b);
    }
    __m256i dot[MR][R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w + r * w_row_bytes + b * kBytes;
      prefetch_next_tile<kBytes>(blk + R * w_row_bytes);
      const Q6kBlock wb = load_q6k_block(blk, spread);
#pragma GCC unroll 4
      for (int c = 0; c < MR; ++c) dot[c][r] = q6k_block_dot(wb, acts[c], bsums[c]);
    }
    __m128 unused, d;
    load_f16_pairs<R>(w + b * kBytes + 206, row_offsets, unused, d);
    for (int c = 0; c < MR; ++c)
      acc[c] = k_block_step(acc[c], row_totals<R>(dot[c]), d, _mm_set1_ps(x.d(c)[b]));
  }
  for (int c = 0; c < MR; ++c) store_lanes<R>(acc[c], y + c * ldy);
}

void q6_k_kernel(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                 const PackedLayout& layout, int64_t n_x, float* y, int64_t ldy) {
  if (n_x >= 2 && n_x <= kRowsMax)
    return few_rows<gemv_q6_k_512_rows<3>, gemv_q6_k_512_rows<2>, gemv_q6_k_512<4>, gemv_q6_k_512<1>>(
        k, w, w_row_bytes, n_w, x, layout, n_x, y, ldy);
  if (n_x != 1) return run_tiles<Q6KTile>(k, w, w_row_bytes, n_w, x, layout, n_x, y, ldy);
  const XRows xr{x, layout.row_bytes, layout.d_offset, layout.sum_offset};
  int64_t j = 0;
  for (; j + 8 <= n_w; j += 8) gemv_q6_k_512<8>(k, w + j * w_row_bytes, w_row_bytes, xr, y + j);
  for (; j + 4 <= n_w; j += 4) gemv_q6_k_512<4>(k, w + j * w_row_bytes, w_row_bytes, xr, y + j);
  for (; j < n_w; ++j) gemv_q6_k_512<1>(k, w + j * w_row_bytes, w_row_bytes, xr, y + j);
}

void q4_0_kernel(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                 const PackedLayout& layout, int64_t n_x, float* y, int64_t ldy) {
  run_q8_0_family_512<Q4_0W512>(k, w, w_row_bytes, n_w, x, layout, n_x, y, ldy,
                                run_tiles<Q8_0FamilyTile<Q4_0W>::T>);
}
void q5_0_kernel(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                 const PackedLayout& layout, int64_t n_x, float* y, int64_t ldy) {
  run_q8_0_family_512<Q5_0W512>(k, w, w_row_bytes, n_w, x, layout, n_x, y, ldy,
                                run_tiles<Q8_0FamilyTile<Q5_0W>::T>);
}
void q8_0_kernel(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                 const PackedLayout& layout, int64_t n_x, float* y, int64_t ldy) {
  run_q8_0_family_512<Q8_0W512>(k, w, w_row_bytes, n_w, x, layout, n_x, y, ldy,
                                run_tiles<Q8_0FamilyTile<Q8_0W>::T>);
}

}  // namespace

const MatmulKernels& matmul_kernels_avx512() {
  static const MatmulKernels kernels = [] {
    MatmulKernels t = matmul_kernels_avx512_vl();
    t.q4_0 = q4_0_kernel;
    t.q5_0 = q5_0_kernel;
    t.q8_0 = q8_0_kernel;
    t.q4_k = q4_k_kernel;
    t.q6_k = q6_k_kernel;
    return t;
  }();
  return kernels;
}

}  // namespace xpert::cpu
