// f16 vector helpers for attention over the f16 KV cache, one implementation per ISA, chosen by the
// caller from best_isa() (the AVX2 file is compiled with F16C and only called when the CPU has it).
#pragma once
#include <cstdint>

namespace xpert::cpu {

struct F16Kernels {
  float (*dot)(const float* a, const uint16_t* b, int64_t n);            // sum a[i] * b[i]
  void (*axpy)(float w, const uint16_t* x, float* acc, int64_t n);       // acc[i] += w * x[i]
  void (*round_f16)(float* x, int64_t n);                                // x[i] = f16(x[i]), nearest even
  // y[i] = exp(x[i] - max), returns the sum (in double). Accurate to a few ulp.
  double (*exp_sum)(const float* x, float max, float* y, int64_t n);
  // y[i] = gelu_table[f16(gate[i])] * up[i] with llama.cpp's +-10 clamps.
  void (*geglu)(const float* gate, const float* up, float* y, int64_t n, const uint16_t* gelu_table);
};
const F16Kernels& f16_kernels();

float dot_f16_scalar(const float* a, const uint16_t* b, int64_t n);
void axpy_f16_scalar(float w, const uint16_t* x, float* acc, int64_t n);
void round_f16_scalar(float* x, int64_t n);
double exp_sum_scalar(const float* x, float max, float* y, int64_t n);
void geglu_scalar(const float* gate, const float* up, float* y, int64_t n, const uint16_t* gelu_table);
void round_f16_avx2(float* x, int64_t n);
double exp_sum_avx2(const float* x, float max, float* y, int64_t n);
void geglu_avx2(const float* gate, const float* up, float* y, int64_t n, const uint16_t* gelu_table);
float dot_f16_avx2(const float* a, const uint16_t* b, int64_t n);
void axpy_f16_avx2(float w, const uint16_t* x, float* acc, int64_t n);

}  // namespace xpert::cpu
