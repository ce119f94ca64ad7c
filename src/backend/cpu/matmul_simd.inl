// SIMD matmul kernels, written once on 256-bit vectors and compiled twice: by matmul_avx2.cpp (AVX2+FMA)
// and by matmul_avx512.cpp (adds AVX-512VL/BW + VNNI: dpbusd/dpwssd and mask moves, 32 registers).
// Include only from those two files. Everything here has internal linkage and uses no standard-library
// templates, so no function built with wider -m flags can be merged into (and SIGILL) baseline code.
//
// A tile is NR weight rows x MR packed X rows: each weight block is loaded and unpacked once, then
// multiplied with MR activation blocks; each activation block is shared by the NR weight rows.
// Integer dot products per block are exactly llama.cpp's; only the float accumulation order differs.
// The quantized types follow one float order per output element, shared by every kernel of every ISA from
// AVX2 on (the 512-bit decode kernels, these tiles, the VNNI panels, the AMX tiles), so a row's bits do not
// depend on how many rows are computed with it (batch invariance). Per block, first the exact integer totals,
// then one float step per block, block after block, from acc = +0; acc is the result (no float lanes, no
// horizontal float sum):
//   Q4_0 / Q5_0 / Q8_0 (32-blocks): isum = dot(q, a);  acc = fma(float(isum), d * da, acc)
//   Q4_K / Q5_K (256-blocks): isum = sum sc * dot(q, a), msum = sum m * sum(a) per sub-block;
//       acc = fma(float(isum), d * da, acc);  acc = fma(-float(msum), dmin * da, acc)
//   Q6_K: isum = sum sc * dot(q - 32, a);  acc = fma(float(isum), d * da, acc)
// The integer totals of several rows are summed across lanes together (row_totals), then the float step
// runs with one row per lane.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"

#ifndef XP_SIMD_TABLE_NAME
#error "define XP_SIMD_TABLE_NAME before including matmul_simd.inl"
#endif

namespace xpert::cpu {
namespace {

#define XP_INLINE inline __attribute__((always_inline))

XP_INLINE float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

XP_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

XP_INLINE __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// acc + sum of u8 x s8 products in groups of 4 (int32 lanes). The AVX2 form goes through int16 pair sums,
// which cannot saturate for u <= 127 and |s| <= 127 ... up to 2 * 127 * 127 < 32767.
XP_INLINE __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// acc + sum of int16 x int16 products in pairs (int32 lanes).
XP_INLINE __m256i dot_i16(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__)
  return _mm256_dpwssd_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

// 16 packed nibbles -> 32 bytes: low nibbles (elements 0..15) then high nibbles (16..31).
XP_INLINE __m256i unpack_nibbles_32(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// 32 bits -> 32 bytes holding 0x10 where the bit is set.
XP_INLINE __m256i bits_to_0x10(uint32_t bits) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  return _mm256_maskz_mov_epi8((__mmask32)bits, _mm256_set1_epi8(0x10));
#else
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32((int)bits),
      _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i select = _mm256_set1_epi64x(0x8040201008040201);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
#endif
}

struct XRows {
  const uint8_t* base;
  size_t stride;
  size_t d_offset, sum_offset;
  XP_INLINE const int8_t* qs(int c) const { return reinterpret_cast<const int8_t*>(base + c * stride); }
  XP_INLINE const float* d(int c) const { return reinterpret_cast<const float*>(base + c * stride + d_offset); }
  XP_INLINE const uint8_t* sums(int c) const { return base + c * stride + sum_offset; }
  XP_INLINE const float* f(int c) const { return reinterpret_cast<const float*>(base + c * stride); }
};

// Lane r = the sum of v[r]'s 8 int32 lanes, r < NR <= 4 (lanes past NR: 0). Integer sums: exact in any order.
template <int NR>
XP_INLINE __m128i row_totals(const __m256i* v) {
  static_assert(NR >= 1 && NR <= 4);
  const __m256i z = _mm256_setzero_si256();
  __m256i v1 = z, v2 = z, v3 = z;
  if constexpr (NR > 1) v1 = v[1];
  if constexpr (NR > 2) v2 = v[2];
  if constexpr (NR > 3) v3 = v[3];
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v1), _mm256_hadd_epi32(v2, v3));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// Lanes r < NR of v to y[0..NR-1].
template <int NR>
XP_INLINE void store_lanes(__m128 v, float* y) {
  if constexpr (NR == 4) {
    _mm_storeu_ps(y, v);
  } else {
    alignas(16) float t[4];
    _mm_store_ps(t, v);
    for (int r = 0; r < NR; ++r) y[r] = t[r];
  }
}

// The K-quant float step of one 256-block for NR rows (lanes): acc = fma(isum, d * da, acc), then
// acc = fma(-msum, dmin * da, acc) (see the top of the file).
XP_INLINE __m128 k_block_step(__m128 acc, __m128i isum, __m128 d, __m128 da) {
  return _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(d, da), acc);
}
XP_INLINE __m128 k_block_step_min(__m128 acc, __m128i msum, __m128 dmin, __m128 da) {
  return _mm_fnmadd_ps(_mm_cvtepi32_ps(msum), _mm_mul_ps(dmin, da), acc);
}

template <int NR, int MR>
XP_INLINE void store_tile(__m256 (&acc)[NR][MR], float* y, int64_t ldy) {
  for (int c = 0; c < MR; ++c)
    for (int r = 0; r < NR; ++r) y[c * ldy + r] = hsum(acc[r][c]);
}

// ---- Q4_0 / Q5_0 / Q8_0 weights x Q8_0 activations ---------------------------------------------------
// Weights are made unsigned (q + offset) for u8 x s8 products; sum((q + o) * a) - o * sum(a) is the signed
// dot product, and -o * sum(a) is spread over the 8 int32 lanes of a block as the accumulator's start
// (the packed X keeps -sum(a) per block for this).

struct Q4_0W {
  static constexpr size_t kBytes = 18;
  static constexpr int kLaneShift = 0;  // offset 8 = 8 lanes x 1
  static XP_INLINE __m256i load(const uint8_t* b) { return unpack_nibbles_32(b + 2); }
};

struct Q5_0W {
  static constexpr size_t kBytes = 22;
  static constexpr int kLaneShift = 1;  // offset 16 = 8 lanes x 2
  static XP_INLINE __m256i load(const uint8_t* b) {
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    return _mm256_or_si256(unpack_nibbles_32(b + 6), bits_to_0x10(qh));
  }
};

struct Q8_0W {
  static constexpr size_t kBytes = 34;
#if defined(__AVX512VNNI__)
  static constexpr int kLaneShift = 4;  // q ^ 0x80 = q + 128; offset 128 = 8 lanes x 16
  static XP_INLINE __m256i load(const uint8_t* b) { return _mm256_xor_si256(load256(b + 2), _mm256_set1_epi8(-128)); }
#else
  static constexpr int kLaneShift = -1;  // signed weights: |w| x sign(a, w) instead (no offset)
  static XP_INLINE __m256i load(const uint8_t* b) { return load256(b + 2); }
#endif
};

template <class W>
XP_INLINE __m256i block_dot_q8_0(__m256i w, __m256i a, __m256i start) {
#if !defined(__AVX512VNNI__)
  if constexpr (W::kLaneShift < 0) {
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
  }
#endif
  return dot_u8s8(start, w, a);
}

template <class W, int NR, int MR>
void tile_q8_0_family(int64_t k, const uint8_t* w, size_t w_row_bytes, const XRows& x, float* y, int64_t ldy) {
  static_assert(NR <= 4, "one float lane per weight row");
  __m128 acc[MR];  // lane r: weight row r
  for (int c = 0; c < MR; ++c) acc[c] = _mm_setzero_ps();
  const int64_t nb = k / 32;
  for (int64_t b = 0; b < nb; ++b) {
    __m256i wq[NR];
    alignas(16) float dr[4] = {};
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * w_row_bytes + b * W::kBytes;
      wq[r] = W::load(blk);
      dr[r] = load_f16(blk);
    }
    const __m128 wd = _mm_load_ps(dr);
    for (int c = 0; c < MR; ++c) {
      const __m256i a = load256(x.qs(c) + 32 * b);
      // -offset * sum(a) spread over 8 lanes: -sum(a) << shift in each lane.
      __m256i start = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x.sums(c) + 4 * b));
      if constexpr (W::kLaneShift > 0) start = _mm256_slli_epi32(start, W::kLaneShift);
      __m256i p[NR];
      for (int r = 0; r < NR; ++r) p[r] = block_dot_q8_0<W>(wq[r], a, start);
      acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(row_totals<NR>(p)), _mm_mul_ps(wd, _mm_broadcast_ss(x.d(c) + b)), acc[c]);
    }
  }
  for (int c = 0; c < MR; ++c) store_lanes<NR>(acc[c], y + c * ldy);
}

// ---- Q4_K / Q5_K weights x Q8_K activations -----------------------------------------------------------
// Per 256-block: sum over 8 sub-blocks of sc[s] * dot(q, a) (int32), minus sum of m[s] * (bsums pair).

XP_INLINE void unpack_scales_k4(const uint8_t* s, uint8_t* sc, uint8_t* m) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    m[j] = s[j + 4] & 63;
    sc[j + 4] = (uint8_t)((s[j + 8] & 0xF) | ((s[j] >> 6) << 4));
    m[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
  }
}

// Decode (one X row) streams each weight row once; the hardware prefetchers alone leave it far below
// the memory bandwidth with few threads (see the 512-bit Q8_0 kernels). So each block step also asks for
// the same block of the next tile's rows (NR rows further), to L2.
template <size_t Bytes>
XP_INLINE void prefetch_next_tile(const uint8_t* p) {
  for (size_t off = 0; off < Bytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + off, _MM_HINT_T1);
}

template <bool kFiveBit, int NR, int MR>
void tile_q45_k(int64_t k, const uint8_t* w, size_t w_row_bytes, const XRows& x, float* y, int64_t ldy) {
  static_assert(NR <= 4, "one float lane per weight row");
  constexpr size_t kBytes = kFiveBit ? 176 : 144;
  constexpr size_t kQsOffset = kFiveBit ? 48 : 16;
  __m128 acc[MR];  // lane r: weight row r
  for (int c = 0; c < MR; ++c) acc[c] = _mm_setzero_ps();
  const int64_t nb = k / 256;
  for (int64_t b = 0; b < nb; ++b) {
    // Per row: the block's scales (int16 pairs per sub-block), its mins spread to match the 16 bsums
    // (each min covers two of them), d and dmin (lane r). The levels are unpacked one 64-element chunk at a
    // time inside the product loop, so the hot loop's registers are the NR x MR integer sums, one chunk of
    // levels per row and one activation vector (a whole block of levels per row would spill).
    const uint8_t* blk[NR];
    uint8_t sc[NR][8];
    __m256i mins[NR];
    alignas(16) float dr[4] = {}, dminr[4] = {};
    for (int r = 0; r < NR; ++r) {
      blk[r] = w + r * w_row_bytes + b * kBytes;
      if constexpr (MR == 1) prefetch_next_tile<kBytes>(blk[r] + NR * w_row_bytes);
      dr[r] = load_f16(blk[r]);
      dminr[r] = load_f16(blk[r] + 2);
      uint8_t m[8];
      unpack_scales_k4(blk[r] + 4, sc[r], m);
      uint64_t m8;
      std::memcpy(&m8, m, 8);
      const __m128i mv = _mm_cvtsi64_si128((long long)m8);
      mins[r] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
    }
    const __m128 d = _mm_load_ps(dr), dmin = _mm_load_ps(dminr);
    __m256i sumi[MR][NR];
    for (int c = 0; c < MR; ++c)
      for (int r = 0; r < NR; ++r) sumi[c][r] = _mm256_setzero_si256();
    for (int ch = 0; ch < 4; ++ch) {
      __m256i q[NR][2];  // sub-blocks 2ch (low nibbles) and 2ch+1 (high nibbles)
      for (int r = 0; r < NR; ++r) {
        const __m256i raw = load256(blk[r] + kQsOffset + 32 * ch);
        q[r][0] = _mm256_and_si256(raw, _mm256_set1_epi8(0x0F));
        q[r][1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0F));
        if constexpr (kFiveBit) {
          // bit s of qh[l] is bit 4 of element 32s + l
          const __m256i qh = load256(blk[r] + 16);
          const int s0 = 2 * ch, s1 = 2 * ch + 1;
          const __m256i h0 = s0 <= 4 ? _mm256_slli_epi16(qh, 4 - s0) : _mm256_srli_epi16(qh, s0 - 4);
          const __m256i h1 = s1 <= 4 ? _mm256_slli_epi16(qh, 4 - s1) : _mm256_srli_epi16(qh, s1 - 4);
          q[r][0] = _mm256_or_si256(q[r][0], _mm256_and_si256(h0, _mm256_set1_epi8(0x10)));
          q[r][1] = _mm256_or_si256(q[r][1], _mm256_and_si256(h1, _mm256_set1_epi8(0x10)));
        }
      }
      for (int half = 0; half < 2; ++half) {
        const int sub = 2 * ch + half;
        __m256i scale[NR];
        for (int r = 0; r < NR; ++r) scale[r] = _mm256_set1_epi16(sc[r][sub]);
        for (int c = 0; c < MR; ++c) {
          const __m256i av = load256(x.qs(c) + 256 * b + 32 * sub);
          for (int r = 0; r < NR; ++r)
            sumi[c][r] = dot_i16(sumi[c][r], _mm256_maddubs_epi16(q[r][half], av), scale[r]);
        }
      }
    }
    for (int c = 0; c < MR; ++c) {
      const __m256i bsums = load256(x.sums(c) + 32 * b);
      __m256i summ[NR];
      for (int r = 0; r < NR; ++r) summ[r] = _mm256_madd_epi16(bsums, mins[r]);
      const __m128 da = _mm_broadcast_ss(x.d(c) + b);
      acc[c] = k_block_step(acc[c], row_totals<NR>(sumi[c]), d, da);
      acc[c] = k_block_step_min(acc[c], row_totals<NR>(summ), dmin, da);
    }
  }
  for (int c = 0; c < MR; ++c) store_lanes<NR>(acc[c], y + c * ldy);
}

// ---- Q6_K weights x Q8_K activations ------------------------------------------------------------------
// Levels 0..63 with offset 32: sum(sc * (q - 32) * a) = sum(sc * q * a) - 32 * sum(sc_g * bsum_g).

template <int NR, int MR>
void tile_q6_k(int64_t k, const uint8_t* w, size_t w_row_bytes, const XRows& x, float* y, int64_t ldy) {
  static_assert(NR <= 4, "one float lane per weight row");
  __m128 acc[MR];  // lane r: weight row r
  for (int c = 0; c < MR; ++c) acc[c] = _mm_setzero_ps();
  const int64_t nb = k / 256;
  for (int64_t b = 0; b < nb; ++b) {
    // q[r][g]: 32 levels of elements 32g..32g+31; scale[r][g]: (sc[2g] x8, sc[2g+1] x8) as int16.
    __m256i q[NR][8], scale[NR][8], scale_all[NR];
    alignas(16) float dr[4] = {};
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * w_row_bytes + b * 210;
      if constexpr (MR == 1) prefetch_next_tile<210>(blk + NR * w_row_bytes);
      dr[r] = load_f16(blk + 208);
      const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
      scale_all[r] = _mm256_cvtepi8_epi16(sc8);
      for (int g = 0; g < 8; ++g) {
        const __m128i pick = _mm_setr_epi8((char)(2 * g), (char)(2 * g), (char)(2 * g), (char)(2 * g),
                                           (char)(2 * g), (char)(2 * g), (char)(2 * g), (char)(2 * g),
                                           (char)(2 * g + 1), (char)(2 * g + 1), (char)(2 * g + 1),
                                           (char)(2 * g + 1), (char)(2 * g + 1), (char)(2 * g + 1),
                                           (char)(2 * g + 1), (char)(2 * g + 1));
        scale[r][g] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
      }
      for (int half = 0; half < 2; ++half) {
        const __m256i ql0 = load256(blk + 64 * half);
        const __m256i ql1 = load256(blk + 64 * half + 32);
        const __m256i qh = load256(blk + 128 + 32 * half);
        const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
        const __m256i lo[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                               _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
        const __m256i hi[4] = {_mm256_and_si256(_mm256_slli_epi16(qh, 4), m30),
                               _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30), _mm256_and_si256(qh, m30),
                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)};
        for (int g = 0; g < 4; ++g) q[r][4 * half + g] = _mm256_or_si256(lo[g], hi[g]);
      }
    }
    const __m128 d = _mm_load_ps(dr);
    for (int c = 0; c < MR; ++c) {
      const int8_t* a = x.qs(c) + 256 * b;
      const __m256i bsums = load256(x.sums(c) + 32 * b);
      __m256i sumi[NR];
      for (int r = 0; r < NR; ++r) sumi[r] = _mm256_setzero_si256();
      for (int g = 0; g < 8; ++g) {
        const __m256i av = load256(a + 32 * g);
        for (int r = 0; r < NR; ++r) sumi[r] = dot_i16(sumi[r], _mm256_maddubs_epi16(q[r][g], av), scale[r][g]);
      }
      for (int r = 0; r < NR; ++r)
        sumi[r] = _mm256_sub_epi32(sumi[r], _mm256_slli_epi32(_mm256_madd_epi16(bsums, scale_all[r]), 5));
      acc[c] = k_block_step(acc[c], row_totals<NR>(sumi), d, _mm_broadcast_ss(x.d(c) + b));
    }
  }
  for (int c = 0; c < MR; ++c) store_lanes<NR>(acc[c], y + c * ldy);
}

// ---- F32 / F16 / BF16 weights x f32 activations ------------------------------------------------------

struct F32W {
  static constexpr size_t kElemBytes = 4;
  static XP_INLINE __m256 load8(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static XP_INLINE float load1(const uint8_t* p) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
};
struct F16W {
  static constexpr size_t kElemBytes = 2;
  static XP_INLINE __m256 load8(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static XP_INLINE float load1(const uint8_t* p) { return load_f16(p); }
};
struct BF16W {
  static constexpr size_t kElemBytes = 2;
  static XP_INLINE __m256 load8(const uint8_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static XP_INLINE float load1(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    const uint32_t u = (uint32_t)h << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return v;
  }
};

template <class W, int NR, int MR>
void tile_float(int64_t k, const uint8_t* w, size_t w_row_bytes, const XRows& x, float* y, int64_t ldy) {
  __m256 acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < MR; ++c) acc[r][c] = _mm256_setzero_ps();
  const int64_t k16 = k / 16 * 16;
  for (int64_t l = 0; l < k16; l += 16) {
    __m256 w0[NR], w1[NR];
    for (int r = 0; r < NR; ++r) {
      const uint8_t* p = w + r * w_row_bytes + l * W::kElemBytes;
      w0[r] = W::load8(p);
      w1[r] = W::load8(p + 8 * W::kElemBytes);
    }
    for (int c = 0; c < MR; ++c) {
      const __m256 x0 = _mm256_loadu_ps(x.f(c) + l), x1 = _mm256_loadu_ps(x.f(c) + l + 8);
      for (int r = 0; r < NR; ++r) acc[r][c] = _mm256_fmadd_ps(w1[r], x1, _mm256_fmadd_ps(w0[r], x0, acc[r][c]));
    }
  }
  for (int c = 0; c < MR; ++c) {
    for (int r = 0; r < NR; ++r) {
      float sum = hsum(acc[r][c]);
      for (int64_t l = k16; l < k; ++l) sum += W::load1(w + r * w_row_bytes + l * W::kElemBytes) * x.f(c)[l];
      y[c * ldy + r] = sum;
    }
  }
}

// ---- kernel entry: walk the (n_w x n_x) block in tiles -----------------------------------------------

template <template <int, int> class Tile>
void run_tiles(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
               const PackedLayout& layout, int64_t n_x, float* y, int64_t ldy) {
  const XRows xr0{x, layout.row_bytes, layout.d_offset, layout.sum_offset};
  if (n_x == 1) {
    // Decode: 4 weight rows per pass give independent accumulation chains.
    int64_t j = 0;
    for (; j + 4 <= n_w; j += 4) Tile<4, 1>::run(k, w + j * w_row_bytes, w_row_bytes, xr0, y + j, ldy);
    for (; j < n_w; ++j) Tile<1, 1>::run(k, w + j * w_row_bytes, w_row_bytes, xr0, y + j, ldy);
    return;
  }
  auto row_pass = [&]<int NR>(int64_t j) {
    int64_t i = 0;
    for (; i + 4 <= n_x; i += 4) {
      const XRows xr{x + i * layout.row_bytes, layout.row_bytes, layout.d_offset, layout.sum_offset};
      Tile<NR, 4>::run(k, w + j * w_row_bytes, w_row_bytes, xr, y + i * ldy + j, ldy);
    }
    const XRows xr{x + i * layout.row_bytes, layout.row_bytes, layout.d_offset, layout.sum_offset};
    switch (n_x - i) {
      case 3: Tile<NR, 3>::run(k, w + j * w_row_bytes, w_row_bytes, xr, y + i * ldy + j, ldy); break;
      case 2: Tile<NR, 2>::run(k, w + j * w_row_bytes, w_row_bytes, xr, y + i * ldy + j, ldy); break;
      case 1: Tile<NR, 1>::run(k, w + j * w_row_bytes, w_row_bytes, xr, y + i * ldy + j, ldy); break;
      default: break;
    }
  };
  int64_t j = 0;
#if defined(__AVX512F__)
  // 32 vector registers hold a 4 x 4 tile of accumulators with the unpacked weights beside them.
  for (; j + 4 <= n_w; j += 4) row_pass.template operator()<4>(j);
#endif
  for (; j + 2 <= n_w; j += 2) row_pass.template operator()<2>(j);
  if (j < n_w) row_pass.template operator()<1>(j);
}

template <class W>
struct Q8_0FamilyTile {
  template <int NR, int MR>
  struct T {
    static void run(int64_t k, const uint8_t* w, size_t s, const XRows& x, float* y, int64_t ldy) {
      tile_q8_0_family<W, NR, MR>(k, w, s, x, y, ldy);
    }
  };
};
template <bool kFiveBit>
struct Q45KTile {
  template <int NR, int MR>
  struct T {
    static void run(int64_t k, const uint8_t* w, size_t s, const XRows& x, float* y, int64_t ldy) {
      tile_q45_k<kFiveBit, NR, MR>(k, w, s, x, y, ldy);
    }
  };
};
template <int NR, int MR>
struct Q6KTile {
  static void run(int64_t k, const uint8_t* w, size_t s, const XRows& x, float* y, int64_t ldy) {
    tile_q6_k<NR, MR>(k, w, s, x, y, ldy);
  }
};
template <class W>
struct FloatTile {
  template <int NR, int MR>
  struct T {
    static void run(int64_t k, const uint8_t* w, size_t s, const XRows& x, float* y, int64_t ldy) {
      tile_float<W, NR, MR>(k, w, s, x, y, ldy);
    }
  };
};

}  // namespace

const MatmulKernels& XP_SIMD_TABLE_NAME() {
  static const MatmulKernels kernels = {
      XP_SIMD_ISA_LABEL,
      run_tiles<FloatTile<F32W>::T>,
      run_tiles<FloatTile<F16W>::T>,
      run_tiles<FloatTile<BF16W>::T>,
      run_tiles<Q8_0FamilyTile<Q4_0W>::T>,
      run_tiles<Q8_0FamilyTile<Q5_0W>::T>,
      run_tiles<Q8_0FamilyTile<Q8_0W>::T>,
      run_tiles<Q45KTile<false>::T>,
      run_tiles<Q45KTile<true>::T>,
      run_tiles<Q6KTile>,
  };
  return kernels;
}

}  // namespace xpert::cpu
