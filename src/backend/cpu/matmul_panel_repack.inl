// The weight repacking shared by the AVX-512 VNNI panels (matmul_panel_avx512.cpp) and the AMX tiles
// (matmul_amx.cpp): 16 weight rows per panel, group g (64 bytes) = levels 4g..4g+3 of each row, which is
// also a tdpbssd B tile's layout, and each block's per-row scales as f32 beside the levels. The two
// kernels differ only in how levels are stored (VNNI unsigned, AMX signed): the Q8_0 family passes its
// level reader, Q6_K its offset.
//
// Include it inside the anonymous namespace of those two files, after <immintrin.h>, <cstring> and the
// XP_INLINE definition: everything here then has internal linkage, and nothing built with AVX-512 flags
// can be merged into baseline code (see matmul_simd.inl).

XP_INLINE float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

XP_INLINE __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 16 nibbles -> 32 levels: low nibbles (elements 0..15), then high nibbles (16..31).
XP_INLINE __m256i nibbles_32(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Row r's levels (n_groups words of 4 bytes) into the panel: word g goes to group (B row) g, lane (column) r.
XP_INLINE void scatter_levels(const uint8_t* levels, int n_groups, uint8_t* groups, int r) {
  for (int g = 0; g < n_groups; ++g) std::memcpy(groups + 64 * g + 4 * r, levels + 4 * g, 4);
}

// ---- Q4_0 / Q5_0 / Q8_0: panel block = 8 groups (512 B) + 16 f32 scales (64 B) ------------------------

constexpr size_t kQ8BlockBytes = 8 * 64 + 64;

// W::levels(block) gives the block's 32 levels as the kernel stores them.
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

// ---- Q4_K / Q5_K: panel block = 64 groups (4096 B) + sc [8][16] int32 + (m, m) [8][16] int16 pairs
//      + d [16] f32 + dmin [16] f32 ----------------------------------------------------------------------
// ---- Q6_K: panel block = 64 groups (4096 B) + sc [16][16] int32 + d [16] f32 ----------------------------
// The kernels sum each block to exact integers (isum, msum) and then take the float steps every K-quant
// kernel shares (matmul_simd.inl), so the scales stay integers here and d, dmin stay apart.

constexpr size_t kKScOffset = 4096, kKMinOffset = 4096 + 512, kKDOffset = 4096 + 1024, kKDminOffset = 4096 + 1088;
constexpr size_t kKBlockBytes = 4096 + 1024 + 128;
constexpr size_t kQ6KScOffset = 4096, kQ6KDOffset = 4096 + 1024;
constexpr size_t kQ6KBlockBytes = 4096 + 1024 + 64;
static_assert(kKBlockBytes <= panel_scratch_bytes(256) - 64 && kQ6KBlockBytes <= panel_scratch_bytes(256) - 64);

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

// Levels 0..15 (0..31) are non-negative: as u8 and as s8 they are the same numbers.
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
      std::memcpy(pb + kKDOffset + 4 * r, &d, 4);
      std::memcpy(pb + kKDminOffset + 4 * r, &dmin, 4);
      for (int s = 0; s < 8; ++s) {
        uint8_t sc, m;
        scale_min_k4(s, blk + 4, &sc, &m);
        const int32_t sc32 = sc, m_pair = (int32_t)m | (int32_t)m << 16;
        std::memcpy(pb + kKScOffset + 64 * s + 4 * r, &sc32, 4);
        std::memcpy(pb + kKMinOffset + 64 * s + 4 * r, &m_pair, 4);
      }
    }
  }
}

template <int kOffset>
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
        // from bits 2g of qh[l]; stored as level - kOffset.
        const __m256i ql0 = load256(blk + 64 * half), ql1 = load256(blk + 64 * half + 32);
        const __m256i qh = load256(blk + 128 + 32 * half);
        const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), off = _mm256_set1_epi8(kOffset);
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
      std::memcpy(pb + kQ6KDOffset + 4 * r, &d, 4);
      for (int s = 0; s < 16; ++s) {
        const int32_t sc32 = (int8_t)blk[192 + s];
        std::memcpy(pb + kQ6KScOffset + 64 * s + 4 * r, &sc32, 4);
      }
    }
  }
}
