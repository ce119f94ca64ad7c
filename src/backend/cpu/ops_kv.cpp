#include "backend/cpu/ops_kv.h"

#include "base/cpu_features.h"
#include "base/error.h"
#include "base/half.h"
#include "quant/blocks.h"

namespace xpert::cpu {

using quant::BlockQ4_0;
using quant::BlockQ8_0;
using quant::kQK;

float dot_q8_0_scalar(const float* q, const void* k, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(k);
  float s = 0.0f;
  for (int64_t j = 0; j < n / kQK; ++j, q += kQK) {
    float bs = 0.0f;
    for (int i = 0; i < kQK; ++i) bs += q[i] * (float)b[j].qs[i];
    s += bs * f16_to_f32(b[j].d);
  }
  return s;
}

void axpy_q8_0_scalar(float w, const void* v, float* acc, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(v);
  for (int64_t j = 0; j < n / kQK; ++j, acc += kQK) {
    const float wd = w * f16_to_f32(b[j].d);
    for (int i = 0; i < kQK; ++i) acc[i] += wd * (float)b[j].qs[i];
  }
}

float dot_q4_0_scalar(const float* q, const void* k, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(k);
  float s = 0.0f;
  for (int64_t j = 0; j < n / kQK; ++j, q += kQK) {
    float bs = 0.0f;
    for (int i = 0; i < kQK / 2; ++i) {
      bs += q[i] * (float)((b[j].qs[i] & 0xF) - 8);
      bs += q[i + kQK / 2] * (float)((b[j].qs[i] >> 4) - 8);
    }
    s += bs * f16_to_f32(b[j].d);
  }
  return s;
}

void axpy_q4_0_scalar(float w, const void* v, float* acc, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(v);
  for (int64_t j = 0; j < n / kQK; ++j, acc += kQK) {
    const float wd = w * f16_to_f32(b[j].d);
    for (int i = 0; i < kQK / 2; ++i) {
      acc[i] += wd * (float)((b[j].qs[i] & 0xF) - 8);
      acc[i + kQK / 2] += wd * (float)((b[j].qs[i] >> 4) - 8);
    }
  }
}

const KvRowKernels& kv_row_kernels(DType t) {
  static const KvRowKernels q8_scalar{dot_q8_0_scalar, axpy_q8_0_scalar};
  static const KvRowKernels q4_scalar{dot_q4_0_scalar, axpy_q4_0_scalar};
  static const KvRowKernels q8_avx2{dot_q8_0_avx2, axpy_q8_0_avx2};
  static const KvRowKernels q4_avx2{dot_q4_0_avx2, axpy_q4_0_avx2};
  const bool avx2 = best_isa() >= Isa::avx2;
  if (t == DType::Q8_0) return avx2 ? q8_avx2 : q8_scalar;
  XP_ASSERT(t == DType::Q4_0);
  return avx2 ? q4_avx2 : q4_scalar;
}

}  // namespace xpert::cpu
