#include "backend/cpu/ops_f16.h"

#include "base/cpu_features.h"
#include "base/half.h"

namespace xpert::cpu {

float dot_f16_scalar(const float* a, const uint16_t* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * f16_to_f32(b[i]);
  return s;
}

void axpy_f16_scalar(float w, const uint16_t* x, float* acc, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += w * f16_to_f32(x[i]);
}

const F16Kernels& f16_kernels() {
  static const F16Kernels scalar{dot_f16_scalar, axpy_f16_scalar};
  static const F16Kernels avx2{dot_f16_avx2, axpy_f16_avx2};
  return best_isa() >= Isa::avx2 ? avx2 : scalar;
}

}  // namespace xpert::cpu
