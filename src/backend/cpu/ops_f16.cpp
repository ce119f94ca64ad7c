#include "backend/cpu/ops_f16.h"

#include "base/cpu_features.h"
#include "base/half.h"

#include <cmath>

namespace xpert::cpu {

float dot_f16_scalar(const float* a, const uint16_t* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * f16_to_f32(b[i]);
  return s;
}

void axpy_f16_scalar(float w, const uint16_t* x, float* acc, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += w * f16_to_f32(x[i]);
}

void round_f16_scalar(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(x[i]));
}

double exp_sum_scalar(const float* x, float max, float* y, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += (y[i] = std::exp(x[i] - max));
  return sum;
}

void geglu_scalar(const float* gate, const float* up, float* y, int64_t n, const uint16_t* t) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float gl = g <= -10.0f ? 0.0f : g >= 10.0f ? g : f16_to_f32(t[f32_to_f16(g)]);
    y[i] = gl * up[i];
  }
}

const F16Kernels& f16_kernels() {
  static const F16Kernels scalar{dot_f16_scalar, axpy_f16_scalar, round_f16_scalar, exp_sum_scalar, geglu_scalar};
  static const F16Kernels avx2{dot_f16_avx2, axpy_f16_avx2, round_f16_avx2, exp_sum_avx2, geglu_avx2};
  return best_isa() >= Isa::avx2 ? avx2 : scalar;
}

}  // namespace xpert::cpu
