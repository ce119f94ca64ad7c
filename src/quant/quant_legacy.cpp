// Q4_0, Q5_0, Q8_0: 32-element blocks with one f16 scale. Quantizers reproduce ggml's *_ref bytes.
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/half.h"
#include "quant/blocks.h"
#include "quant/quant_impl.h"

namespace xpert::quant {

namespace {

// The element of largest magnitude, with its sign (the first one on ties), as ggml picks it.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

}  // namespace

void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, x += kQK) {
    // The largest magnitude maps to -8 exactly, so its sign decides which end of [-8, 7] is used.
    const float d = signed_absmax(x, kQK) / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min(15, (int)(int8_t)(x[j] * id + 8.5f));
      const int hi = std::min(15, (int)(int8_t)(x[j + kQK / 2] * id + 8.5f));
      y[i].qs[j] = (uint8_t)(lo | (hi << 4));
    }
  }
}

void dequantize_q4_0(const BlockQ4_0* x, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, y += kQK) {
    const float d = f16_to_f32(x[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = (float)((x[i].qs[j] & 0xF) - 8) * d;
      y[j + kQK / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void quantize_q5_0(const float* x, BlockQ5_0* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, x += kQK) {
    const float d = signed_absmax(x, kQK) / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min(31, (int)(int8_t)(x[j] * id + 16.5f));
      const int hi = std::min(31, (int)(int8_t)(x[j + kQK / 2] * id + 16.5f));
      y[i].qs[j] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
      qh |= (uint32_t)(lo >> 4) << j;
      qh |= (uint32_t)(hi >> 4) << (j + kQK / 2);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

void dequantize_q5_0(const BlockQ5_0* x, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, y += kQK) {
    const float d = f16_to_f32(x[i].d);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, 4);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = (x[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int hi = (x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[j] = (float)(lo - 16) * d;
      y[j + kQK / 2] = (float)(hi - 16) * d;
    }
  }
}

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < kQK; ++j) y[i].qs[j] = (int8_t)std::round(x[j] * id);
  }
}

void quantize_q8_0_activation(const float* x, BlockQ8_0* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    y[i].d = f32_to_f16(amax / 127.f);
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    // Ties to even, like _mm256_round_ps(_MM_ROUND_NEAREST): adding and removing 1.5 * 2^23 rounds any
    // |v| < 2^22 to an integer in the default rounding mode, and unlike nearbyint (a libm call on baseline
    // x86-64) it vectorizes; this runs on every X row of every matmul.
    constexpr float kRound = 12582912.f;
    for (int j = 0; j < kQK; ++j) y[i].qs[j] = (int8_t)(int)((x[j] * id + kRound) - kRound);
  }
}

void dequantize_q8_0(const BlockQ8_0* x, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, y += kQK) {
    const float d = f16_to_f32(x[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = (float)x[i].qs[j] * d;
  }
}

}  // namespace xpert::quant
