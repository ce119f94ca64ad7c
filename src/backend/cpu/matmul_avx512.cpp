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

// R weight rows x one X row, all of k. y[r] = dot(row r, x).
template <class W, int R>
void gemv_q8_0_family_512(int64_t k, const uint8_t* w, size_t w_row_bytes, const XRows& x, float* y) {
  const __m512i pick01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const int8_t* xq = x.qs(0);
  const float* xd = x.d(0);
  const int32_t* xs = reinterpret_cast<const int32_t*>(x.sums(0));
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
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
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w + r * w_row_bytes + b * W::kBytes;
      _mm_prefetch(reinterpret_cast<const char*>(blk) + R * w_row_bytes, _MM_HINT_T1);  // next tile's row r
      const __m512i p = _mm512_dpbusd_epi32(start, W::load2(blk, two), a);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(load_scales2<W>(blk, two), da), acc[r]);
    }
  };
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) step(b, true);
  if (b < nb) step(b, false);
  if constexpr (R == 4) {
    // Four horizontal sums at once: fold 512 -> 256, then two hadd levels and the 128-bit halves.
    __m256 h[4];
    for (int r = 0; r < 4; ++r)
      h[r] = _mm256_add_ps(_mm512_castps512_ps256(acc[r]), _mm512_extractf32x8_ps(acc[r], 1));
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
    _mm_storeu_ps(y, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
  } else {
    for (int r = 0; r < R; ++r) y[r] = _mm512_reduce_add_ps(acc[r]);
  }
}

template <class W>
void run_q8_0_family_512(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                         const PackedLayout& layout, int64_t n_x, float* y, int64_t ldy,
                         TileKernel fallback) {
  if (n_x != 1) return fallback(k, w, w_row_bytes, n_w, x, layout, n_x, y, ldy);
  const XRows xr{x, layout.row_bytes, layout.d_offset, layout.sum_offset};
  int64_t j = 0;
  for (; j + 4 <= n_w; j += 4) gemv_q8_0_family_512<W, 4>(k, w + j * w_row_bytes, w_row_bytes, xr, y + j);
  for (; j < n_w; ++j) gemv_q8_0_family_512<W, 1>(k, w + j * w_row_bytes, w_row_bytes, xr, y + j);
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
    return t;
  }();
  return kernels;
}

}  // namespace xpert::cpu
