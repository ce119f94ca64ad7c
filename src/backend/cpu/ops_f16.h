// f16 vector helpers for attention over the f16 KV cache, one implementation per ISA, chosen by the
// caller from best_isa() (the AVX2 file is compiled with F16C and only called when the CPU has it).
#pragma once
#include <cstdint>

namespace xpert::cpu {

struct F16Kernels {
  float (*dot)(const float* a, const uint16_t* b, int64_t n);            // sum a[i] * b[i]
  void (*axpy)(float w, const uint16_t* x, float* acc, int64_t n);       // acc[i] += w * x[i]
};
const F16Kernels& f16_kernels();

float dot_f16_scalar(const float* a, const uint16_t* b, int64_t n);
void axpy_f16_scalar(float w, const uint16_t* x, float* acc, int64_t n);
float dot_f16_avx2(const float* a, const uint16_t* b, int64_t n);
void axpy_f16_avx2(float w, const uint16_t* x, float* acc, int64_t n);

}  // namespace xpert::cpu
