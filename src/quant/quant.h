// Reference (scalar, obvious) conversions for every computable format, bit-compatible with ggml's
// blocks and with ggml's reference quantizers (quantize_row_*_ref). Optimized kernels are tested
// against these.
#pragma once
#include <cstdint>

#include "quant/dtype.h"

namespace xpert {

// n elements; n a multiple of the type's block size. Throws nothing; asserts preconditions.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// The activation format a weight type is multiplied with (as ggml's vec_dot_type):
// Q4_0/Q5_0/Q8_0 -> Q8_0, K-quants -> Q8_K, F16 -> F16, BF16 -> BF16, F32 -> F32.
DType activation_type(DType weight);

// The activation quantizer of cpu::matmul: the bytes llama.cpp's x86 build produces for X. Same as
// quantize_row except for Q8_0, where ggml's SIMD quantize_row_q8_0 (used on every x86 CPU with AVX) scales
// by 127/amax and rounds half to even, while quantize_row_q8_0_ref scales by 1/(amax/127) and rounds half
// away from zero; the two differ in rare last-bit cases, and we want llama.cpp's integer dot products.
void quantize_row_activation(DType t, const float* src, void* dst, int64_t n);

}  // namespace xpert
