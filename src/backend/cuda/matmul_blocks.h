// Device-side readers of the GGUF block formats (included by .cu files only). Two views per type:
//   Dot<T>:  the decode view. A row is cut into "chunks" of about 16 weight bytes; dot<M>() multiplies
//            one chunk with up to M activation rows (q8_1 int8 with dp4a, or f16/bf16/f32) and adds to
//            acc[]. Weights are read straight from global memory (no shared-memory round trip).
//   Deq<T>:  the dequantizing view. load() fetches the raw bytes of 32 consecutive elements (group g of
//            a row), dequant() turns them into 32 floats (prefill tiles, embedding rows).
// Blocks of 18, 22 and 34 bytes are only 2-byte aligned; ld_u128_a2 reads 16 bytes from such an address
// with aligned 4-byte loads and funnel shifts. Q6_K's 210-byte blocks are stored field by field on the
// device instead (weight_layout.h): a reader takes a row through row_at<T>, not a pointer into the file's
// blocks.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/launch.cuh"
#include "quant/blocks.h"
#include "quant/dtype.h"

namespace xpert::cuda::dev {

using quant::kQK;
using quant::kQKK;

// ---------------------------------------------------------------------------------------------- loads
__device__ __forceinline__ uint32_t ld_u32(const void* p) {
  return __ldg(static_cast<const unsigned int*>(p));
}
__device__ __forceinline__ uint32_t ld_u16(const void* p) {
  return __ldg(static_cast<const unsigned short*>(p));
}
__device__ __forceinline__ int ld_s8(const void* p) { return __ldg(static_cast<const signed char*>(p)); }
__device__ __forceinline__ uint4 ld_u128(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

// 16 bytes at a 2-byte aligned address.
__device__ __forceinline__ uint4 ld_u128_a2(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const unsigned int* w = reinterpret_cast<const unsigned int*>(a & ~uintptr_t(3));
  const uint32_t sh = (uint32_t)(a & 2) * 8;  // 0 or 16
  const uint32_t w0 = __ldg(w), w1 = __ldg(w + 1), w2 = __ldg(w + 2), w3 = __ldg(w + 3);
  const uint32_t w4 = __ldg(w + (sh ? 4 : 3));  // aligned: never touch the word past the data
  return make_uint4(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh), __funnelshift_r(w2, w3, sh),
                    __funnelshift_r(w3, w4, sh));
}
// 4 bytes at a 2-byte aligned address.
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const unsigned int* w = reinterpret_cast<const unsigned int*>(a & ~uintptr_t(3));
  const uint32_t sh = (uint32_t)(a & 2) * 8;
  return __funnelshift_r(__ldg(w), __ldg(w + (sh ? 1 : 0)), sh);
}

__device__ __forceinline__ float f16_bits(uint32_t h) {
  return __half2float(__ushort_as_half((unsigned short)h));
}
__device__ __forceinline__ float bf16_bits(uint32_t h) { return __uint_as_float(h << 16); }

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ int dp4a(uint32_t a, uint32_t b, int c) { return __dp4a((int)a, (int)b, c); }

// (float)q for |q| < 2^22 without an integer-to-float conversion, which runs at a quarter of an FMA's rate
// or less (16 a clock an SM on sm_80 / sm_90): 1.5 * 2^23 + q is a float whose unit is 1, so subtracting
// 1.5 * 2^23 leaves q exactly. The same float, so the same bits downstream. The tensor-core GEMM dequantizes
// 64 weights a thread and k step with it. H200, one call (2026-12-04 11:03), against (float) conversions:
// qwen3-30b-a3b 64 streams S_TG 2,235 / 2,222 -> 2,353 / 2,274, their 8,192-token prefill step 15.3k /
// 14.1k -> 17.1k / 17.8k t/s; qwen3.5-35b-a3b 64 streams 1,841 -> 1,946. (Predicted ~2x from the
// conversions' issue time; the step is bound by more than them.)
__device__ __forceinline__ float small_int_float(int q) {
  return __int_as_float(0x4B400000 + q) - 12582912.0f;
}

// Quants as f16 pairs for the tensor cores, two weights an instruction: byte pair `hi` (bytes 2, 3; else
// 0, 1) of u spread to the low bytes of the two 16-bit halves; the nibble at bit sh of each half, or Q6_K's
// low nibble at lsh with its top 2 bits at hsh of a second spread word, set into the mantissa of 1024.0
// (0x6400), where the f16 unit is 1: subtracting 1024 (Q6_K: 1024 + 32) leaves q exactly.
__device__ __forceinline__ uint32_t spread_pair(uint32_t u, bool hi) {
  return __byte_perm(u, 0, hi ? 0x4342 : 0x4140);
}
__device__ __forceinline__ __half2 bits_h2(uint32_t h) { return *reinterpret_cast<const __half2*>(&h); }
__device__ __forceinline__ __half2 nibbles_h2(uint32_t x, int sh) {
  return __hsub2(bits_h2(((x >> sh) & 0x000F000Fu) | 0x64006400u), __float2half2_rn(1024.0f));
}
__device__ __forceinline__ __half2 q6_h2(uint32_t xl, uint32_t xh, int lsh, int hsh) {
  const uint32_t h = ((xl >> lsh) & 0x000F000Fu) | (((xh >> hsh) & 0x00030003u) << 4) | 0x64006400u;
  return __hsub2(bits_h2(h), __float2half2_rn(1056.0f));
}
__device__ __forceinline__ uint32_t h2_bits(__half2 v) { return *reinterpret_cast<const uint32_t*>(&v); }

// Bits 0..3 of `b` to bit 0 of bytes 0..3.
__device__ __forceinline__ uint32_t spread4(uint32_t b) { return ((b & 0xF) * 0x00204081u) & 0x01010101u; }

// Byte i (0..11) of the K-quant packed scales held in three words.
__device__ __forceinline__ uint32_t scale_byte(uint32_t s0, uint32_t s1, uint32_t s2, int i) {
  const uint32_t w = i < 4 ? s0 : i < 8 ? s1 : s2;
  return (w >> (8 * (i & 3))) & 0xFF;
}
// Scale and min of sub-block j of a Q4_K / Q5_K block (quant::unpack_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(uint32_t s0, uint32_t s1, uint32_t s2, int j, float& sc,
                                             float& mn) {
  if (j < 4) {
    sc = (float)(scale_byte(s0, s1, s2, j) & 63);
    mn = (float)(scale_byte(s0, s1, s2, j + 4) & 63);
  } else {
    const uint32_t b = scale_byte(s0, s1, s2, j + 4);
    sc = (float)((b & 0xF) | ((scale_byte(s0, s1, s2, j - 4) >> 6) << 4));
    mn = (float)((b >> 4) | ((scale_byte(s0, s1, s2, j) >> 6) << 4));
  }
}

// The 6-bit scales and mins of sub-blocks 2 c4 and 2 c4 + 1 of a Q4_K / Q5_K block
// (quant::unpack_scale_min_k4) from its three scale words, with word operations and no branch (DotK45 says
// why): the four bytes of sub-blocks 4 (c4 / 2) .. + 3, then the two of c4: bytes 2 (c4 & 1) and 2 (c4 & 1)
// + 1.
struct ScaleMinPair {
  uint32_t sc[2], mn[2];
};
__device__ __forceinline__ ScaleMinPair scale_min_pair_k4(uint32_t s0, uint32_t s1, uint32_t s2, int c4) {
  const uint32_t scw = c4 < 2 ? s0 & 0x3F3F3F3F : (s2 & 0x0F0F0F0F) | ((s0 >> 2) & 0x30303030);
  const uint32_t mnw = c4 < 2 ? s1 & 0x3F3F3F3F : ((s2 >> 4) & 0x0F0F0F0F) | ((s1 >> 2) & 0x30303030);
  const int sh = 16 * (c4 & 1);
  return {{(scw >> sh) & 0xFF, (scw >> (sh + 8)) & 0xFF}, {(mnw >> sh) & 0xFF, (mnw >> (sh + 8)) & 0xFF}};
}

// ------------------------------------------------------------------------------------------- rows
// Row r of a device matrix of `rows` rows (row_bytes as the file stores them): a pointer to its blocks, or
// for Q6_K (weight_layout.h: every block's ql, then every block's qh, scales and d) its four fields.
struct Q6Row {
  const uint8_t *ql, *qh, *sc, *d;  // ql and qh 16-byte aligned (weight_layout.h makes every matrix so)
};
template <DType T>
struct RowOf {
  using type = const uint8_t*;
  __device__ static type at(const uint8_t* w, int64_t r, int64_t, size_t row_bytes) {
    return w + (size_t)r * row_bytes;
  }
};
template <>
struct RowOf<DType::Q6_K> {
  using type = Q6Row;
  __device__ static type at(const uint8_t* w, int64_t r, int64_t rows, size_t row_bytes) {
    const int64_t nb = (int64_t)(row_bytes / sizeof(quant::BlockQ6_K)), n = rows * nb, b0 = r * nb;
    return {w + b0 * 128, w + n * 128 + b0 * 64, w + n * 192 + b0 * 16, w + n * 208 + b0 * 2};
  }
};
template <DType T>
using row_t = typename RowOf<T>::type;
template <DType T>
__device__ __forceinline__ row_t<T> row_at(const void* w, int64_t r, int64_t rows, size_t row_bytes) {
  return RowOf<T>::at(static_cast<const uint8_t*>(w), r, rows, row_bytes);
}
// Rows [r, r + n_rows) of a device matrix on their way into L2 (launch.cuh's prefetch_l2; per field for
// Q6_K).
template <DType T>
__device__ __forceinline__ void prefetch_rows(const void* w, int64_t r, int64_t n_rows, int64_t rows,
                                              size_t row_bytes) {
  if constexpr (T == DType::Q6_K) {
    const Q6Row q = row_at<T>(w, r, rows, row_bytes);
    const size_t nb = row_bytes / sizeof(quant::BlockQ6_K);
    prefetch_l2(q.ql, n_rows * nb * 128);
    prefetch_l2(q.qh, n_rows * nb * 64);
    prefetch_l2(q.sc, n_rows * nb * 16);
    prefetch_l2(q.d, n_rows * nb * 2);
  } else {
    prefetch_l2(static_cast<const uint8_t*>(w) + (size_t)r * row_bytes, (size_t)n_rows * row_bytes);
  }
}

// ------------------------------------------------------------------------------------- activations
// Decode activations of `m` rows, already offset to the first row a kernel handles (global memory).
// The quantized dots take any view with these members and a static ld() for 16 activation bytes: ActView
// reads them through the read-only path (written before the kernel), SharedAct plainly (shared memory, or
// data another block of the same kernel wrote).
struct ActView {
  const void* data;  // q8_1: int8; f16 / bf16: 16-bit; f32: float. Row i starts at i * k elements.
  const float2* ds;  // q8_1: (d, d * sum) per 32-block, row i at i * (k / 32)
  int64_t k;
  __device__ static uint4 ld(const void* p) { return ld_u128(p); }
};
struct SharedAct {
  const void* data;
  const float2* ds;
  int64_t k;
  __device__ static uint4 ld(const void* p) { return *static_cast<const uint4*>(p); }
};

template <class V>
__device__ __forceinline__ const int8_t* xq_row(const V& a, int i) {
  return static_cast<const int8_t*>(a.data) + (int64_t)i * a.k;
}
template <class V>
__device__ __forceinline__ float2 xds(const V& a, int i, int b) {
  return a.ds[(int64_t)i * (a.k / kQK) + b];
}
__device__ __forceinline__ uint4 ld_act(const void* p) { return ld_u128(p); }

// ------------------------------------------------------------------------------------ decode dots
// Dot<T>::load(row, c) fetches chunk c's weight bytes; mul<M>() unpacks them and multiplies with the
// activations. The callers walk a row with dot_row (below), which sets how many chunks' loads are in flight.
template <DType T>
struct Dot;

template <>
struct Dot<DType::Q4_0> {
  static constexpr int kElems = 32;  // one block per chunk
  struct Raw {
    uint32_t d;
    uint4 q;
  };
  __device__ static Raw load(const uint8_t* row, int c) {
    const uint8_t* b = row + c * 18;
    return {ld_u16(b), ld_u128_a2(b + 2)};
  }
  template <int M, class V = ActView>
  __device__ static void mul(const Raw& r, int c, const V& a, int m, float (&acc)[M]) {
    const float d = f16_bits(r.d);
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (M == 1 || i < m) {  // callers pass m >= 1: no branch in the one-row case
        const int8_t* x = xq_row(a, i) + c * 32;
        const uint4 x0 = V::ld(x), x1 = V::ld(x + 16);
        int s = 0;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          s = dp4a(word(r.q, w) & 0x0F0F0F0F, word(x0, w), s);
          s = dp4a((word(r.q, w) >> 4) & 0x0F0F0F0F, word(x1, w), s);
        }
        const float2 ds = xds(a, i, c);
        acc[i] += d * (ds.x * (float)s - 8.0f * ds.y);
      }
    }
  }
};

template <>
struct Dot<DType::Q5_0> {
  static constexpr int kElems = 32;
  struct Raw {
    uint32_t d, qh;
    uint4 q;
  };
  __device__ static Raw load(const uint8_t* row, int c) {
    const uint8_t* b = row + c * 22;
    return {ld_u16(b), ld_u32_a2(b + 2), ld_u128_a2(b + 6)};
  }
  template <int M, class V = ActView>
  __device__ static void mul(const Raw& r, int c, const V& a, int m, float (&acc)[M]) {
    const float d = f16_bits(r.d);
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      lo[w] = (word(r.q, w) & 0x0F0F0F0F) | (spread4(r.qh >> (4 * w)) << 4);
      hi[w] = ((word(r.q, w) >> 4) & 0x0F0F0F0F) | (spread4(r.qh >> (16 + 4 * w)) << 4);
    }
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (M == 1 || i < m) {  // callers pass m >= 1: no branch in the one-row case
        const int8_t* x = xq_row(a, i) + c * 32;
        const uint4 x0 = V::ld(x), x1 = V::ld(x + 16);
        int s = 0;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          s = dp4a(lo[w], word(x0, w), s);
          s = dp4a(hi[w], word(x1, w), s);
        }
        const float2 ds = xds(a, i, c);
        acc[i] += d * (ds.x * (float)s - 16.0f * ds.y);
      }
    }
  }
};

template <>
struct Dot<DType::Q8_0> {
  static constexpr int kElems = 16;  // half a block per chunk
  struct Raw {
    uint32_t d;
    uint4 q;
  };
  __device__ static Raw load(const uint8_t* row, int c) {
    const uint8_t* b = row + (c >> 1) * 34;
    return {ld_u16(b), ld_u128_a2(b + 2 + 16 * (c & 1))};
  }
  template <int M, class V = ActView>
  __device__ static void mul(const Raw& r, int c, const V& a, int m, float (&acc)[M]) {
    const float d = f16_bits(r.d);
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (M == 1 || i < m) {  // callers pass m >= 1: no branch in the one-row case
        const uint4 x = V::ld(xq_row(a, i) + c * 16);
        int s = 0;
#pragma unroll
        for (int w = 0; w < 4; ++w) s = dp4a(word(r.q, w), word(x, w), s);
        acc[i] += d * xds(a, i, c >> 1).x * (float)s;
      }
    }
  }
};

// Q4_K / Q5_K chunk (c4, h) of a block: qs[32 c4 + 16 h ..+16] = elements 64 c4 + 16 h + i (low nibbles,
// sub-block 2 c4) and 64 c4 + 32 + 16 h + i (high nibbles, sub-block 2 c4 + 1). The h = 0 chunk applies
// both sub-blocks' mins with the activation block sums, so no chunk needs the sum of its own half.
// The scales are decoded with word operations and no branch: issue, not bandwidth, bounded these dots
// (ncu on the H200, weights in L2: about 225 instructions a chunk with a per-scale decode, 60 % of issue).
template <bool kQ5>
struct DotK45 {
  static constexpr int kElems = 32;
  static constexpr int kBytes = kQ5 ? 176 : 144;
  struct Raw {
    uint4 hdr, q, qh;
  };
  __device__ static Raw load(const uint8_t* row, int c) {
    const int c4 = (c >> 1) & 3, h = c & 1;
    const uint8_t* b = row + (c >> 3) * kBytes;
    Raw r;
    r.hdr = ld_u128(b);
    r.q = ld_u128(b + (kQ5 ? 48 : 16) + 32 * c4 + 16 * h);
    r.qh = kQ5 ? ld_u128(b + 16 + 16 * h) : make_uint4(0, 0, 0, 0);
    return r;
  }
  // The same from a row in shared memory (16-byte aligned blocks).
  __device__ static Raw load_shared(const uint8_t* row, int c) {
    const int c4 = (c >> 1) & 3, h = c & 1;
    const uint8_t* b = row + (c >> 3) * kBytes;
    Raw r;
    r.hdr = *reinterpret_cast<const uint4*>(b);
    r.q = *reinterpret_cast<const uint4*>(b + (kQ5 ? 48 : 16) + 32 * c4 + 16 * h);
    r.qh = kQ5 ? *reinterpret_cast<const uint4*>(b + 16 + 16 * h) : make_uint4(0, 0, 0, 0);
    return r;
  }
  template <int M, class V = ActView>
  __device__ static void mul(const Raw& r, int c, const V& a, int m, float (&acc)[M]) {
    const int blk = c >> 3, c4 = (c >> 1) & 3, h = c & 1;
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      lo[w] = word(r.q, w) & 0x0F0F0F0F;
      hi[w] = (word(r.q, w) >> 4) & 0x0F0F0F0F;
      if constexpr (kQ5) {
        lo[w] |= ((word(r.qh, w) >> (2 * c4)) & 0x01010101) << 4;
        hi[w] |= ((word(r.qh, w) >> (2 * c4 + 1)) & 0x01010101) << 4;
      }
    }
    const ScaleMinPair sm = scale_min_pair_k4(r.hdr.y, r.hdr.z, r.hdr.w, c4);
    const float sc0 = (float)sm.sc[0], sc1 = (float)sm.sc[1], mn0 = (float)sm.mn[0], mn1 = (float)sm.mn[1];
    const float d = f16_bits(r.hdr.x & 0xFFFF), dmin = f16_bits(r.hdr.x >> 16);
    const float min_on = h == 0 ? dmin : 0.0f;
    const int xb = blk * 8 + 2 * c4;  // activation 32-block of the low nibbles
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (M == 1 || i < m) {  // callers pass m >= 1: no branch in the one-row case
        const int8_t* x = xq_row(a, i) + xb * 32 + 16 * h;
        const uint4 x0 = V::ld(x), x1 = V::ld(x + 32);
        int s0i = 0, s1i = 0;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          s0i = dp4a(lo[w], word(x0, w), s0i);
          s1i = dp4a(hi[w], word(x1, w), s1i);
        }
        const float2 ds0 = xds(a, i, xb), ds1 = xds(a, i, xb + 1);
        acc[i] +=
            d * (sc0 * ds0.x * (float)s0i + sc1 * ds1.x * (float)s1i) - min_on * (mn0 * ds0.y + mn1 * ds1.y);
      }
    }
  }
};
template <>
struct Dot<DType::Q4_K> : DotK45<false> {};
template <>
struct Dot<DType::Q5_K> : DotK45<true> {};

// Q6_K chunk (c6, a, h): ql[64 c6 + 32 a + 16 h ..+16] holds elements 128 c6 + 32 g + 16 h + i for g = a
// (low nibbles) and g = a + 2 (high nibbles); their top 2 bits are bits 2g of qh[32 c6 + 16 h + i]. The
// fields are read from a Q6Row: each 16-byte piece one aligned load (weight_layout.h).
template <>
struct Dot<DType::Q6_K> {
  static constexpr int kElems = 32;
  struct Raw {
    uint4 ql, qh;
    int sc0, sc1;
    uint32_t d;
  };
  __device__ static Raw load(const Q6Row& row, int c) {
    const int blk = c >> 3, c6 = (c >> 2) & 1, ga = (c >> 1) & 1, h = c & 1;
    Raw r;
    r.ql = ld_u128(row.ql + blk * 128 + 64 * c6 + 32 * ga + 16 * h);
    r.qh = ld_u128(row.qh + blk * 64 + 32 * c6 + 16 * h);
    // Scales 2 ga + h and 2 ga + h + 4 of the 8 of half c6: one 8-byte load (the field is 16-byte aligned).
    const uint2 s8 = __ldg(reinterpret_cast<const uint2*>(row.sc + blk * 16 + 8 * c6));
    r.sc0 = (int8_t)(s8.x >> (16 * ga + 8 * h));
    r.sc1 = (int8_t)(s8.y >> (16 * ga + 8 * h));
    r.d = ld_u16(row.d + blk * 2);
    return r;
  }
  // The same from a row whose fields are in shared memory (matmul_stream.cu).
  __device__ static Raw load_shared(const Q6Row& row, int c) {
    const int blk = c >> 3, c6 = (c >> 2) & 1, ga = (c >> 1) & 1, h = c & 1;
    Raw r;
    r.ql = *reinterpret_cast<const uint4*>(row.ql + blk * 128 + 64 * c6 + 32 * ga + 16 * h);
    r.qh = *reinterpret_cast<const uint4*>(row.qh + blk * 64 + 32 * c6 + 16 * h);
    const uint2 s8 = *reinterpret_cast<const uint2*>(row.sc + blk * 16 + 8 * c6);
    r.sc0 = (int8_t)(s8.x >> (16 * ga + 8 * h));
    r.sc1 = (int8_t)(s8.y >> (16 * ga + 8 * h));
    r.d = *reinterpret_cast<const uint16_t*>(row.d + blk * 2);
    return r;
  }
  template <int M, class V = ActView>
  __device__ static void mul(const Raw& r, int c, const V& a, int m, float (&acc)[M]) {
    const int blk = c >> 3, c6 = (c >> 2) & 1, ga = (c >> 1) & 1, h = c & 1;
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      lo[w] = __vsub4((word(r.ql, w) & 0x0F0F0F0F) | (((word(r.qh, w) >> (2 * ga)) & 0x03030303) << 4),
                      0x20202020);
      hi[w] =
          __vsub4(((word(r.ql, w) >> 4) & 0x0F0F0F0F) | (((word(r.qh, w) >> (2 * ga + 4)) & 0x03030303) << 4),
                  0x20202020);
    }
    const float d = f16_bits(r.d), sc0 = (float)r.sc0, sc1 = (float)r.sc1;
    const int xb0 = blk * 8 + 4 * c6 + ga;  // activation 32-blocks of g = a and g = a + 2
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (M == 1 || i < m) {  // callers pass m >= 1: no branch in the one-row case
        const int8_t* x = xq_row(a, i) + xb0 * 32 + 16 * h;
        const uint4 x0 = V::ld(x), x1 = V::ld(x + 64);
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          s0 = dp4a(lo[w], word(x0, w), s0);
          s1 = dp4a(hi[w], word(x1, w), s1);
        }
        acc[i] += d * (sc0 * xds(a, i, xb0).x * (float)s0 + sc1 * xds(a, i, xb0 + 2).x * (float)s1);
      }
    }
  }
};

// Float weights: 16 bytes of W per chunk against the same elements of X in W's own precision.
template <bool kBf16>
struct Dot16 {
  static constexpr int kElems = 8;
  using Raw = uint4;
  __device__ static Raw load(const uint8_t* row, int c) { return ld_u128(row + 16 * c); }
  template <int M>
  __device__ static void mul(const Raw& wv, int c, const ActView& a, int m, float (&acc)[M]) {
    float wf[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t u = word(wv, j);
      wf[2 * j] = kBf16 ? bf16_bits(u & 0xFFFF) : f16_bits(u & 0xFFFF);
      wf[2 * j + 1] = kBf16 ? bf16_bits(u >> 16) : f16_bits(u >> 16);
    }
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (M == 1 || i < m) {  // callers pass m >= 1: no branch in the one-row case
        const uint4 xv = ld_act(static_cast<const uint16_t*>(a.data) + (int64_t)i * a.k + 8 * c);
        float s = acc[i];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t u = word(xv, j);
          s = fmaf(wf[2 * j], kBf16 ? bf16_bits(u & 0xFFFF) : f16_bits(u & 0xFFFF), s);
          s = fmaf(wf[2 * j + 1], kBf16 ? bf16_bits(u >> 16) : f16_bits(u >> 16), s);
        }
        acc[i] = s;
      }
    }
  }
};
template <>
struct Dot<DType::F16> : Dot16<false> {};
template <>
struct Dot<DType::BF16> : Dot16<true> {};

template <>
struct Dot<DType::F32> {
  static constexpr int kElems = 4;
  using Raw = float4;
  __device__ static Raw load(const uint8_t* row, int c) {
    return __ldg(reinterpret_cast<const float4*>(row) + c);
  }
  template <int M>
  __device__ static void mul(const Raw& wv, int c, const ActView& a, int m, float (&acc)[M]) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (M == 1 || i < m) {  // callers pass m >= 1: no branch in the one-row case
        const float4 xv = *(static_cast<const float4*>(a.data) + (int64_t)i * (a.k / 4) + c);
        acc[i] = fmaf(wv.w, xv.w, fmaf(wv.z, xv.z, fmaf(wv.y, xv.y, fmaf(wv.x, xv.x, acc[i]))));
      }
    }
  }
};

// This lane's part of row . x for M activation rows: chunks first, first + step, ... below nc, kBatch
// chunks' loads issued before the first of their products. A loop that loads and multiplies chunk by chunk
// leaves one load in flight a lane: the exit test between chunks keeps the compiler from hoisting the next
// load above this multiply. Each kernel picks its batch (measured on the H200: more is not better, registers
// cost warps).
template <DType T, int M, int kBatch, class V = ActView>
__device__ __forceinline__ void dot_row(const row_t<T>& row, int first, int step, int nc, const V& a, int m,
                                        float (&acc)[M]) {
  for (int c0 = first; c0 < nc; c0 += kBatch * step) {
    typename Dot<T>::Raw r[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (c0 + u * step < nc) r[u] = Dot<T>::load(row, c0 + u * step);
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (c0 + u * step < nc) Dot<T>::template mul<M>(r[u], c0 + u * step, a, m, acc);
  }
}

// A lane's first kPre chunks of a row (first, first + step, ...), loaded ahead of the rest: a decode kernel
// loads them before its PDL wait where no kernel right before writes the weights, so their round trip
// overlaps the previous kernel instead of following the wait. dot() multiplies them, then walks the rest
// of the row with dot_row: the chunks in the order dot_row alone takes them, so the same sums, the same bits.
template <DType T, int kPre>
struct RowHead {
  typename Dot<T>::Raw r[kPre];
  __device__ __forceinline__ void load(const row_t<T>& row, int first, int step, int nc) {
#pragma unroll
    for (int u = 0; u < kPre; ++u)
      if (first + u * step < nc) r[u] = Dot<T>::load(row, first + u * step);
  }
  template <int M, int kBatch, class V = ActView>
  __device__ __forceinline__ void dot(const row_t<T>& row, int first, int step, int nc, const V& a, int m,
                                      float (&acc)[M]) const {
#pragma unroll
    for (int u = 0; u < kPre; ++u)
      if (first + u * step < nc) Dot<T>::template mul<M>(r[u], first + u * step, a, m, acc);
    dot_row<T, M, kBatch, V>(row, first + kPre * step, step, nc, a, m, acc);
  }
};

// --------------------------------------------------------------------------------- dequantization
// Group g (elements 32g .. 32g + 31) of a row.
template <DType T>
struct Deq;

template <>
struct Deq<DType::Q4_0> {
  struct Raw {
    uint32_t d;
    uint4 q;
  };
  __device__ static Raw load(const uint8_t* row, int g) {
    const uint8_t* b = row + g * 18;
    return {ld_u16(b), ld_u128_a2(b + 2)};
  }
  __device__ static void dequant(const Raw& r, float (&v)[32]) {
    const float d = f16_bits(r.d);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t byte = (word(r.q, i / 4) >> (8 * (i % 4))) & 0xFF;
      v[i] = d * small_int_float((int)(byte & 0xF) - 8);
      v[i + 16] = d * small_int_float((int)(byte >> 4) - 8);
    }
  }
};

template <>
struct Deq<DType::Q5_0> {
  struct Raw {
    uint32_t d, qh;
    uint4 q;
  };
  __device__ static Raw load(const uint8_t* row, int g) {
    const uint8_t* b = row + g * 22;
    return {ld_u16(b), ld_u32_a2(b + 2), ld_u128_a2(b + 6)};
  }
  __device__ static void dequant(const Raw& r, float (&v)[32]) {
    const float d = f16_bits(r.d);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t byte = (word(r.q, i / 4) >> (8 * (i % 4))) & 0xFF;
      const int lo = (int)((byte & 0xF) | (((r.qh >> i) & 1) << 4));
      const int hi = (int)((byte >> 4) | (((r.qh >> (i + 16)) & 1) << 4));
      v[i] = d * small_int_float(lo - 16);
      v[i + 16] = d * small_int_float(hi - 16);
    }
  }
};

template <>
struct Deq<DType::Q8_0> {
  struct Raw {
    uint32_t d;
    uint4 q0, q1;
  };
  __device__ static Raw load(const uint8_t* row, int g) {
    const uint8_t* b = row + g * 34;
    return {ld_u16(b), ld_u128_a2(b + 2), ld_u128_a2(b + 18)};
  }
  __device__ static void dequant(const Raw& r, float (&v)[32]) {
    const float d = f16_bits(r.d);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      v[i] = d * small_int_float((int8_t)((word(r.q0, i / 4) >> (8 * (i % 4))) & 0xFF));
      v[i + 16] = d * small_int_float((int8_t)((word(r.q1, i / 4) >> (8 * (i % 4))) & 0xFF));
    }
  }
};

// Q4_K / Q5_K: group g = sub-block j of block g / 8: nibble (j & 1) of qs[32 (j / 2) ..+32], bit j of qh.
template <bool kQ5>
struct DeqK45 {
  struct Raw {
    uint4 hdr, q0, q1, h0, h1;
    int j;
  };
  static constexpr int kBytes = kQ5 ? 176 : 144;
  __device__ static Raw load(const uint8_t* row, int g) {
    const uint8_t* b = row + (g >> 3) * kBytes;
    const int j = g & 7;
    Raw r;
    r.j = j;
    r.hdr = ld_u128(b);
    const uint8_t* q = b + (kQ5 ? 48 : 16) + 32 * (j >> 1);
    r.q0 = ld_u128(q);
    r.q1 = ld_u128(q + 16);
    if constexpr (kQ5) {
      r.h0 = ld_u128(b + 16);
      r.h1 = ld_u128(b + 32);
    } else {
      r.h0 = r.h1 = make_uint4(0, 0, 0, 0);
    }
    return r;
  }
  __device__ static void dequant(const Raw& r, float (&v)[32]) {
    float sc, mn;
    scale_min_k4(r.hdr.y, r.hdr.z, r.hdr.w, r.j, sc, mn);
    const float a = f16_bits(r.hdr.x & 0xFFFF) * sc, b = f16_bits(r.hdr.x >> 16) * mn;
    const int shift = 4 * (r.j & 1);
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const uint4& qv = i < 16 ? r.q0 : r.q1;
      int q = (int)((word(qv, (i % 16) / 4) >> (8 * (i % 4) + shift)) & 0xF);
      if constexpr (kQ5) {
        const uint4& hv = i < 16 ? r.h0 : r.h1;
        q |= (int)((word(hv, (i % 16) / 4) >> (8 * (i % 4) + r.j)) & 1) << 4;
      }
      v[i] = a * small_int_float(q) - b;
    }
  }
  // The same 32 weights as f16 pairs (element 2 i in the low half of out[i]), in f16 arithmetic: the scale
  // and min rounded to f16, then one multiply-add a pair (Q4_K only).
  __device__ static void dequant_h2(const Raw& r, uint32_t (&out)[16]) requires(!kQ5) {
    float sc, mn;
    scale_min_k4(r.hdr.y, r.hdr.z, r.hdr.w, r.j, sc, mn);
    const __half2 a = __float2half2_rn(f16_bits(r.hdr.x & 0xFFFF) * sc),
                  nb = __float2half2_rn(-(f16_bits(r.hdr.x >> 16) * mn));
    const int shift = 4 * (r.j & 1);
#pragma unroll
    for (int i = 0; i < 16; ++i)
      out[i] = h2_bits(
          __hfma2(nibbles_h2(spread_pair(word(i < 8 ? r.q0 : r.q1, (i % 8) / 2), i & 1), shift), a, nb));
  }
};
template <>
struct Deq<DType::Q4_K> : DeqK45<false> {};
template <>
struct Deq<DType::Q5_K> : DeqK45<true> {};

// Q6_K: group g = (half c6, g6) of block g / 8: low bits in ql[64 c6 + 32 (g6 & 1) ..+32] (high nibble
// for g6 >= 2), top bits at bit 2 g6 of qh[32 c6 ..+32], scales[8 c6 + 2 g6 + (i >= 16)].
template <>
struct Deq<DType::Q6_K> {
  struct Raw {
    uint4 l0, l1, h0, h1;
    int sc0, sc1;
    uint32_t d;
    int g6;
  };
  __device__ static Raw load(const Q6Row& row, int g) {
    const int blk = g >> 3, c6 = (g >> 2) & 1, g6 = g & 3;
    Raw r;
    r.g6 = g6;
    const uint8_t* ql = row.ql + blk * 128 + 64 * c6 + 32 * (g6 & 1);
    const uint8_t* qh = row.qh + blk * 64 + 32 * c6;
    r.l0 = ld_u128(ql);
    r.l1 = ld_u128(ql + 16);
    r.h0 = ld_u128(qh);
    r.h1 = ld_u128(qh + 16);
    const uint8_t* sc = row.sc + blk * 16 + 8 * c6 + 2 * g6;
    r.sc0 = ld_s8(sc);
    r.sc1 = ld_s8(sc + 1);
    r.d = ld_u16(row.d + blk * 2);
    return r;
  }
  __device__ static void dequant(const Raw& r, float (&v)[32]) {
    const float d = f16_bits(r.d);
    const float a0 = d * (float)r.sc0, a1 = d * (float)r.sc1;
    const int lshift = r.g6 >= 2 ? 4 : 0, hshift = 2 * r.g6;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const uint4& lv = i < 16 ? r.l0 : r.l1;
      const uint4& hv = i < 16 ? r.h0 : r.h1;
      const int lo = (int)((word(lv, (i % 16) / 4) >> (8 * (i % 4) + lshift)) & 0xF);
      const int hi = (int)((word(hv, (i % 16) / 4) >> (8 * (i % 4) + hshift)) & 3);
      v[i] = (i < 16 ? a0 : a1) * small_int_float((lo | (hi << 4)) - 32);
    }
  }
  // The same as f16 pairs (DeqK45::dequant_h2): the scales rounded to f16, one multiply a pair.
  __device__ static void dequant_h2(const Raw& r, uint32_t (&out)[16]) {
    const float d = f16_bits(r.d);
    const __half2 a0 = __float2half2_rn(d * (float)r.sc0), a1 = __float2half2_rn(d * (float)r.sc1);
    const int lshift = r.g6 >= 2 ? 4 : 0, hshift = 2 * r.g6;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t xl = spread_pair(word(i < 8 ? r.l0 : r.l1, (i % 8) / 2), i & 1);
      const uint32_t xh = spread_pair(word(i < 8 ? r.h0 : r.h1, (i % 8) / 2), i & 1);
      out[i] = h2_bits(__hmul2(q6_h2(xl, xh, lshift, hshift), i < 8 ? a0 : a1));
    }
  }
};

template <bool kBf16>
struct Deq16 {
  struct Raw {
    uint4 v[4];
  };
  __device__ static Raw load(const uint8_t* row, int g) {
    const uint8_t* p = row + 64 * g;
    return {{ld_u128(p), ld_u128(p + 16), ld_u128(p + 32), ld_u128(p + 48)}};
  }
  __device__ static void dequant(const Raw& r, float (&v)[32]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t u = word(r.v[i / 4], i % 4);
      v[2 * i] = kBf16 ? bf16_bits(u & 0xFFFF) : f16_bits(u & 0xFFFF);
      v[2 * i + 1] = kBf16 ? bf16_bits(u >> 16) : f16_bits(u >> 16);
    }
  }
};
template <>
struct Deq<DType::F16> : Deq16<false> {};
template <>
struct Deq<DType::BF16> : Deq16<true> {};

template <>
struct Deq<DType::F32> {
  struct Raw {
    float4 v[8];
  };
  __device__ static Raw load(const uint8_t* row, int g) {
    const float4* p = reinterpret_cast<const float4*>(row) + 8 * g;
    Raw r;
#pragma unroll
    for (int i = 0; i < 8; ++i) r.v[i] = __ldg(p + i);
    return r;
  }
  __device__ static void dequant(const Raw& r, float (&v)[32]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[4 * i] = r.v[i].x;
      v[4 * i + 1] = r.v[i].y;
      v[4 * i + 2] = r.v[i].z;
      v[4 * i + 3] = r.v[i].w;
    }
  }
};

// Calls f.template operator()<T>() with the compile-time type of a runtime DType; false if unsupported.
template <class F>
bool dispatch_type(DType t, F&& f) {
  switch (t) {
    case DType::F32:
      f.template operator()<DType::F32>();
      return true;
    case DType::F16:
      f.template operator()<DType::F16>();
      return true;
    case DType::BF16:
      f.template operator()<DType::BF16>();
      return true;
    case DType::Q4_0:
      f.template operator()<DType::Q4_0>();
      return true;
    case DType::Q5_0:
      f.template operator()<DType::Q5_0>();
      return true;
    case DType::Q8_0:
      f.template operator()<DType::Q8_0>();
      return true;
    case DType::Q4_K:
      f.template operator()<DType::Q4_K>();
      return true;
    case DType::Q5_K:
      f.template operator()<DType::Q5_K>();
      return true;
    case DType::Q6_K:
      f.template operator()<DType::Q6_K>();
      return true;
    default:
      return false;
  }
}
// The same over the block-quantized types only (those that multiply q8_1 activations); also in device code.
template <class F>
__host__ __device__ bool dispatch_quant_type(DType t, F&& f) {
  switch (t) {
    case DType::Q4_0:
      f.template operator()<DType::Q4_0>();
      return true;
    case DType::Q5_0:
      f.template operator()<DType::Q5_0>();
      return true;
    case DType::Q8_0:
      f.template operator()<DType::Q8_0>();
      return true;
    case DType::Q4_K:
      f.template operator()<DType::Q4_K>();
      return true;
    case DType::Q5_K:
      f.template operator()<DType::Q5_K>();
      return true;
    case DType::Q6_K:
      f.template operator()<DType::Q6_K>();
      return true;
    default:
      return false;
  }
}

constexpr bool is_quant(DType t) { return t != DType::F32 && t != DType::F16 && t != DType::BF16; }

}  // namespace xpert::cuda::dev
