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

}  // namespace xpert
