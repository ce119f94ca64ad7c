// Portable kernels: one weight row times one packed X row, integer dot products per block as ggml's
// generic code does them. The fallback for CPUs without AVX2, and a second opinion for the SIMD paths.
#include <cstring>

#include "backend/cpu/matmul_kernels.h"
#include "base/half.h"
#include "quant/blocks.h"

namespace xpert::cpu {

namespace {

using namespace quant;

struct XRow {
  const int8_t* qs;
  const float* d;
  const uint8_t* sums;  // int32 per block (Q8_0) or int16 per 16 (Q8_K)
  const float* f;       // float planes (F32 / F16 / BF16 activations)
};

XRow x_row(const uint8_t* x, const PackedLayout& l) {
  return {reinterpret_cast<const int8_t*>(x), reinterpret_cast<const float*>(x + l.d_offset),
          x + l.sum_offset, reinterpret_cast<const float*>(x)};
}

float dot_f32(int64_t k, const uint8_t* w, const XRow& x) {
  float sum = 0;
  for (int64_t l = 0; l < k; ++l) {
    float v;
    std::memcpy(&v, w + 4 * l, 4);
    sum += v * x.f[l];
  }
  return sum;
}

float dot_f16(int64_t k, const uint8_t* w, const XRow& x) {
  float sum = 0;
  for (int64_t l = 0; l < k; ++l) {
    uint16_t h;
    std::memcpy(&h, w + 2 * l, 2);
    sum += f16_to_f32(h) * x.f[l];
  }
  return sum;
}

float dot_bf16(int64_t k, const uint8_t* w, const XRow& x) {
  float sum = 0;
  for (int64_t l = 0; l < k; ++l) {
    uint16_t h;
    std::memcpy(&h, w + 2 * l, 2);
    sum += bf16_to_f32(h) * x.f[l];
  }
  return sum;
}

float dot_q4_0(int64_t k, const uint8_t* w, const XRow& x) {
  const auto* b = reinterpret_cast<const BlockQ4_0*>(w);
  float sum = 0;
  for (int64_t i = 0; i < k / kQK; ++i) {
    const int8_t* a = x.qs + i * kQK;
    int sumi = 0;
    for (int j = 0; j < kQK / 2; ++j)
      sumi += ((b[i].qs[j] & 0xF) - 8) * a[j] + ((b[i].qs[j] >> 4) - 8) * a[j + kQK / 2];
    sum += (float)sumi * (f16_to_f32(b[i].d) * x.d[i]);
  }
  return sum;
}

float dot_q5_0(int64_t k, const uint8_t* w, const XRow& x) {
  const auto* b = reinterpret_cast<const BlockQ5_0*>(w);
  float sum = 0;
  for (int64_t i = 0; i < k / kQK; ++i) {
    const int8_t* a = x.qs + i * kQK;
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    int sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = (b[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int hi = (b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      sumi += (lo - 16) * a[j] + (hi - 16) * a[j + kQK / 2];
    }
    sum += (float)sumi * (f16_to_f32(b[i].d) * x.d[i]);
  }
  return sum;
}

float dot_q8_0(int64_t k, const uint8_t* w, const XRow& x) {
  const auto* b = reinterpret_cast<const BlockQ8_0*>(w);
  float sum = 0;
  for (int64_t i = 0; i < k / kQK; ++i) {
    const int8_t* a = x.qs + i * kQK;
    int sumi = 0;
    for (int j = 0; j < kQK; ++j) sumi += b[i].qs[j] * a[j];
    sum += (float)sumi * (f16_to_f32(b[i].d) * x.d[i]);
  }
  return sum;
}

const int16_t* bsums_of(const XRow& x, int64_t block) {
  return reinterpret_cast<const int16_t*>(x.sums) + block * (kQKK / 16);
}

// Q4_K and Q5_K: sub-block s covers elements 32s..32s+31 with 6-bit scale sc[s] and min m[s].
template <bool kFiveBit, typename Block>
float dot_q45_k(int64_t k, const uint8_t* w, const XRow& x) {
  const auto* b = reinterpret_cast<const Block*>(w);
  float sum = 0;
  for (int64_t i = 0; i < k / kQKK; ++i) {
    const int8_t* a = x.qs + i * kQKK;
    const int16_t* bsums = bsums_of(x, i);
    int sumi = 0, summ = 0;
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, m;
      unpack_scale_min_k4(s, b[i].scales, &sc, &m);
      const uint8_t* q = b[i].qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      int dot = 0;
      for (int l = 0; l < 32; ++l) {
        int v = (q[l] >> shift) & 0xF;
        if constexpr (kFiveBit) {
          const auto* b5 = reinterpret_cast<const BlockQ5_K*>(&b[i]);
          v |= ((b5->qh[l] >> s) & 1) << 4;
        }
        dot += v * a[32 * s + l];
      }
      sumi += sc * dot;
      summ += m * (bsums[2 * s] + bsums[2 * s + 1]);
    }
    const float da = x.d[i];
    sum += f16_to_f32(b[i].d) * da * (float)sumi - f16_to_f32(b[i].dmin) * da * (float)summ;
  }
  return sum;
}

float dot_q6_k(int64_t k, const uint8_t* w, const XRow& x) {
  const auto* b = reinterpret_cast<const BlockQ6_K*>(w);
  float sum = 0;
  for (int64_t i = 0; i < k / kQKK; ++i) {
    const int8_t* a = x.qs + i * kQKK;
    int sumi = 0;
    for (int c = 0; c < 2; ++c) {
      const uint8_t* ql = b[i].ql + 64 * c;
      const uint8_t* qh = b[i].qh + 32 * c;
      for (int g = 0; g < 4; ++g) {  // 32-element group c*128 + 32g, see quantize_q6_k
        const uint8_t* qlg = ql + 32 * (g & 1);
        for (int half = 0; half < 2; ++half) {
          int dot = 0;
          for (int l = 16 * half; l < 16 * half + 16; ++l) {
            const int v = ((qlg[l] >> (4 * (g >> 1))) & 0xF) | (((qh[l] >> (2 * g)) & 3) << 4);
            dot += (v - 32) * a[128 * c + 32 * g + l];
          }
          sumi += b[i].scales[8 * c + 2 * g + half] * dot;
        }
      }
    }
    sum += f16_to_f32(b[i].d) * x.d[i] * (float)sumi;
  }
  return sum;
}

template <float (*kDot)(int64_t, const uint8_t*, const XRow&)>
void tile(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
          const PackedLayout& layout, int64_t n_x, float* y, int64_t ldy) {
  for (int64_t i = 0; i < n_x; ++i) {
    const XRow xr = x_row(x + i * layout.row_bytes, layout);
    for (int64_t j = 0; j < n_w; ++j) y[i * ldy + j] = kDot(k, w + j * w_row_bytes, xr);
  }
}

}  // namespace

const MatmulKernels& matmul_kernels_scalar() {
  static const MatmulKernels kernels = {
      "scalar",
      tile<dot_f32>,
      tile<dot_f16>,
      tile<dot_bf16>,
      tile<dot_q4_0>,
      tile<dot_q5_0>,
      tile<dot_q8_0>,
      tile<dot_q45_k<false, BlockQ4_K>>,
      tile<dot_q45_k<true, BlockQ5_K>>,
      tile<dot_q6_k>,
  };
  return kernels;
}

}  // namespace xpert::cpu
