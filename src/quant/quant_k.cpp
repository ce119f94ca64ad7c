// K-quants: 256-element super-blocks of 16 or 32-element sub-blocks with their own small scales.
// The quantizers follow ggml's quantize_row_*_ref searches step by step, in the same float operation order
// (no FMA contraction: this file is built for baseline x86-64 in ISO C++ mode), so they give the same bytes.
#include <cmath>
#include <cstring>

#include "base/half.h"
#include "quant/blocks.h"
#include "quant/quant_impl.h"

namespace xpert::quant {

namespace {

// Round to nearest, ties to even, by the 1.5 * 2^23 trick ggml uses (valid for |f| < 2^22).
int nearest_int(float f) {
  const float biased = f + 12582912.f;
  int32_t i;
  std::memcpy(&i, &biased, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// Asymmetric fit x ~ scale * L - min_out with L in [0, nmax], minimising the weighted squared error. Starts
// from the min/max grid, then tries nstep+1 slightly different grid widths and solves the 2x2 least-squares
// system for (scale, min) on each rounding, keeping the best. Returns scale; *min_out is the positive offset.
float fit_scale_min(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* min_out,
                    uint8_t* L_try, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *min_out = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = (uint8_t)std::max(0, std::min(nmax, l));
    const float diff = scale * L[i] + min - x[i];
    best_error += weights[i] * (diff * diff);
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      L_try[i] = (uint8_t)l;
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * L_try[i] + this_min - x[i];
        error += weights[i] * (diff * diff);
      }
      if (error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = L_try[i];
        best_error = error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *min_out = -min;
  return scale;
}

// Symmetric fit x ~ scale * (L - nmax), L in [0, 2*nmax), weighted by x^2: ggml's make_qx_quants with
// rmse_type 1. Tries 19 grid widths around nmax / amax and keeps the best least-squares scale.
float fit_scale_symmetric(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < 1e-15f) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  auto clamp = [&](int l) { return std::max(-nmax, std::min(nmax - 1, l)); };
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp(nearest_int(iscale * x[i]));
    L[i] = (int8_t)(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp(nearest_int(iscale * x[i]));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = (int8_t)(nmax + clamp(nearest_int(iscale * x[i])));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q4_K and Q5_K share everything but the bit width, the search range and the packing of the quants.
// Fills scales/d/dmin of the block and L (levels 0..nmax of the 256 elements).
template <typename Block>
void quantize_scales_mins_k(const float* x, Block* y, int nmax, float rmin, float rdelta, int nstep,
                            uint8_t* L) {
  uint8_t L_try[32];
  float weights[32], mins[8], scales[8];
  float max_scale = 0, max_min = 0;  // scales are positive since the min is subtracted
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = fit_scale_min(32, nmax, xs, weights, L + 32 * j, &mins[j], L_try, rmin, rdelta, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls = std::min<uint8_t>(63, (uint8_t)nearest_int(inv_scale * scales[j]));
    const uint8_t lm = std::min<uint8_t>(63, (uint8_t)nearest_int(inv_min * mins[j]));
    if (j < 4) {
      y->scales[j] = ls;
      y->scales[j + 4] = lm;
    } else {
      y->scales[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
      y->scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
      y->scales[j] |= (uint8_t)((lm >> 4) << 6);
    }
  }
  y->d = f32_to_f16(max_scale / 63.f);
  y->dmin = f32_to_f16(max_min / 63.f);
  // Re-round every element against the scales as stored (6-bit, f16), as dequantization will see them.
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(j, y->scales, &sc, &m);
    const float d = f16_to_f32(y->d) * sc;
    if (d == 0.0f) continue;
    const float dm = f16_to_f32(y->dmin) * m;
    for (int l = 0; l < 32; ++l) {
      const int q = nearest_int((x[32 * j + l] + dm) / d);
      L[32 * j + l] = (uint8_t)std::max(0, std::min(nmax, q));
    }
  }
}

}  // namespace

void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t n_blocks) {
  uint8_t L[kQKK];
  for (int64_t i = 0; i < n_blocks; ++i, x += kQKK) {
    std::memset(y[i].scales, 0, sizeof y[i].scales);
    quantize_scales_mins_k(x, &y[i], 15, -1.f, 0.1f, 20, L);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) y[i].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
  }
}

void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t n_blocks) {
  uint8_t L[kQKK];
  for (int64_t i = 0; i < n_blocks; ++i, x += kQKK) {
    std::memset(y[i].scales, 0, sizeof y[i].scales);
    quantize_scales_mins_k(x, &y[i], 31, -0.5f, 0.1f, 15, L);
    std::memset(y[i].qh, 0, sizeof y[i].qh);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
        y[i].qh[l] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
        y[i].qs[32 * c + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
      }
    }
  }
}

void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t n_blocks) {
  int8_t L[kQKK];
  float scales[16];
  for (int64_t i = 0; i < n_blocks; ++i, x += kQKK) {
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      scales[ib] = fit_scale_symmetric(16, 32, x + 16 * ib, L + 16 * ib);
      if (std::fabs(scales[ib]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[ib]);
        max_scale = scales[ib];
      }
    }
    if (max_abs_scale < 1e-15f) {
      std::memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    // Signed scales: the largest one maps to -128, the most negative 8-bit value, for one more level.
    const float iscale = -128.f / max_scale;
    y[i].d = f32_to_f16(1 / iscale);
    for (int ib = 0; ib < 16; ++ib) y[i].scales[ib] = (int8_t)std::min(127, nearest_int(iscale * scales[ib]));
    for (int j = 0; j < 16; ++j) {
      const float d = f16_to_f32(y[i].d) * y[i].scales[j];
      if (d == 0.0f) continue;
      for (int l = 0; l < 16; ++l) {
        const int q = std::max(-32, std::min(31, nearest_int(x[16 * j + l] / d)));
        L[16 * j + l] = (int8_t)(q + 32);
      }
    }
    // Two chunks of 128: element c*128 + 32*g + l keeps its low nibble in ql[c*64 + (g&1)*32 + l]
    // (low half for g < 2, high half otherwise) and its top 2 bits in qh[c*32 + l] at bit 2g.
    for (int c = 0; c < 2; ++c) {
      uint8_t* ql = y[i].ql + 64 * c;
      uint8_t* qh = y[i].qh + 32 * c;
      const int8_t* Lc = L + 128 * c;
      for (int l = 0; l < 32; ++l) {
        ql[l] = (uint8_t)((Lc[l] & 0xF) | ((Lc[l + 64] & 0xF) << 4));
        ql[l + 32] = (uint8_t)((Lc[l + 32] & 0xF) | ((Lc[l + 96] & 0xF) << 4));
        qh[l] = (uint8_t)((Lc[l] >> 4) | ((Lc[l + 32] >> 4) << 2) | ((Lc[l + 64] >> 4) << 4) |
                          ((Lc[l + 96] >> 4) << 6));
      }
    }
  }
}

void quantize_q8_k(const float* x, BlockQ8_K* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, x += kQKK) {
    float max = 0, amax = 0;
    for (int j = 0; j < kQKK; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof y[i]);  // ggml leaves bsums unwritten here; zero is what they mean
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQKK; ++j) y[i].qs[j] = (int8_t)std::min(127, nearest_int(iscale * x[j]));
    for (int g = 0; g < kQKK / 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * g + l];
      y[i].bsums[g] = (int16_t)sum;
    }
    y[i].d = 1 / iscale;
  }
}

void dequantize_q4_k(const BlockQ4_K* x, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float d = f16_to_f32(x[i].d), dmin = f16_to_f32(x[i].dmin);
    for (int c = 0; c < 4; ++c) {
      uint8_t sc, m;
      unpack_scale_min_k4(2 * c, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      unpack_scale_min_k4(2 * c + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      const uint8_t* q = x[i].qs + 32 * c;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

void dequantize_q5_k(const BlockQ5_K* x, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float d = f16_to_f32(x[i].d), dmin = f16_to_f32(x[i].dmin);
    for (int c = 0; c < 4; ++c) {
      uint8_t sc, m;
      unpack_scale_min_k4(2 * c, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      unpack_scale_min_k4(2 * c + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      const uint8_t* q = x[i].qs + 32 * c;
      const uint8_t* qh = x[i].qh;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((q[l] & 0xF) + (((qh[l] >> (2 * c)) & 1) << 4)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((q[l] >> 4) + (((qh[l] >> (2 * c + 1)) & 1) << 4)) - m2;
    }
  }
}

void dequantize_q6_k(const BlockQ6_K* x, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float d = f16_to_f32(x[i].d);
    for (int c = 0; c < 2; ++c, y += 128) {
      const uint8_t* ql = x[i].ql + 64 * c;
      const uint8_t* qh = x[i].qh + 32 * c;
      const int8_t* sc = x[i].scales + 8 * c;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q0 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q1 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q0;
        y[l + 32] = d * sc[is + 2] * q1;
        y[l + 64] = d * sc[is + 4] * q2;
        y[l + 96] = d * sc[is + 6] * q3;
      }
    }
  }
}

void dequantize_q8_k(const BlockQ8_K* x, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, y += kQKK)
    for (int j = 0; j < kQKK; ++j) y[j] = x[i].d * x[i].qs[j];
}

}  // namespace xpert::quant
