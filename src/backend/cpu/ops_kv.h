// Attention's reads of a quantized KV cache: one head's slice of a cache row (head_dim values, whole GGUF
// blocks of 32) dotted with q or added into an accumulator, for Q8_0 and Q4_0 (F16 is ops_f16.h). The
// values are the blocks' exact dequantization (q * d in f32), so results differ from an f32 evaluation
// over the dequantized rows only in summation order. One implementation per ISA, chosen by the caller from
// best_isa() (the AVX2 file is compiled with F16C/FMA and only called when the CPU has them).
#pragma once
#include <cstdint>

#include "quant/dtype.h"

namespace xpert::cpu {

struct KvRowKernels {
  float (*dot)(const float* q, const void* k, int64_t n);       // sum q[i] * k[i]
  void (*axpy)(float w, const void* v, float* acc, int64_t n);  // acc[i] += w * v[i]
};
// Q8_0 or Q4_0 (asserts otherwise).
const KvRowKernels& kv_row_kernels(DType t);

float dot_q8_0_scalar(const float* q, const void* k, int64_t n);
void axpy_q8_0_scalar(float w, const void* v, float* acc, int64_t n);
float dot_q4_0_scalar(const float* q, const void* k, int64_t n);
void axpy_q4_0_scalar(float w, const void* v, float* acc, int64_t n);
float dot_q8_0_avx2(const float* q, const void* k, int64_t n);
void axpy_q8_0_avx2(float w, const void* v, float* acc, int64_t n);
float dot_q4_0_avx2(const float* q, const void* k, int64_t n);
void axpy_q4_0_avx2(float w, const void* v, float* acc, int64_t n);

}  // namespace xpert::cpu
